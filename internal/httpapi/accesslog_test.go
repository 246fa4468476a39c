package httpapi_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/httpapi"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// logBuffer collects a node's log lines; the node writes from many
// goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// public returns the access-log lines written so far of public requests
// (not the internal ones the other nodes send in the background: hints,
// repairs), and forgets every line.
func (b *logBuffer) public(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range b.access(t) {
		if p, _ := l["path"].(string); !strings.HasPrefix(p, "/v0/internal/") {
			out = append(out, l)
		}
	}
	return out
}

// access returns the access-log lines written so far, decoded, and
// forgets them.
func (b *logBuffer) access(t *testing.T) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), "one JSON object per line: %q", line)
		if m["msg"] == "access" {
			out = append(out, m)
		}
	}
	b.buf.Reset()
	return out
}

// The access log with every request sampled: one JSON line per request
// with what an operator needs (method, path, op, status, latency, remote
// address, ack/from, the key when at most 64 bytes and its length always,
// the reason of a failure, the coordinator's account of a 504 included),
// never a value; nothing at a level above info, which /log-level may set
// while the node runs.
func TestAccessLog(t *testing.T) {
	var logs logBuffer
	level := new(slog.LevelVar)
	c := testcluster.Start(t, 3, func(i int, cfg *node.Config) {
		if i == 0 {
			cfg.AccessLog.Sample = 1
			cfg.LogLevel = level
			cfg.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: level}))
		}
	})
	cl := testcluster.NewClient(t)
	base := c.URL(0)
	const secret = "the value must never be logged"
	longKey := strings.Repeat("k", httpapi.AccessLogKeyMaxBytes+1)
	_ = logs.public(t) // start-up

	require.Equal(t, 201, send(t, cl, "PUT", base+"/v0/entity?id=k1&ack=2", secret).code)
	require.Equal(t, 200, send(t, cl, "GET", base+"/v0/entity?id=k1", "").code)
	require.Equal(t, 200, send(t, cl, "HEAD", base+"/v0/entity?id=k1&ack=3&from=3", "").code)
	require.Equal(t, 404, send(t, cl, "GET", base+"/v0/entity?id="+longKey, "").code)
	require.Equal(t, 400, send(t, cl, "GET", base+"/v0/entity?id=k1&ack=4", "").code)
	require.Equal(t, 200, send(t, cl, "GET", base+"/v0/status", "").code)
	lines := logs.public(t)
	require.Len(t, lines, 6, "one line per request")
	for i, want := range []map[string]any{
		{"method": "PUT", "path": "/v0/entity", "op": "put", "status": 201.0, "key": "k1", "key_len": 2.0, "ack": 2.0, "from": 3.0, "bytes_in": float64(len(secret))},
		{"method": "GET", "path": "/v0/entity", "op": "get", "status": 200.0, "key": "k1", "key_len": 2.0, "ack": 2.0, "from": 3.0},
		{"method": "HEAD", "path": "/v0/entity", "op": "head", "status": 200.0, "key": "k1", "ack": 3.0, "from": 3.0},
		{"method": "GET", "op": "get", "status": 404.0, "key_len": float64(len(longKey)), "err": "not found"},
		{"method": "GET", "op": "get", "status": 400.0, "err": "ack=4 exceeds from=3"},
		{"method": "GET", "path": "/v0/status", "op": "status", "status": 200.0},
	} {
		l := lines[i]
		for k, v := range want {
			assert.Equal(t, v, l[k], "line %d: %s in %v", i, k, l)
		}
		assert.Equal(t, "INFO", l["level"])
		assert.Contains(t, l["remote"], "127.0.0.1:", "line %d", i)
		lat, ok := l["latency"].(float64)
		assert.True(t, ok && lat > 0 && lat < float64(10*time.Second), "line %d: latency in nanoseconds: %v", i, l["latency"])
	}
	assert.NotContains(t, lines[3], "key", "a key over 64 bytes is not logged")
	for _, k := range []string{"key", "ack", "key_len"} {
		assert.NotContains(t, lines[5], k, "status has no key")
	}

	// A 504: the coordinator's account of the replicas.
	c.StopNode(2)
	require.Equal(t, 504, send(t, cl, "GET", base+"/v0/entity?id=k1&ack=3", "").code)
	lines = logs.public(t)
	require.Len(t, lines, 1)
	assert.Equal(t, 504.0, lines[0]["status"])
	assert.Regexp(t, `^not enough replicas: [12] of 3 answered, 3 needed; failed: .*`+c.URL(2), lines[0]["err"])

	// Above info, the access log is silent: the level is the logger's.
	level.Set(slog.LevelWarn)
	require.Equal(t, 200, send(t, cl, "GET", base+"/v0/entity?id=k1", "").code)
	assert.Empty(t, logs.public(t))
	level.Set(slog.LevelInfo)
	require.Equal(t, 200, send(t, cl, "GET", base+"/v0/entity?id=k1", "").code)
	assert.Len(t, logs.public(t), 1)

	logs.mu.Lock()
	defer logs.mu.Unlock()
	assert.NotContains(t, logs.buf.String(), secret)
}

// Sampling: 0 logs nothing, 0.5 about half (400 requests: outside 120 to
// 280 has a probability below 1e-18), 1 everything.
func TestAccessLogSampling(t *testing.T) {
	for _, tc := range []struct {
		sample   float64
		min, max int
	}{{0, 0, 0}, {0.5, 120, 280}, {1, 400, 400}} {
		var logs logBuffer
		_, base := testcluster.Single(t, func(_ int, cfg *node.Config) {
			cfg.AccessLog.Sample = tc.sample
			cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
		})
		cl := testcluster.NewClient(t)
		_ = logs.access(t)
		for range 400 {
			require.Equal(t, http.StatusNotFound, send(t, cl, "GET", base+"/v0/entity?id=absent", "").code)
		}
		n := len(logs.access(t))
		assert.True(t, tc.min <= n && n <= tc.max, "sample %v: %d of 400 logged", tc.sample, n)
	}
}

// --access-log-sample takes a fraction from 0 to 1; anything else is
// refused with the flag's name.
func TestAccessLogFlag(t *testing.T) {
	for _, tc := range []struct {
		arg  string
		want float64
		err  string
	}{
		{"0", 0, ""}, {"0.001", 0.001, ""}, {"1", 1, ""},
		{"-0.1", 0, "--access-log-sample must be from 0 to 1"},
		{"1.5", 0, "--access-log-sample must be from 0 to 1"},
		{"NaN", 0, "--access-log-sample must be from 0 to 1"},
		{"half", 0, "invalid value"},
	} {
		o := httpapi.DefaultAccessLogOptions()
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(&bytes.Buffer{})
		o.RegisterFlags(fs)
		err := fs.Parse([]string{"--access-log-sample", tc.arg})
		if err == nil {
			err = o.Validate()
		}
		if tc.err != "" {
			assert.ErrorContains(t, err, tc.err, tc.arg)
			continue
		}
		require.NoError(t, err, tc.arg)
		assert.Equal(t, tc.want, o.Sample, tc.arg)
		assert.False(t, math.IsNaN(o.Sample))
	}
}

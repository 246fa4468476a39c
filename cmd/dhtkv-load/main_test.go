package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/loadgen"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// TestFillOnly checks that --fill N --fill-only writes exactly the keys
// k0..k<N-1> that the wrk scripts read, each once with --value-size bytes,
// and sends nothing else.
func TestFillOnly(t *testing.T) {
	var mu sync.Mutex
	puts := make(map[string]int)
	var others int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if r.Method != http.MethodPut || r.URL.Path != "/v0/entity" || len(body) != 100 {
			others++
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		puts[r.URL.Query().Get("id")]++
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	var stdout, stderr bytes.Buffer
	code := run([]string{"--targets", srv.URL, "--fill", "50", "--fill-only", "--value-size", "100", "--connections", "4"}, &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	assert.Empty(t, stdout.String(), "no run, so no report")

	mu.Lock()
	defer mu.Unlock()
	assert.Zero(t, others, "requests other than the fill's PUTs")
	require.Len(t, puts, 50)
	for i := range 50 {
		assert.Equal(t, 1, puts["k"+strconv.Itoa(i)], "PUTs of k%d", i)
	}
}

func TestFillOnlyNeedsFill(t *testing.T) {
	var stderr bytes.Buffer
	assert.Equal(t, 2, run([]string{"--fill-only"}, io.Discard, &stderr))
	assert.Contains(t, stderr.String(), "--fill-only needs --fill")
}

// TestTargets: --targets takes base URLs and host:port, and still only
// loopback addresses.
func TestTargets(t *testing.T) {
	for _, tc := range []struct {
		targets string
		want    []string
		err     string
	}{
		{"127.0.0.1:8080", []string{"http://127.0.0.1:8080"}, ""},
		{"localhost:9000", []string{"http://localhost:9000"}, ""},
		{"[::1]:8080", []string{"http://[::1]:8080"}, ""},
		{"http://127.0.0.1:8080/", []string{"http://127.0.0.1:8080"}, ""},
		{" 127.0.0.1:8080, http://127.0.0.1:8081 ,127.0.0.2:8082", []string{"http://127.0.0.1:8080", "http://127.0.0.1:8081", "http://127.0.0.2:8082"}, ""},
		{"10.0.0.1:8080", nil, "not a loopback address"},
		{"example.com:80", nil, "not a loopback address"},
		{"https://127.0.0.1:8443", []string{"https://127.0.0.1:8443"}, ""},
		{"ftp://127.0.0.1:21", nil, "scheme must be http"},
		{"127.0.0.1:8080/v0", nil, "must be a base URL"},
		{",", nil, "no targets given"},
	} {
		cfg, _, err := parseFlags([]string{"--targets", tc.targets, "--connections", "3"}, io.Discard)
		if tc.err != "" {
			assert.ErrorContains(t, err, tc.err, tc.targets)
			continue
		}
		require.NoError(t, err, tc.targets)
		assert.Equal(t, tc.want, cfg.Targets, tc.targets)
	}
}

// TestExitCode: a run against a real node through a host:port target
// exits 0; one in which every request failed exits 1 after printing its
// report: every connection refused, or every request refused (400).
func TestExitCode(t *testing.T) {
	c := testcluster.Start(t, 1)
	addr := c.Config(0).Listen
	dead := fmt.Sprintf("127.0.0.1:%d", testcluster.FreePorts(t, 1)[0])
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"served", []string{"--targets", addr}, 0, ""},
		{"connection refused", []string{"--targets", dead}, 1, "every request failed"},
		{"every request refused", []string{"--targets", addr, "--ack", "2"}, 1, "every request failed"},
	} {
		var stdout, stderr bytes.Buffer
		args := append([]string{"--workload", "put", "--connections", "2", "--duration", "200ms", "--json"}, tc.args...)
		code := run(args, &stdout, &stderr)
		assert.Equal(t, tc.code, code, "%s: %s", tc.name, stderr.String())
		assert.Contains(t, stderr.String(), tc.stderr, tc.name)
		var res loadgen.Result
		require.NoError(t, json.Unmarshal(stdout.Bytes(), &res), "%s: the report is printed: %s", tc.name, stdout.String())
		assert.Positive(t, res.Requests, tc.name)
	}
}

// TestOutputs: each --output against a real node prints its format: the
// text report, the same with wrk2's spectrum, dhtkv-load's JSON with the
// spectrum, vegeta's JSON report; --json is --output json.
func TestOutputs(t *testing.T) {
	c := testcluster.Start(t, 1)
	addr := c.Config(0).Listen
	for _, tc := range []struct {
		args  []string
		check func(t *testing.T, out string)
	}{
		{nil, func(t *testing.T, out string) {
			assert.Contains(t, out, "  Latency Distribution (HdrHistogram - Recorded Latency)\n")
			assert.Contains(t, out, "Requests/sec:")
			assert.NotContains(t, out, "Detailed Percentile spectrum")
		}},
		{[]string{"--output", "wrk2"}, func(t *testing.T, out string) {
			assert.Contains(t, out, "  Detailed Percentile spectrum:\n       Value   Percentile   TotalCount 1/(1-Percentile)\n\n")
			assert.Regexp(t, `(?m)^ +[0-9.]+ +1\.000000 +[0-9]+ +inf\n#\[Mean +=`, out)
			assert.Contains(t, out, "Requests/sec:")
		}},
		{[]string{"--output", "json"}, func(t *testing.T, out string) {
			var res loadgen.Result
			require.NoError(t, json.Unmarshal([]byte(out), &res), out)
			assert.Positive(t, res.Requests)
			require.NotEmpty(t, res.Spectrum)
			last := res.Spectrum[len(res.Spectrum)-1]
			assert.Equal(t, 100.0, last.Percentile)
			assert.Equal(t, res.Requests, last.TotalCount, "every request answered and recorded")
		}},
		{[]string{"--json", "--output", "json"}, func(t *testing.T, out string) {
			var res loadgen.Result
			require.NoError(t, json.Unmarshal([]byte(out), &res), out)
		}},
		{[]string{"--output", "vegeta"}, func(t *testing.T, out string) {
			var m map[string]any
			require.NoError(t, json.Unmarshal([]byte(out), &m), out)
			for _, k := range []string{"latencies", "bytes_in", "bytes_out", "earliest", "latest", "end", "duration", "wait", "requests", "rate", "throughput", "success", "status_codes", "errors"} {
				assert.Contains(t, m, k)
			}
			var v loadgen.VegetaMetrics
			require.NoError(t, json.Unmarshal([]byte(out), &v))
			assert.Positive(t, v.Requests)
			assert.Equal(t, map[string]int{"201": int(v.Requests)}, v.StatusCodes)
			assert.Equal(t, 1.0, v.Success)
			assert.Equal(t, v.Requests*100, v.BytesOut.Total, "100-byte values")
			assert.Positive(t, v.Latencies.P99)
		}},
	} {
		var stdout, stderr bytes.Buffer
		args := append([]string{"--targets", addr, "--workload", "put", "--value-size", "100", "--connections", "2", "--duration", "200ms"}, tc.args...)
		require.Equal(t, 0, run(args, &stdout, &stderr), "%v: %s", tc.args, stderr.String())
		tc.check(t, stdout.String())
	}

	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"--output", "csv"}, "must be text, wrk2, json or vegeta"},
		{[]string{"--json", "--output", "vegeta"}, "--json and --output vegeta: choose one"},
		{[]string{"--output", "text", "--json"}, "--json and --output text: choose one"},
	} {
		var stderr bytes.Buffer
		assert.Equal(t, 2, run(append([]string{"--targets", addr}, tc.args...), io.Discard, &stderr), tc.args)
		assert.Contains(t, stderr.String(), tc.err, tc.args)
	}
}

// SIGUSR1 opens the run's marked window and SIGUSR2 closes it, while the
// signals are listened to; the listener stops with its function.
func TestMarkOnSignals(t *testing.T) {
	m := new(loadgen.Mark)
	stop := markOnSignals(m)
	defer stop()
	in := func() bool { return m.Holds(time.Now()) }
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGUSR1))
	require.Eventually(t, in, 5*time.Second, time.Millisecond, "SIGUSR1 opens the window")
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGUSR2))
	require.Eventually(t, func() bool { return !in() }, 5*time.Second, time.Millisecond, "SIGUSR2 closes it")
}

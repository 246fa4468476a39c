package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/node"
)

// startBaseline serves a baseline on a free loopback port and returns its
// base URL; the server is stopped, and must stop cleanly, when the test ends.
func startBaseline(t *testing.T, cfg config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- serve(ctx, ln, cfg, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-stopped:
			assert.NoError(t, err, "serve after shutdown")
		case <-time.After(15 * time.Second):
			t.Error("baseline did not stop")
		}
	})
	return "http://" + ln.Addr().String()
}

// call sends one request and returns the status and body.
func call(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func TestEntityAPIOnRealPort(t *testing.T) {
	cfg := defaultConfig()
	cfg.maxValueBytes = 100
	base := startBaseline(t, cfg)
	entity := base + "/v0/entity?id="

	steps := []struct {
		method, url, body string
		status            int
		want              string // expected body, checked when not empty
	}{
		{"GET", base + "/v0/status", "", 200, "OK\n"},
		{"GET", entity + "k1", "", 404, ""},
		{"PUT", entity + "k1", "hello", 201, ""},
		{"GET", entity + "k1", "", 200, "hello"},
		{"PUT", entity + "k1", "again", 201, ""},
		{"GET", entity + "k1&ack=1&from=1", "", 200, "again"},
		{"PUT", entity + "empty", "", 201, ""},
		{"GET", entity + "empty", "", 200, ""},
		{"DELETE", entity + "k1", "", 202, ""},
		{"GET", entity + "k1", "", 404, ""},
		{"DELETE", entity + "never-written", "", 202, ""},
		{"GET", base + "/v0/entity", "", 400, ""},
		{"GET", entity, "", 400, ""},
		{"GET", entity + strings.Repeat("x", maxKeyBytes+1), "", 400, ""},
		{"POST", entity + "k1", "x", 405, ""},
		{"PUT", base + "/v0/status", "", 405, ""},
		{"GET", base + "/v0/other", "", 400, ""},
		{"PUT", entity + "big", strings.Repeat("v", 101), 413, ""},
		{"PUT", entity + "fits", strings.Repeat("v", 100), 201, ""},
	}
	for _, s := range steps {
		status, body := call(t, s.method, s.url, s.body)
		label := s.method + " " + strings.TrimPrefix(s.url, base)
		if len(label) > 80 {
			label = label[:80] + "..."
		}
		assert.Equal(t, s.status, status, label)
		if s.want != "" || s.status == 200 {
			assert.Equal(t, s.want, body, label)
		}
	}
}

func TestParseFlags(t *testing.T) {
	cfg, err := parseFlags(nil, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, defaultConfig(), cfg)

	cfg, err = parseFlags([]string{"--listen", "127.0.0.1:0", "--max-value-bytes", "10"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, config{listen: "127.0.0.1:0", maxValueBytes: 10}, cfg)

	for _, bad := range [][]string{{"--max-value-bytes", "-1"}, {"extra"}, {"--addr", "x"}} {
		_, err := parseFlags(bad, io.Discard)
		assert.Error(t, err, bad)
	}
}

// TestSettingsMatchDhtkv fails when dhtkv's defaults move away from the
// baseline's, which would make the ratio compare unlike servers.
func TestSettingsMatchDhtkv(t *testing.T) {
	d := node.DefaultConfig()
	assert.Equal(t, d.ReadTimeout, readTimeout, "read timeout")
	assert.Equal(t, d.WriteTimeout, writeTimeout, "write timeout")
	assert.Equal(t, d.IdleTimeout, idleTimeout, "idle timeout")
	assert.Equal(t, d.MaxHeaderBytes, maxHeaderBytes, "read buffer")
	assert.Equal(t, d.MaxKeyBytes, maxKeyBytes, "key limit")
	assert.Equal(t, d.MaxValueBytes, defaultConfig().maxValueBytes, "value limit")
}

func TestShardFillsCacheLine(t *testing.T) {
	assert.Equal(t, uintptr(64), unsafe.Sizeof(shard{}))
}

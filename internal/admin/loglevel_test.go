package admin_test

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/dhtkv/dhtkv/internal/logbuf"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/leakcheck"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

func call(t *testing.T, method, u string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, u, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, string(b)
}

// /log-level on a node's admin listener reads and changes the level of
// the node's logger while it runs: lines below it vanish and appear; the
// change is logged where both levels show it; bad input is a 400 with a
// one-line reason that leaves the level as it was.
func TestLogLevel(t *testing.T) {
	leakcheck.Register(t)
	var logs logbuf.Buffer
	level := new(slog.LevelVar)
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: level}))
	c := testcluster.Start(t, 1, func(_ int, cfg *node.Config) { cfg.Logger, cfg.LogLevel = log, level })
	u := "http://" + c.Node(0).AdminAddr() + "/log-level"

	code, _, body := call(t, http.MethodGet, u)
	require.Equal(t, http.StatusOK, code)
	assert.JSONEq(t, `{"level":"info"}`, body)
	log.Debug("before: hidden")

	code, _, body = call(t, http.MethodPut, u+"?level=DEBUG")
	require.Equal(t, http.StatusOK, code, body)
	assert.JSONEq(t, `{"level":"debug"}`, body)
	assert.Equal(t, slog.LevelDebug, level.Level())
	log.Debug("after: shown")
	code, _, body = call(t, http.MethodGet, u)
	require.Equal(t, http.StatusOK, code)
	assert.JSONEq(t, `{"level":"debug"}`, body)

	code, _, body = call(t, http.MethodPut, u+"?level=error")
	require.Equal(t, http.StatusOK, code, body)
	log.Warn("at error: hidden")

	for _, tc := range []struct {
		method, query string
		code          int
		reason        string
	}{
		{http.MethodPut, "?level=verbose", 400, `level "verbose": want debug, info, warn or error`},
		{http.MethodPut, "", 400, "missing level parameter: level=debug|info|warn|error"},
		{http.MethodPut, "?level=info&lvl=2", 400, `unknown parameter "lvl": level=debug|info|warn|error`},
		{http.MethodPut, "?level=info&level=debug", 400, "level given 2 times with different values: give it once"},
		{http.MethodPut, "?level=%zz", 400, `malformed query: invalid URL escape "%zz"`},
		{http.MethodPost, "?level=info", 405, "method not allowed: GET, PUT"},
		{http.MethodDelete, "", 405, "method not allowed: GET, PUT"},
	} {
		code, h, body := call(t, tc.method, u+tc.query)
		assert.Equal(t, tc.code, code, "%s %s", tc.method, tc.query)
		assert.Equal(t, tc.reason, strings.TrimSuffix(body, "\n"), "%s %s: a one-line reason", tc.method, tc.query)
		if code == 405 {
			assert.Equal(t, "GET, PUT", h.Get("Allow"))
		}
	}
	assert.Equal(t, slog.LevelError, level.Level(), "refused changes leave the level")

	out := logs.String()
	assert.NotContains(t, out, "before: hidden")
	assert.Contains(t, out, "after: shown")
	assert.NotContains(t, out, "at error: hidden")
	assert.Contains(t, out, `level=INFO msg="log level changed" from=info to=debug`)
	assert.Contains(t, out, `level=ERROR msg="log level changed" from=debug to=error`, "shown at the new level")
}

// A node whose level is fixed (no LevelVar) says so: 501.
func TestLogLevelFixed(t *testing.T) {
	leakcheck.Register(t)
	c := testcluster.Start(t, 1)
	code, _, body := call(t, http.MethodGet, "http://"+c.Node(0).AdminAddr()+"/log-level")
	assert.Equal(t, http.StatusNotImplemented, code)
	assert.Contains(t, body, "the log level is fixed")
}

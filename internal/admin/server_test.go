package admin

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// serveAdmin serves h with NewServer(h, o) on a real loopback listener
// until the test ends, and returns its address.
func serveAdmin(t *testing.T, h http.Handler, o Options) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := NewServer(h, o)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		require.NoError(t, srv.Close())
		require.ErrorIs(t, <-done, http.ErrServerClosed)
	})
	return ln.Addr().String()
}

// awaitClosed reads c until the server closes it, and returns how long
// that took; it fails the test if c is still open after limit.
func awaitClosed(t *testing.T, c net.Conn, r io.Reader, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	require.NoError(t, c.SetReadDeadline(start.Add(limit)))
	n, err := io.Copy(io.Discard, r)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "connection still open after %v", limit)
	require.Zero(t, n, "nothing more is sent before the close")
	return time.Since(start)
}

// A connection that made a request and then idles, or that never finishes
// its request, is closed by the server after its timeout: the probes and
// /metrics need no token, so whoever reaches the port could otherwise
// hold connections open for good.
func TestAdminServerClosesIdleConnections(t *testing.T) {
	const idle, read = 300 * time.Millisecond, 200 * time.Millisecond
	addr := serveAdmin(t, Handler(prometheus.NewRegistry(), func() error { return nil }, 0), Options{IdleTimeout: idle, ReadTimeout: read})
	for _, tc := range []struct {
		name    string
		send    string
		answer  bool          // a whole request: read its answer first
		atLeast time.Duration // the close comes no sooner
	}{
		{"idle after /livez", "GET /livez HTTP/1.1\r\nHost: admin\r\n\r\n", true, idle},
		{"headers never finished", "GET /livez HTTP/1.1\r\nHost: adm", false, read},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			defer c.Close()
			_, err = io.WriteString(c, tc.send)
			require.NoError(t, err)
			r := bufio.NewReader(c)
			if tc.answer {
				resp, err := http.ReadResponse(r, nil)
				require.NoError(t, err)
				body, err := io.ReadAll(resp.Body)
				require.NoError(t, err)
				require.Equal(t, http.StatusOK, resp.StatusCode)
				require.Equal(t, "ok\n", string(body))
				require.False(t, resp.Close, "kept alive")
			}
			took := awaitClosed(t, c, r, 5*time.Second)
			// The server's clock starts when it wrote the answer, before
			// this read it: a loose lower bound, that still tells a close
			// by the timeout from one at once.
			require.GreaterOrEqual(t, took, tc.atLeast/3, "closed by the timeout, not at once")
		})
	}
}

// A profile, a trace or a delta profile longer than MaxProfile, or whose
// seconds is not a positive number, is refused with 400 and a one-line
// reason (net/http/pprof would run it as long as its client waits, and
// take a malformed one as 30 s); one within it runs in full, even past
// ReadTimeout and WriteTimeout (pprof adds its seconds to the latter).
func TestAdminServerBoundsProfiles(t *testing.T) {
	addr := serveAdmin(t, Handler(prometheus.NewRegistry(), func() error { return nil }, 2*time.Second),
		Options{ReadTimeout: 100 * time.Millisecond, WriteTimeout: 500 * time.Millisecond})
	get := func(path string) (int, string, time.Duration) {
		start := time.Now()
		resp, err := http.Get("http://" + addr + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body), time.Since(start)
	}
	for _, tc := range []struct{ path, reason string }{
		{"/debug/pprof/profile?seconds=1000000", `seconds=1000000: longer than --admin-max-profile 2s; ask for at most 2 seconds`},
		{"/debug/pprof/profile?seconds=3", `seconds=3: longer than --admin-max-profile 2s`},
		{"/debug/pprof/profile", `the default 30 s: longer than --admin-max-profile 2s`},
		{"/debug/pprof/profile?seconds=1.5", `seconds="1.5": want a positive number of seconds, at most 2`},
		{"/debug/pprof/profile?seconds=x", `seconds="x": want a positive number of seconds`},
		{"/debug/pprof/profile?seconds=0", `seconds="0": want a positive number of seconds`},
		{"/debug/pprof/trace?seconds=2.5", `seconds=2.5: longer than --admin-max-profile 2s`},
		{"/debug/pprof/trace?seconds=NaN", `seconds="NaN": want a positive number of seconds`},
		{"/debug/pprof/trace?seconds=%2BInf", `seconds=+Inf: longer than --admin-max-profile 2s`},
		{"/debug/pprof/allocs?seconds=3", `seconds=3: longer than --admin-max-profile 2s`},
		{"/debug/pprof/mutex?seconds=-1", `seconds="-1": want a positive number of seconds`},
		{"/debug/pprof/heap?seconds=%00", `seconds="\x00": want a positive number of seconds`},
	} {
		code, body, _ := get(tc.path)
		require.Equal(t, http.StatusBadRequest, code, tc.path)
		require.Contains(t, body, tc.reason, tc.path)
		require.Equal(t, 1, strings.Count(body, "\n"), "one line: %q", body)
	}
	code, body, _ := get("/debug/pprof/heap")
	require.Equal(t, http.StatusOK, code, "a snapshot has no window: %s", body)
	code, body, took := get("/debug/pprof/profile?seconds=1")
	require.Equal(t, http.StatusOK, code, body)
	require.NotEmpty(t, body)
	require.GreaterOrEqual(t, took, time.Second, "the profile ran its whole second")
}

// POST /repair, POST /snapshot and a membership change answer when their
// work ends, however long it takes: the server's WriteTimeout does not
// cut their answers.
func TestLongAdminWorkOutlastsWriteTimeout(t *testing.T) {
	const write = 200 * time.Millisecond
	slow := func(ctx context.Context) bool { // work longer than the write timeout
		select {
		case <-time.After(3 * write):
			return true
		case <-ctx.Done():
			return false
		}
	}
	repair := RepairHandler(func(ctx context.Context) any {
		if !slow(ctx) {
			return nil
		}
		return []string{"done"}
	}, func() any { return nil })
	snapshot := SnapshotHandler(checkpointerFunc(func(dir string) error {
		slow(context.Background())
		return os.MkdirAll(dir, 0o700)
	}), t.TempDir(), slog.New(slog.DiscardHandler))
	change := mux(Parts{Registry: prometheus.NewRegistry(), Cluster: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		slow(r.Context())
		plain(w, http.StatusOK, "changed")
	})})
	for _, tc := range []struct {
		name, path string
		h          http.Handler
		want       string
	}{
		{"repair", "/repair", repair, `["done"]`},
		{"snapshot", "/snapshot?dir=s", snapshot, `"files": 0`},
		{"membership change", "/cluster/join?node=http://n9:1", change, "changed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := serveAdmin(t, tc.h, Options{WriteTimeout: write})
			resp, err := http.Post("http://"+addr+tc.path, "", nil)
			require.NoError(t, err)
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
			require.Contains(t, strings.Join(strings.Fields(string(body)), ""), strings.Join(strings.Fields(tc.want), ""))
		})
	}
}

package node_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/dhtkv/dhtkv/internal/node"
)

// A node given listeners and a file system opens no socket and touches
// no disk: it serves what it is given, its store lives in the MemFS
// (which keeps it across a restart), and /snapshot, which would write to
// the disk, answers 501.
func TestServesGivenListenersAndFS(t *testing.T) {
	fs := vfs.NewMem()
	dir := "/no/such/dir/node1"
	start := func() (*node.Node, *http.Client) {
		ln, adminLn := fasthttputil.NewInmemoryListener(), fasthttputil.NewInmemoryListener()
		cfg := node.DefaultConfig()
		cfg.Listen = "127.0.0.1:1" // its name only: nothing listens there
		cfg.DataDir = dir
		cfg.Store.Sync = false
		cfg.Listener, cfg.AdminListener, cfg.FS = ln, adminLn, fs
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		n, err := node.Start(cfg)
		require.NoError(t, err)
		cl := &http.Client{Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext: func(_ context.Context, _, addr string) (net.Conn, error) {
				if addr == "admin:80" {
					return adminLn.Dial()
				}
				return ln.Dial()
			},
		}}
		return n, cl
	}
	stop := func(n *node.Node) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, n.Shutdown(ctx))
	}
	do := func(cl *http.Client, method, url, body string) (int, string) {
		req, err := http.NewRequest(method, url, strings.NewReader(body))
		require.NoError(t, err)
		resp, err := cl.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}

	n, cl := start()
	code, _ := do(cl, http.MethodPut, "http://node/v0/entity?id=k", "v")
	require.Equal(t, http.StatusCreated, code)
	code, _ = do(cl, http.MethodPost, "http://admin/snapshot?dir=x", "")
	require.Equal(t, http.StatusNotImplemented, code)
	stop(n)

	n, cl = start()
	defer stop(n)
	code, body := do(cl, http.MethodGet, "http://node/v0/entity?id=k", "")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "v", body)
	_, err := os.Stat("/no/such/dir")
	require.True(t, os.IsNotExist(err), "nothing reached the disk")
}

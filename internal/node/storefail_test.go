package node_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/leakcheck"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// A write error on the WAL (EIO) used to be Pebble's fatal commit error
// and the end of the process. Now the node stays up: that write and every
// later one answer 507 with the reason, reads go on, /readyz answers 503,
// /v0/status warns and dhtkv_store_failed is 1; the node shuts down when
// asked, without hanging.
func TestStoreFailureMakesTheNodeUnready(t *testing.T) {
	leakcheck.Register(t)
	var failing atomic.Bool
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if failing.Load() && strings.HasSuffix(op.Path, ".log") && op.Kind.ReadOrWrite() == errorfs.OpIsWrite {
			return &os.PathError{Op: "write", Path: op.Path, Err: syscall.EIO}
		}
		return nil
	})
	ports := testcluster.FreePorts(t, 2)
	cfg := node.DefaultConfig()
	cfg.Listen, cfg.AdminListen = fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])
	cfg.DataDir, cfg.FS = "/node", errorfs.Wrap(vfs.NewMem(), inj)
	cfg.Store.MemTableBytes, cfg.Store.BlockCacheBytes, cfg.CacheBytes = 1<<20, 1<<20, 1<<20
	cfg.MaxConnections = 64
	cfg.Logger = slog.New(slog.DiscardHandler)
	n, err := node.Start(cfg)
	require.NoError(t, err)
	base := "http://" + n.Addr()
	cl := testcluster.NewClient(t)
	require.Equal(t, http.StatusCreated, cl.Put(t, base, "kept", []byte("v"), 0, 0))
	code, _ := probe(n.AdminAddr(), "/readyz")
	require.Equal(t, http.StatusOK, code)

	failing.Store(true)
	for _, key := range []string{"failed", "after"} {
		code, body := cl.Do(t, http.MethodPut, testcluster.EntityURL(base, key, 0, 0), []byte("x"))
		require.Equal(t, http.StatusInsufficientStorage, code, "%s", body)
		require.Contains(t, string(body), "insufficient storage: the store failed a write and takes none until the node restarts")
		require.Contains(t, string(body), "input/output error")
	}
	require.Equal(t, http.StatusInsufficientStorage, cl.Delete(t, base, "kept", 0, 0))
	code, body := cl.Get(t, base, "kept", 0, 0)
	require.Equal(t, http.StatusOK, code, "reads go on")
	require.Equal(t, "v", string(body))

	code, why := probe(n.AdminAddr(), "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, why, "the store failed a write")
	require.Error(t, n.Ready())
	code, body = cl.Do(t, http.MethodGet, base+"/v0/status", nil)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, string(body), "warning: store failed a write (")
	code, metrics := probe(n.AdminAddr(), "/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, metrics, "\ndhtkv_store_failed 1\n")
	require.Contains(t, metrics, `dhtkv_store_writes_refused_total{reason="store_failed"}`)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := n.Shutdown(ctx); err != nil {
		require.Contains(t, err.Error(), "after it failed", "only the store's close may complain")
	}
	require.NoError(t, ctx.Err(), "the shutdown did not hang")
}

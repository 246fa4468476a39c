package node_test

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/buildinfo"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// startNode serves a single node on a free port with its data in a
// temporary directory, stopped at the end of the test.
func startNode(t *testing.T, adjust func(*node.Config)) *node.Node {
	t.Helper()
	cfg := node.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.DataDir = filepath.Join(t.TempDir(), "node")
	cfg.Sync = false
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if adjust != nil {
		adjust(&cfg)
	}
	n, err := node.Start(cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, n.Shutdown(ctx))
	})
	return n
}

// The node's registry says which build runs: dhtkv_build_info is 1 with
// the version and Go release as labels.
func TestBuildInfoMetric(t *testing.T) {
	n := startNode(t, nil)
	require.Equal(t, 1.0, testcluster.Metric(t, n.Registry(), "dhtkv_build_info",
		"version", buildinfo.Version(), "goversion", buildinfo.GoVersion()))
}

package node_test

import (
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/node"
)

// A start that fails because a port is taken leaves the data directory
// untouched: a retry with other flags starts as new, not on a map or an
// identity the failed start wrote.
func TestStartBindsBeforeWriting(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	for _, tc := range []struct{ name, listen, admin string }{
		{"admin port taken", "127.0.0.1:0", busy.Addr().String()},
		{"public port taken", busy.Addr().String(), "127.0.0.1:0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := node.DefaultConfig()
			cfg.Listen, cfg.AdminListen = tc.listen, tc.admin
			cfg.Self, cfg.Cluster = "http://127.0.0.1:30096", "http://127.0.0.1:30096"
			cfg.DataDir = filepath.Join(t.TempDir(), "node")
			cfg.Logger = slog.New(slog.DiscardHandler)
			_, err := node.Start(cfg)
			require.ErrorContains(t, err, "listen "+busy.Addr().String())
			_, err = os.Stat(cfg.DataDir)
			require.True(t, os.IsNotExist(err), "the data directory was not created: %v", err)
		})
	}
}

// --cluster is read when a data directory is new; a directory seeded from
// another list refuses to start rather than ignore the new one, and says
// what it holds. The original list, and a start without one, still work.
func TestChangedClusterListRefused(t *testing.T) {
	dir := t.TempDir()
	open := func(list string) error {
		cfg := node.DefaultConfig()
		cfg.Listen = "127.0.0.1:0"
		cfg.Self, cfg.Cluster = "http://127.0.0.1:30096", list
		cfg.DataDir = dir
		cfg.Logger = slog.New(slog.DiscardHandler)
		n, err := node.New(cfg)
		if err == nil {
			n.Close()
		}
		return err
	}
	require.NoError(t, open("http://127.0.0.1:30096"))
	err := open("http://127.0.0.1:30096,http://127.0.0.1:30098")
	require.ErrorContains(t, err, "--cluster http://127.0.0.1:30096,http://127.0.0.1:30098 is not the list data directory")
	require.ErrorContains(t, err, "members http://127.0.0.1:30096")
	require.ErrorContains(t, err, "dhtkvctl join")
	require.NoError(t, open("http://127.0.0.1:30096"), "the original list")
	require.NoError(t, open(""), "no list: the stored map")
}

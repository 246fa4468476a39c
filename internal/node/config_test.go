package node

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// The memtable spread: every node's size stays within ±spread of the
// base, is the same at every start, and the nodes of a local cluster get
// sizes apart from each other; 0 spreads nothing.
func TestMemTableBytes(t *testing.T) {
	const base = 16 << 20
	seen := map[uint64]bool{}
	for port := 8080; port < 8090; port++ {
		url := fmt.Sprintf("http://127.0.0.1:%d", port)
		got := memTableBytes(base, 0.25, url)
		require.GreaterOrEqual(t, got, uint64(0.75*base), url)
		require.Less(t, got, uint64(1.25*base), url)
		require.Equal(t, got, memTableBytes(base, 0.25, url), "the same at every start")
		require.False(t, seen[got], "%s: a size of its own", url)
		seen[got] = true
		require.Equal(t, uint64(base), memTableBytes(base, 0, url))
	}
}

// --snapshot-dir: beside the data directory by default, absolute; one
// inside the data directory, or holding it, is refused.
func TestSnapshotDir(t *testing.T) {
	for _, tc := range []struct {
		data, snapshots, want, err string
	}{
		{data: "/var/lib/dhtkv", want: "/var/lib/dhtkv-snapshots"},
		{data: "/var/lib/dhtkv/", want: "/var/lib/dhtkv-snapshots"},
		{data: "/var/lib/dhtkv", snapshots: "/backup/dhtkv", want: "/backup/dhtkv"},
		{data: "/var/lib/dhtkv", snapshots: "/var/lib/dhtkv-old", want: "/var/lib/dhtkv-old"},
		{data: "/var/lib/dhtkv", snapshots: "/var/lib/dhtkv/snapshots", err: "one is inside the other"},
		{data: "/var/lib/dhtkv", snapshots: "/var/lib/dhtkv", err: "one is inside the other"},
		{data: "/var/lib/dhtkv", snapshots: "/var/lib", err: "one is inside the other"},
		{data: "/var/lib/dhtkv", snapshots: "/var/lib/dhtkv/../dhtkv/x", err: "one is inside the other"},
	} {
		cfg := DefaultConfig()
		cfg.DataDir, cfg.SnapshotDir = tc.data, tc.snapshots
		err := cfg.Validate()
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, tc.snapshots)
			continue
		}
		require.NoError(t, err, tc.snapshots)
		got, err := cfg.snapshotDir()
		require.NoError(t, err)
		require.Equal(t, tc.want, got)
	}
	cfg := DefaultConfig()
	got, err := cfg.snapshotDir()
	require.NoError(t, err)
	require.True(t, filepath.IsAbs(got), got)
	require.Equal(t, "node1-snapshots", filepath.Base(got), "./data/node1's sibling")
}

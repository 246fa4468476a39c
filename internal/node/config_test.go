package node

import (
	"fmt"
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

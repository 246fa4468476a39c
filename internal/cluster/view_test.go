package cluster

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/membership"
	"github.com/dhtkv/dhtkv/internal/placement"
)

// testCoordinator is a coordinator of node self in a cluster of urls with
// only what unit tests of its logic need: a view whose peers have no
// client (nothing is sent), metrics, a discarding log.
func testCoordinator(t testing.TB, urls []string, self int) *Coordinator {
	t.Helper()
	m, err := membership.Seed(urls, 0)
	require.NoError(t, err)
	c := &Coordinator{m: newCoordMetrics(), timeout: time.Minute, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	v := &view{m: m, self: self, Sets: placement.Of(m),
		peers: make([]*peer, membership.MaxNodeID+1), since: time.Now()}
	for _, n := range m.Nodes {
		if n.ID != self {
			v.peers[n.ID] = &peer{readLat: new(latencyWindow)}
		}
	}
	c.view.Store(v)
	return c
}

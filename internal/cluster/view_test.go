package cluster

import (
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/membership"
)

// testCoordinator is a coordinator of node self in a cluster of urls with
// only what unit tests of its logic need: a view whose peers have no
// client (nothing is sent), metrics, a discarding log.
func testCoordinator(t testing.TB, urls []string, self int) *Coordinator {
	t.Helper()
	m, err := membership.Seed(urls, 0)
	require.NoError(t, err)
	c := &Coordinator{m: newCoordMetrics(), timeout: time.Minute, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	v := &view{m: m, self: self, old: NewPlacement(m.Nodes), new: NewPlacement(m.Nodes), replicas: m.Replicas,
		peers: make([]*peer, membership.MaxNodeID+1), since: time.Now()}
	for _, n := range m.Nodes {
		if n.ID != self {
			v.peers[n.ID] = &peer{readLat: new(latencyWindow)}
		}
	}
	c.view.Store(v)
	return c
}

// The stages route as membership.Stage says: reads by the old set until
// read-new, writes to both sets while a change is under way.
func TestViewRoutesByStage(t *testing.T) {
	urls := []string{"http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"}
	m, err := membership.Seed(urls, 2)
	require.NoError(t, err)
	c := &Coordinator{}
	c.clients = map[string]*peer{}
	stable := &view{m: m}
	require.False(t, stable.moving)
	join, err := m.BeginJoin("http://127.0.0.1:4", 0)
	require.NoError(t, err)
	for _, tc := range []struct {
		stage   membership.Stage
		readNew bool
	}{{membership.WriteBoth, false}, {membership.Stream, false}, {membership.ReadNew, true}} {
		mm := *join
		ch := *join.Change
		ch.Stage = tc.stage
		mm.Change = &ch
		v := &view{m: &mm, self: 0, old: NewPlacement(mm.Old()), new: NewPlacement(mm.New()), moving: true, readNew: tc.stage == membership.ReadNew, replicas: 2}
		moved := 0
		for i := range 2000 {
			key := []byte{byte(i), byte(i >> 8), 'k'}
			old, new := v.writeSets(key, 2, nil, nil)
			require.Len(t, old, 2)
			require.Len(t, new, 2)
			require.NotContains(t, old, 3, "the joining node is in no old set")
			reads := v.readReplicas(key, 2, nil)
			if tc.readNew {
				require.Equal(t, new, reads)
			} else {
				require.Equal(t, old, reads)
			}
			if !slices.Equal(old, new) {
				moved++
			}
		}
		require.Positive(t, moved, "some keys move to the new node")
	}
}

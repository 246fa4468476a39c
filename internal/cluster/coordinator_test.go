package cluster

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/view"
)

// openGate admits every call.
type openGate struct{}

func (openGate) Admit(uint64) bool { return true }
func (openGate) Release()          {}

// testCoordinator is a coordinator of node self in a cluster of urls with
// only what unit tests of its logic need: a view whose peers have no
// transport (nothing is sent), an open gate, a discarding log.
func testCoordinator(t testing.TB, urls []string, self int) *Coordinator {
	t.Helper()
	m, err := clustermap.Seed(urls, 0)
	require.NoError(t, err)
	v := view.New(m, self, "", func(string) view.Peer { return nil }, time.Now())
	c := New(Deps{Views: func() *view.View { return v }, Gate: openGate{}}, Options{Timeout: time.Minute}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	r := &routes{View: v, peers: make([]*peer, len(v.Peers))}
	for _, n := range m.Nodes {
		if n.ID != self {
			r.peers[n.ID] = &peer{readLat: new(latencyWindow)}
		}
	}
	c.routes.Store(r)
	return c
}

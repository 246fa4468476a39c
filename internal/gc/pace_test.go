package gc

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/view"
)

// singleNode is a collector of a one-node cluster (no peer to wait for)
// whose store holds live records live and tombstones tombs deleted two
// hours ago, with a grace of one hour: every tombstone is collectable.
func singleNode(t *testing.T, live, tombs int, o Options) (*Collector, *store.Store) {
	t.Helper()
	st, err := store.Open("db", store.Options{FS: vfs.NewMem()})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	clock, err := hlc.New(1, time.Now)
	require.NoError(t, err)
	local := &replica.Replica{Store: st, Clock: clock}
	deleted := hlc.VersionAt(time.Now().Add(-2*time.Hour)) + 1
	for i := range live + tombs {
		rec := record.Record{Version: deleted, Value: []byte("v")}
		if i >= live {
			rec = record.Record{Version: deleted, Tombstone: true}
		}
		require.NoError(t, st.Apply(fmt.Appendf(nil, "k%04d", i), &rec))
	}
	url := "http://127.0.0.1:1"
	m, err := clustermap.Seed([]string{url}, 1)
	require.NoError(t, err)
	v := view.New(m, 0, url, func(string) view.Peer { return nil }, time.Now())
	o.Grace = time.Hour
	g := New(local, func() *view.View { return v }, func() []time.Time { return make([]time.Time, 1) }, nil, o, slog.New(slog.DiscardHandler))
	g.now = func() time.Time { return time.Now().Add(time.Second) } // every record arrived before now
	return g, st
}

// TestPassTakesTokens: a pass takes a token for every index entry it
// reads and removeCost for every record it removes, from the limiter the
// background pace governs. At one token a second the refill during the
// pass is negligible, so the tokens left say what it took.
func TestPassTakesTokens(t *testing.T) {
	g, _ := singleNode(t, 300, 20, Options{Rate: 1})
	start := time.Now()
	full := g.Limiter().TokensAt(start)
	require.Equal(t, 20, g.Pass(context.Background()))
	took := full - g.Limiter().TokensAt(start)
	require.InDelta(t, 320+20*removeCost, took, 0.5, "entries read: 320; records removed: 20")
	require.Zero(t, g.Pass(context.Background()), "nothing left to remove")
}

// TestPassStopsWithItsContext: a pass whose context is done (the
// collector closing) removes nothing more; the next one does the work.
func TestPassStopsWithItsContext(t *testing.T) {
	g, _ := singleNode(t, 10, 5, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.Zero(t, g.Pass(ctx))
	require.Equal(t, 5, g.Pass(context.Background()))
}

// TestPassWaitsForItsRate: a pass that needs more tokens than the
// limiter holds waits for them, and gives up when its context ends
// while it waits.
func TestPassWaitsForItsRate(t *testing.T) {
	g, _ := singleNode(t, 0, 5, Options{Rate: 1})
	require.True(t, g.Limiter().AllowN(time.Now(), g.Limiter().Burst()), "drain the bucket")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	require.Zero(t, g.Pass(ctx), "five entries at one a second, from an empty bucket")
}

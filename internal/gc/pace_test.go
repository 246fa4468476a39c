package gc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
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
	local := replicaWith(t, live, tombs)
	url := "http://127.0.0.1:1"
	m, err := clustermap.Seed([]string{url}, 1)
	require.NoError(t, err)
	v := view.New(m, 0, url, func(string) view.Peer { return nil }, time.Now())
	o.Grace = time.Hour
	g := New(local, func() *view.View { return v }, func() []view.Synced { return make([]view.Synced, 1) }, nil, o, slog.New(slog.DiscardHandler))
	g.now = func() time.Time { return time.Now().Add(time.Second) } // every record arrived before now
	return g, local.Store
}

// replicaWith is a replica on an in-memory store holding live records
// live, then tombstones tombs, all deleted two hours ago: k0000, k0001...
func replicaWith(t *testing.T, live, tombs int) *replica.Replica {
	t.Helper()
	st, err := store.Open("db", store.Options{FS: vfs.NewMem()})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	clock, err := hlc.New(1, time.Now)
	require.NoError(t, err)
	deleted := hlc.VersionAt(time.Now().Add(-2*time.Hour)) + 1
	for i := range live + tombs {
		rec := record.Record{Version: deleted, Value: []byte("v")}
		if i >= live {
			rec = record.Record{Version: deleted, Tombstone: true}
		}
		require.NoError(t, st.Apply(fmt.Appendf(nil, "k%04d", i), &rec))
	}
	return &replica.Replica{Store: st, Clock: clock}
}

// TestPassTakesTokens: a pass takes a token for every index entry it
// reads and removeCost for every record it removes, from the limiter the
// background pace governs. At one token a second the refill during the
// pass is at most its length in seconds, so the tokens left say what it
// took within that (a loaded machine's pass took 0.52 s).
func TestPassTakesTokens(t *testing.T) {
	g, _ := singleNode(t, 300, 20, Options{Rate: 1})
	start := time.Now()
	full := g.Limiter().TokensAt(start)
	require.Equal(t, 20, g.Pass(context.Background()))
	took := full - g.Limiter().TokensAt(start)
	refill := time.Since(start).Seconds()
	require.InDelta(t, 320+20*removeCost, took, 0.5+refill, "entries read: 320; records removed: 20")
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

// incarnationPeer answers pings with the incarnations of incs in turn,
// the last for good (0: silent); no other call is made of it.
type incarnationPeer struct {
	view.Peer
	mu    sync.Mutex
	incs  []uint64
	pings int
}

func (p *incarnationPeer) Ping(uint64, time.Time) (view.PingAnswer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	inc := p.incs[min(p.pings, len(p.incs)-1)]
	p.pings++
	if inc == 0 {
		return view.PingAnswer{}, errors.New("silent")
	}
	return view.PingAnswer{Incarnation: inc}, nil
}

// An exchange with a peer counts only while the peer answers with the
// incarnation it had then: a peer restarted since (a backup restored may
// lack the tombstone the exchange found) or silent stops the collection
// of what it shares, as does one that restarts while the pass runs. The
// pass asks again before removing once its last answer is older than a
// second; in the bubble a drained limiter makes the pass take minutes.
func TestPassTrustsAnExchangeWhileItsIncarnationRuns(t *testing.T) {
	for _, tc := range []struct {
		name    string
		synced  uint64   // the incarnation the exchange saw (0: it changed during it)
		answers []uint64 // the peer's pings, in turn
		slow    bool     // the pass waits for its rate
		removed int
	}{
		{"the same incarnation", 7, []uint64{7}, false, 20},
		{"the same incarnation, a slow pass", 7, []uint64{7}, true, 20},
		{"restarted since the exchange", 7, []uint64{8}, false, 0},
		{"silent", 7, []uint64{0}, false, 0},
		{"restarted during the exchange", 0, []uint64{7}, false, 0},
		{"restarted during the pass", 7, []uint64{7, 8}, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				peer := &incarnationPeer{incs: tc.answers}
				g := twoNodes(t, 20, peer, tc.synced)
				if tc.slow {
					require.True(t, g.Limiter().AllowN(time.Now(), g.Limiter().Burst()), "drain the bucket")
				}
				require.Equal(t, tc.removed, g.Pass(context.Background()))
				if tc.slow {
					require.Greater(t, peer.pings, 1, "asked again before removing")
				}
			})
		})
	}
}

// twoNodes is a collector of node 0 of a two-node cluster of factor 2 (the
// peer shares every partition) whose store holds tombs tombstones deleted
// two hours ago, with a grace of one hour, and an exchange with the peer,
// whose incarnation was synced, after they all arrived.
func twoNodes(t *testing.T, tombs int, peer view.Peer, synced uint64) *Collector {
	t.Helper()
	return nodes(t, tombs, 2, []view.Peer{peer}, []uint64{synced})
}

// nodes is a collector of node 0 of a cluster of 1+len(peers) nodes and
// the factor given, whose store holds tombs tombstones deleted two hours
// ago, with a grace of one hour, and an exchange with each peer after
// they all arrived, which saw the incarnation of synced.
func nodes(t *testing.T, tombs, factor int, peers []view.Peer, synced []uint64) *Collector {
	t.Helper()
	local := replicaWith(t, 0, tombs)
	urls := []string{"http://127.0.0.1:1"}
	byURL := map[string]view.Peer{}
	exchange := []view.Synced{{}}
	for i, p := range peers {
		urls = append(urls, fmt.Sprintf("http://127.0.0.1:%d", i+2))
		byURL[urls[i+1]] = p
		exchange = append(exchange, view.Synced{At: time.Now().Add(time.Millisecond), Incarnation: synced[i]})
	}
	m, err := clustermap.Seed(urls, factor)
	require.NoError(t, err)
	v := view.New(m, 0, urls[0], func(u string) view.Peer { return byURL[u] }, time.Now().Add(-time.Hour))
	g := New(local, func() *view.View { return v }, func() []view.Synced { return exchange }, nil,
		Options{Grace: time.Hour, Rate: 1}, slog.New(slog.DiscardHandler))
	g.now = func() time.Time { return time.Now().Add(time.Second) }
	return g
}

// A peer the pass does not rely on (silent at its start, so the
// partitions it shares wait) may answer or fall silent during the pass:
// the pass goes on with the partitions of the peers it relies on.
func TestPassIgnoresPeersItDoesNotRelyOn(t *testing.T) {
	removed := func(third []uint64) int {
		var n int
		synctest.Test(t, func(t *testing.T) {
			g := nodes(t, 200, 2, []view.Peer{&incarnationPeer{incs: []uint64{7}}, &incarnationPeer{incs: third}}, []uint64{7, 5})
			require.True(t, g.Limiter().AllowN(time.Now(), g.Limiter().Burst()), "drain the bucket: a pass of minutes")
			n = g.Pass(context.Background())
		})
		return n
	}
	silent := removed([]uint64{0})
	require.Positive(t, silent, "the partitions node 0 shares with node 1 alone")
	require.Less(t, silent, 200, "not those it shares with node 2")
	require.Equal(t, silent, removed([]uint64{0, 6}), "node 2 answers during the pass")
}

// TestPassStopsAtANewMap: a map installed during a pass (a membership
// change may have begun: rule 1) ends the pass before its next removal,
// or withdraws a removal whose commit it meets (the check is made again
// under the store's lock, which the install then waits for: see
// store.Store.Collect's still); nothing is removed under the old map, and
// the next pass, under the map it finds, removes them.
func TestPassStopsAtANewMap(t *testing.T) {
	for _, tc := range []struct {
		name string
		// oldViews is how many of the pass's looks at the map see the
		// first one: its start, then its check before the first removal,
		// then that removal's check as it commits.
		oldViews int
	}{
		{"installed before the first removal", 1},
		{"installed as the first removal commits", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			local := replicaWith(t, 0, 20)
			url := "http://127.0.0.1:1"
			m, err := clustermap.Seed([]string{url}, 1)
			require.NoError(t, err)
			first := view.New(m, 0, url, func(string) view.Peer { return nil }, time.Now())
			installed := view.New(m, 0, url, func(string) view.Peer { return nil }, time.Now())
			var mu sync.Mutex
			calls := 0
			views := func() *view.View {
				mu.Lock()
				defer mu.Unlock()
				if calls++; calls <= tc.oldViews {
					return first
				}
				return installed
			}
			g := New(local, views, func() []view.Synced { return make([]view.Synced, 1) }, nil, Options{Grace: time.Hour}, slog.New(slog.DiscardHandler))
			g.now = func() time.Time { return time.Now().Add(time.Second) }
			require.Zero(t, g.Pass(context.Background()), "the map changed before the first removal committed")
			require.Equal(t, 20, g.Pass(context.Background()), "the next pass, under the installed map")
		})
	}
}

// A pass raises a partition's horizon no higher than what its relied-on
// exchange vouched for: the exchange's start less Lag (a write may reach
// the peer after the exchange with a version from before it). With a
// grace shorter than the time since the exchange, the cutoff is above the
// exchange, and a horizon at the cutoff refused for good a write this node
// missed between the two, which anti-entropy then counted delivered. A
// tombstone at or above the capped horizon waits for a later pass.
func TestPassHorizonBelowTheExchangeLessLag(t *testing.T) {
	for _, tc := range []struct {
		name    string
		grace   time.Duration
		lag     time.Duration
		removed int
	}{
		{"the cutoff below the exchange", time.Hour, 0, 20},
		{"the cutoff above the exchange", time.Millisecond, 0, 20},
		{"above the exchange, with a lag", time.Millisecond, time.Minute, 20},
		{"a lag past the tombstones", time.Millisecond, 3 * time.Hour, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := twoNodes(t, 20, &incarnationPeer{incs: []uint64{7}}, 7)
				g.o.Grace, g.o.Lag = tc.grace, tc.lag
				exchange := g.synced()[1].At
				now := g.now()
				require.Equal(t, tc.removed, g.Pass(context.Background()))
				h := g.local.Store.HighestHorizon()
				require.LessOrEqual(t, h, hlc.VersionAt(exchange.Add(-tc.lag)), "a horizon above the exchange less the lag")
				require.LessOrEqual(t, h, hlc.VersionAt(now.Add(-tc.grace)), "a horizon above the cutoff")
			})
		})
	}
}

package cluster

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/view"
)

// memPeer is a remote replica holding one record per key in memory; down
// fails every call.
type memPeer struct {
	mu   sync.Mutex
	recs map[string]record.Record
	down bool
}

var errPeerDown = errors.New("peer down")

func (p *memPeer) Get(key []byte, _ uint64, _ time.Time) (record.Record, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		return record.Record{}, false, errPeerDown
	}
	r, ok := p.recs[string(key)]
	return r, ok, nil
}

func (p *memPeer) Apply(key, env []byte, _ uint64, _ time.Time) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		return 0, errPeerDown
	}
	rec, err := record.Decode(env)
	if err != nil {
		return 0, err
	}
	rec.Value = slices.Clone(rec.Value)
	if cur, ok := p.recs[string(key)]; ok && cur.Version > rec.Version {
		return cur.Version, nil
	}
	p.recs[string(key)] = rec
	return 0, nil
}
func (p *memPeer) setDown(d bool) { p.mu.Lock(); p.down = d; p.mu.Unlock() }
func (p *memPeer) Ping(uint64, time.Time) (view.PingAnswer, error) {
	return view.PingAnswer{Formed: true}, nil
}
func (p *memPeer) Summary([]byte, uint64, time.Time) ([]byte, error) { return nil, nil }
func (p *memPeer) Map([]byte, time.Time) ([]byte, error)             { return nil, nil }
func (p *memPeer) Reach(string, time.Time) (bool, error)             { return false, nil }
func (p *memPeer) ClockOffset() (view.ClockSample, bool)             { return view.ClockSample{}, false }
func (p *memPeer) Close()                                            {}

// memCoordinator is node self's coordinator over views, its local replica
// a real store in t's directory (returned, for a test to write to it
// directly), the peers whatever the views hold.
func memCoordinator(t *testing.T, self int, views func() *view.View, timeout time.Duration) (*Coordinator, *store.Store) {
	t.Helper()
	clock, err := hlc.New(self, nil)
	require.NoError(t, err)
	st, err := store.Open(filepath.Join(t.TempDir(), "db"), store.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	local := &replica.Replica{Store: st, Clock: clock, Versions: replica.NewVersionFilter(1<<10, 0)}
	c := New(Deps{Views: views, Gate: openGate{}, Clock: clock, Local: local},
		Options{Timeout: timeout}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(c.Close)
	return c, st
}

// TestReadRepairDuringChangeKeepsReadsMonotonic: a join of node 3 (D) to
// a cluster of three at factor 3 is in its stream stage; key k's old set
// is {0,1,2} and its new set drops one of them (X) for D. Before read-new
// a quorum read (ack=2) through D asks the old set: one replica (A) is
// down, B answers v1, X answers v2 (a failed write left there). The read
// answers v2 after read repair made ack=2 replicas of the old set hold it
// (B and X). Once the change reaches read-new, reads ask the new set
// {A, B, D}: with B down, a quorum read through D meets A and D, neither
// of which the repair wrote, and answers v1: older than what an earlier
// quorum read answered. Read repair before read-new must leave ack
// holders in the new set too, as a write of that stage does.
func TestReadRepairDuringChangeKeepsReadsMonotonic(t *testing.T) {
	clock, err := hlc.New(3, nil)
	require.NoError(t, err)
	st, err := store.Open(filepath.Join(t.TempDir(), "db"), store.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	local := &replica.Replica{Store: st, Clock: clock, Versions: replica.NewVersionFilter(1<<10, 0)}

	m0, err := clustermap.Seed([]string{"http://a:1", "http://b:1", "http://c:1"}, 3)
	require.NoError(t, err)
	mj, err := m0.BeginJoin("http://d:1", 0)
	require.NoError(t, err)
	mStream, err := mj.Advance()
	require.NoError(t, err)
	require.Equal(t, clustermap.Stream, mStream.Change.Stage)
	mReadNew, err := mStream.Advance()
	require.NoError(t, err)

	peers := map[string]*memPeer{}
	peerOf := func(url string) view.Peer {
		if peers[url] == nil {
			peers[url] = &memPeer{recs: map[string]record.Record{}}
		}
		return peers[url]
	}
	var mu sync.Mutex
	v := view.New(mStream, 3, "", peerOf, time.Now())
	views := func() *view.View { mu.Lock(); defer mu.Unlock(); return v }
	c := New(Deps{Views: views, Gate: openGate{}, Clock: clock, Local: local},
		Options{Timeout: time.Second, HedgeDelay: time.Millisecond}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(c.Close)

	// A key whose new set is D and two of the old nodes.
	var key []byte
	var oldSet, newSet []int
	for i := 0; ; i++ {
		key = fmt.Appendf(nil, "k%d", i)
		oldSet, newSet = v.WriteSets(key, 3, nil, nil)
		if slices.Contains(newSet, 3) {
			break
		}
	}
	var x int // the old replica the new set drops
	for _, n := range oldSet {
		if !slices.Contains(newSet, n) {
			x = n
		}
	}
	var keep []int // A and B: in both sets
	for _, n := range oldSet {
		if n != x {
			keep = append(keep, n)
		}
	}
	a, b := peers[v.URL(keep[0])], peers[v.URL(keep[1])]
	xp := peers[v.URL(x)]
	t.Logf("old set %v, new set %v; X=%d A=%d B=%d", oldSet, newSet, x, keep[0], keep[1])

	v1 := record.Record{Version: hlc.VersionAt(time.Now().Add(-time.Second)), Value: []byte("v1")}
	v2 := record.Record{Version: hlc.VersionAt(time.Now().Add(-500 * time.Millisecond)), Value: []byte("v2")}
	a.recs[string(key)], b.recs[string(key)] = v1, v1
	xp.recs[string(key)] = v2
	require.NoError(t, st.Apply(key, &v1)) // D's copy of the stream stage

	// Stream stage: reads ask the old set.
	a.setDown(true)
	res, err := c.Get(key, 2, 3)
	require.NoError(t, err)
	require.Equal(t, "v2", string(res.Rec.Value), "the first quorum read")
	c.inflight.Wait()
	a.setDown(false)

	// Read-new: reads ask the new set.
	mu.Lock()
	v = view.New(mReadNew, 3, "", peerOf, time.Now())
	mu.Unlock()
	b.setDown(true)
	res, err = c.Get(key, 2, 3)
	require.NoError(t, err)
	require.Equal(t, "v2", string(res.Rec.Value), "a later quorum read answered an older value than an earlier one")
}

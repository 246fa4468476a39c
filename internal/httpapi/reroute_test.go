package httpapi

import (
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/cluster"
	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/view"
)

type openGate struct{}

func (openGate) Admit(uint64) bool { return true }
func (openGate) Release()          {}

// stalePeer is a remote replica holding one record per key. While
// refuse is set it refuses a read as routed by an older map, as an
// rpc.Peer does on a 409: it first installs the peer's map (onRefuse),
// then fails the call with rpc.ErrStaleEpoch.
type stalePeer struct {
	mu       sync.Mutex
	recs     map[string]record.Record
	refuse   atomic.Bool
	onRefuse func()
}

func (p *stalePeer) Get(key []byte, _ uint64, _ time.Time) (record.Record, bool, error) {
	if p.refuse.CompareAndSwap(true, false) {
		p.onRefuse()
		return record.Record{}, false, fmt.Errorf("get: %w", rpc.ErrStaleEpoch)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.recs[string(key)]
	return r, ok, nil
}

func (p *stalePeer) Apply(key, env []byte, _ uint64, _ time.Time) (uint64, error) {
	rec, err := record.Decode(env)
	if err != nil {
		return 0, err
	}
	rec.Value = slices.Clone(rec.Value)
	p.mu.Lock()
	defer p.mu.Unlock()
	if cur, ok := p.recs[string(key)]; ok && cur.Version > rec.Version {
		return cur.Version, nil
	}
	p.recs[string(key)] = rec
	return 0, nil
}
func (p *stalePeer) Ping(uint64, time.Time) (view.PingAnswer, error) {
	return view.PingAnswer{Formed: true}, nil
}
func (p *stalePeer) Summary([]byte, uint64, time.Time) ([]byte, error) { return nil, nil }
func (p *stalePeer) Map([]byte, time.Time) ([]byte, error)             { return nil, nil }
func (p *stalePeer) Reach(string, time.Time) (bool, error)             { return false, nil }
func (p *stalePeer) ClockOffset() (view.ClockSample, bool)             { return view.ClockSample{}, false }
func (p *stalePeer) Close()                                            {}

// TestDefaultReadAckFollowsTheRerouteView: the replication factor grows
// from 1 to 3 on three nodes. Node 2 (the coordinator) is still at the
// stream stage, where a read asks the old set (one replica), so a GET's
// default ack is 1 (a majority of 3 cut to the read set's factor). The
// old replica has installed read-new and refuses the read as stale; node
// 2 installs read-new and routes the read again, now over the new set of
// three, where the default ack is 2. A write acknowledged at read-new by
// the two other replicas (ack=2, the default) is not on node 2 yet. The
// handler's ack, computed from the first view, was kept for the second
// route: the read asked node 2 alone and answered the older value
// (or 404), though a quorum of the set it read held the newer one.
func TestDefaultReadAckFollowsTheRerouteView(t *testing.T) {
	const self = 2
	urls := []string{"http://n0:1", "http://n1:1", "http://n2:1"}
	m, err := clustermap.Seed(urls, 1)
	require.NoError(t, err)
	m, err = m.BeginReplicas(3, 0)
	require.NoError(t, err)
	stream, err := m.Advance()
	require.NoError(t, err)
	require.Equal(t, clustermap.Stream, stream.Change.Stage)
	readNew, err := stream.Advance()
	require.NoError(t, err)
	require.Equal(t, clustermap.ReadNew, readNew.Change.Stage)

	clock, err := hlc.New(self, nil)
	require.NoError(t, err)
	st, err := store.Open(filepath.Join(t.TempDir(), "db"), store.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	local := &replica.Replica{Store: st, Clock: clock, Versions: replica.NewVersionFilter(1<<10, 0)}

	var views atomic.Pointer[view.View]
	peers := map[string]*stalePeer{}
	peerOf := func(url string) view.Peer {
		if peers[url] == nil {
			peers[url] = &stalePeer{recs: map[string]record.Record{}}
		}
		return peers[url]
	}
	views.Store(view.New(stream, self, "", peerOf, time.Now()))
	after := view.New(readNew, self, "", peerOf, time.Now())

	// A key whose old replica is another node.
	var key []byte
	for i := 0; ; i++ {
		key = fmt.Appendf(nil, "k%d", i)
		if reps := views.Load().ReadReplicas(key, 3, nil); reps[0] != self {
			break
		}
	}
	c := cluster.New(cluster.Deps{Views: views.Load, Gate: openGate{}, Clock: clock, Local: local},
		cluster.Options{Timeout: time.Second, HedgeDelay: time.Hour}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(c.Close)

	v1 := record.Record{Version: hlc.VersionAt(time.Now().Add(-time.Second)), Value: []byte("v1")}
	v2 := record.Record{Version: hlc.VersionAt(time.Now().Add(-500 * time.Millisecond)), Value: []byte("v2")}
	require.NoError(t, st.Apply(key, &v1)) // node 2 has not got the newer write yet
	for i := range self {
		peers[urls[i]].recs[string(key)] = v2 // acknowledged by ack=2 of the new set
	}
	old := peers[urls[views.Load().ReadReplicas(key, 3, nil)[0]]]
	old.onRefuse = func() { views.Store(after) }
	old.refuse.Store(true)

	s := &Server{Coord: c, Metrics: NewMetrics(nil), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Limits: Limits{MaxKeyBytes: 1 << 10, MaxValueBytes: 1 << 20}}
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod(fasthttp.MethodGet)
	ctx.Request.SetRequestURI("/v0/entity?id=" + string(key))
	s.Handler(&ctx)
	require.Same(t, after, views.Load(), "the read was routed again by read-new")
	require.Equal(t, fasthttp.StatusOK, ctx.Response.StatusCode(), string(ctx.Response.Body()))
	require.Equal(t, "v2", string(ctx.Response.Body()),
		"a default-ack read routed again by read-new answered an older value than a quorum of the set it read holds")
}

package membership_test

import (
	"context"
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
	"go.uber.org/goleak"

	"github.com/dhtkv/dhtkv/internal/antientropy"
	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/maplog"
	"github.com/dhtkv/dhtkv/internal/membership"
	"github.com/dhtkv/dhtkv/internal/partcopy"
	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/placement"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/view"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// cluster is membership services in one process: each node a real store,
// an rpc.Server, and rpc.Direct links to the others, which a test cuts. A
// link to a node not started yet is cut until the node starts.
type cluster struct {
	t       *testing.T
	servers map[string]*rpc.Server
	links   map[[2]string]*rpc.Direct // [from, to]
	members map[string]*membership.Service
	mu      sync.Mutex
	copied  map[string][]int // by node URL: the old replicas it copied gained partitions from
	// by node URL, then partition: the old replicas it streamed the
	// partition from or compared it with
	covered map[string]map[partition.ID][]int
	// hold, when set, holds every copy until it is closed: a change
	// then stays in its stream stage. holdFrom holds the copies of one
	// node (by URL) alike.
	hold     chan struct{}
	holdFrom map[string]chan struct{}
	// rebuilding, by URL, is what a node's Options.Rebuilding reports
	// (absent: never rebuilding).
	rebuilding map[string]*atomic.Bool
	// left, by URL, is closed when the node's service calls OnLeft.
	left map[string]chan struct{}
	// cut are links cut from the start, by [from, to] (c.mu held).
	cut map[[2]string]bool
	// stores are the nodes' stores, by URL.
	stores map[string]*store.Store
}

func newCluster(t *testing.T) *cluster {
	return &cluster{t: t, servers: map[string]*rpc.Server{}, links: map[[2]string]*rpc.Direct{},
		members: map[string]*membership.Service{}, copied: map[string][]int{}, covered: map[string]map[partition.ID][]int{},
		left: map[string]chan struct{}{}, stores: map[string]*store.Store{}}
}

// server returns the server of the node at url, made empty the first time
// (c.mu held).
func (c *cluster) server(url string) *rpc.Server {
	srv := c.servers[url]
	if srv == nil {
		srv = &rpc.Server{}
		c.servers[url] = srv
	}
	return srv
}

// link returns the link from one node to another, cut while the other has
// not started (c.mu held).
func (c *cluster) link(from, to string, maps rpc.Maps) *rpc.Direct {
	d := &rpc.Direct{URL: to, Server: c.server(to), Maps: maps}
	if c.members[to] == nil || c.cut[[2]string{from, to}] {
		d.Cut(true)
	}
	c.links[[2]string{from, to}] = d
	return d
}

// startWith runs the membership of the node at url of map m, following
// the map's log l (started).
func (c *cluster) startWith(m *clustermap.Map, url string, l *maplog.Log) *membership.Service {
	t := c.t
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := store.Open(filepath.Join(t.TempDir(), "db"), store.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	require.NoError(t, st.SetClusterMap(m.Encode()))
	self := m.ByURL(url).ID
	clock, err := hlc.New(self, time.Now)
	require.NoError(t, err)
	local := &replica.Replica{Store: st, Clock: clock}
	c.mu.Lock()
	c.stores[url] = st
	srv := c.server(url)
	var rebuilding func() bool
	left := make(chan struct{})
	c.left[url] = left
	if r := c.rebuilding[url]; r != nil {
		rebuilding = r.Load
	}
	c.mu.Unlock()
	s, err := membership.New(m, self, local, membership.Options{
		Dial: func(to string, maps rpc.Maps) view.Peer {
			c.mu.Lock()
			defer c.mu.Unlock()
			return c.link(url, to, maps)
		},
		Copy:       copier{c, url},
		Exchange:   copier{c, url},
		Timeout:    100 * time.Millisecond,
		Log:        l,
		Rebuilding: rebuilding,
		OnLeft:     func() { close(left) }, // called once
	}, log)
	require.NoError(t, err)
	*srv = rpc.Server{Replica: local, MaxKeyBytes: 1024, MaxValueBytes: 1 << 20, Log: log, Maps: s}
	c.mu.Lock()
	c.members[url] = s
	for k, d := range c.links {
		if k[1] == url && !c.cut[k] {
			d.Cut(false) // after the server is filled: Cut orders it
		}
	}
	c.mu.Unlock()
	s.Start()
	t.Cleanup(s.Close)
	return s
}

// copier records which old replicas a gaining node streamed or compared
// which partitions with; a cut link fails either, as it would the real
// stream or exchange.
type copier struct {
	c   *cluster
	url string
}

func (x copier) Copy(ctx context.Context, url string, epoch uint64, parts *partition.Set) (partcopy.Stats, error) {
	x.c.mu.Lock()
	hold := x.c.hold
	if h := x.c.holdFrom[x.url]; h != nil {
		hold = h
	}
	x.c.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return partcopy.Stats{}, ctx.Err()
		}
	}
	v := x.c.member(x.url).View()
	peer := v.Map.ByURL(url).ID
	if _, err := v.Peers[peer].Ping(epoch, time.Now().Add(time.Second)); err != nil {
		return partcopy.Stats{}, err
	}
	x.record(peer, parts.IDs())
	return partcopy.Stats{}, nil
}

func (x copier) Exchange(_ context.Context, v *view.View, peer int, parts []partition.ID, pullOnly bool) (antientropy.ExchangeStats, error) {
	if !pullOnly {
		return antientropy.ExchangeStats{}, fmt.Errorf("a move pulls only")
	}
	if _, err := v.Peers[peer].Ping(v.Epoch(), time.Now().Add(time.Second)); err != nil {
		return antientropy.ExchangeStats{}, err
	}
	x.record(peer, parts)
	return antientropy.ExchangeStats{}, nil
}

func (x copier) record(peer int, parts []partition.ID) {
	x.c.mu.Lock()
	defer x.c.mu.Unlock()
	x.c.copied[x.url] = append(x.c.copied[x.url], peer)
	if x.c.covered[x.url] == nil {
		x.c.covered[x.url] = map[partition.ID][]int{}
	}
	for _, p := range parts {
		x.c.covered[x.url][p] = append(x.c.covered[x.url][p], peer)
	}
}

func (c *cluster) member(url string) *membership.Service {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[url]
}

// die kills the node at u: every link to it is cut, and its log closed (a
// dead node's log dies with it).
func (c *cluster) die(u string, l *maplog.Log) {
	c.mu.Lock()
	for k, d := range c.links {
		if k[1] == u {
			d.Cut(true)
		}
	}
	c.mu.Unlock()
	closeLog(c.t, l)
}

// A join goes through its stages on every member: the log takes each
// stage once every member acknowledged the last, the new node copies its
// gained partitions from every old replica of them (stream), and only
// then do reads move (read-new). A link from the new node cut from its
// start holds the change in the stream stage until it heals.
func TestJoinThroughItsStages(t *testing.T) {
	urls := []string{"http://n1:1", "http://n2:1", "http://n3:1"}
	c, logs := loggedCluster(t, urls)
	c.settled(logs[urls[0]], 3)
	net4 := listenLog(t)
	first, err := c.member(urls[0]).Join("http://n4:1")
	require.NoError(t, err)
	require.Equal(t, clustermap.WriteBoth, first.Change.Stage)
	_, err = c.member(urls[1]).Join("http://n5:1")
	require.ErrorIs(t, err, membership.ErrChangeRefused, "one change at a time")

	// The new node starts from the log's map, as --join does; its link
	// to node 2 is cut before it can copy from it.
	joinerID := first.ByURL("http://n4:1").ID
	c.mu.Lock()
	c.cut = map[[2]string]bool{{"http://n4:1", urls[1]}: true}
	c.mu.Unlock()
	l4 := openLog(t, net4, joinerID)
	res, err := logs[urls[0]].Submit(ctxFor(t, 20*time.Second), maplog.Command{Op: maplog.OpAddr, Node: joinerID, Addr: net4.Addr().String()})
	require.NoError(t, err)
	require.True(t, res.Accepted, res.Reason)
	m, _, err := membership.AwaitMember(ctxFor(t, 20*time.Second), l4, "http://n4:1")
	require.NoError(t, err)
	joiner := c.startWith(m, "http://n4:1", l4)
	require.Eventually(t, func() bool {
		got, _ := joiner.Map()
		return got.Change != nil && got.Change.Stage == clustermap.Stream
	}, 10*time.Second, 10*time.Millisecond, "the change reaches stream")
	var got *clustermap.Map
	require.Eventually(t, func() bool {
		got, _ = c.member(urls[0]).Map()
		return got.Change != nil && got.Change.Stage == clustermap.Stream
	}, 10*time.Second, 10*time.Millisecond, "every member installs stream")
	require.Less(t, joiner.Moved(), got.Epoch, "the joiner cannot copy")
	require.Eventually(t, func() bool {
		st := logs[urls[0]].State()
		return st.Map.Epoch == got.Epoch && slices.Equal(st.Waiting(-1), []int{joinerID})
	}, 10*time.Second, 10*time.Millisecond, "the log holds the change in stream, waiting for the joiner's copy")
	require.Equal(t, clustermap.Stream, logs[urls[0]].Map().Change.Stage)

	c.mu.Lock()
	c.cut = nil
	cut := c.links[[2]string{"http://n4:1", urls[1]}]
	c.mu.Unlock()
	cut.Cut(false)
	final := c.settled(logs[urls[0]], 4)
	require.Len(t, final.Nodes, 4)
	require.NotNil(t, final.ByURL("http://n4:1"))
	require.Equal(t, joinerID, final.ByURL("http://n4:1").ID)

	// The joiner copied from old replicas, and from node 2 only once its
	// link healed.
	c.mu.Lock()
	sources := slices.Clone(c.copied["http://n4:1"])
	c.mu.Unlock()
	require.Contains(t, sources, 1, "node 2 is an old replica of some gained partition")
	require.NotContains(t, sources, joinerID)
	// Every partition it gained was streamed from or compared with every
	// one of its old replicas, once each.
	gains := placement.Of(first).Gains(joinerID)
	want := map[partition.ID][]int{}
	for r, ps := range gains {
		for _, p := range ps {
			want[p] = append(want[p], r)
		}
	}
	c.mu.Lock()
	covered := c.covered["http://n4:1"]
	c.mu.Unlock()
	require.Len(t, covered, len(want))
	for p, rs := range want {
		got := slices.Sorted(slices.Values(covered[p]))
		require.Equal(t, slices.Sorted(slices.Values(rs)), got, "partition %d", p)
	}
}

package maplog

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
)

// The test group: real logs (Pebble on t.TempDir()), raft's in-memory
// transport, and proposals forwarded in memory (hub). Each node acks
// every map it applies, as a node does once it installed it; members of
// the map that are not log nodes ("phantoms", joined by URL only) are
// acked for by the test.

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func fastOptions() Options {
	return Options{
		HeartbeatTimeout: 100 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond,
		LeaderLeaseTimeout: 100 * time.Millisecond, CommitTimeout: 5 * time.Millisecond,
		ApplyTimeout: 5 * time.Second, RebalanceInterval: 100 * time.Millisecond,
	}
}

// hub carries forwarded proposals between the group's nodes.
type hub struct {
	mu       sync.Mutex
	handlers map[string]func(context.Context, []byte) []byte
}

type memFwd struct {
	h    *hub
	addr string
}

func (f *memFwd) Forward(ctx context.Context, addr string, cmd []byte) ([]byte, error) {
	f.h.mu.Lock()
	h := f.h.handlers[addr]
	f.h.mu.Unlock()
	if h == nil {
		return nil, fmt.Errorf("%s is down", addr)
	}
	return h(ctx, cmd), nil
}

func (f *memFwd) ServeForwarded(h func(context.Context, []byte) []byte) {
	f.h.mu.Lock()
	f.h.handlers[f.addr] = h
	f.h.mu.Unlock()
}

func (f *memFwd) Close() error {
	f.h.mu.Lock()
	delete(f.h.handlers, f.addr)
	f.h.mu.Unlock()
	return nil
}

type testNode struct {
	id    int
	dir   string
	addr  raft.ServerAddress
	trans *raft.InmemTransport
	log   *Log
	stop  chan struct{}
	done  sync.WaitGroup
	ack   atomic.Bool // whether this node acks
}

type group struct {
	t     *testing.T
	o     Options
	hub   *hub
	mu    sync.Mutex
	nodes map[int]*testNode
	// phantomAcks, when set, makes node 0 ack for map members that are
	// not log nodes.
	phantomAcks atomic.Bool
	stop        chan struct{}
	done        sync.WaitGroup
}

func urlOf(id int) string { return fmt.Sprintf("http://127.0.0.1:%d", 8080+id) }

// newGroup starts n log nodes, bootstraps them all with the same
// configuration, seeds a map of the n nodes (with the log addresses of
// all but those of unlisted) and waits until every node acked it.
func newGroup(t *testing.T, n int, o Options, unlisted ...int) *group {
	g := &group{t: t, o: o, hub: &hub{handlers: map[string]func(context.Context, []byte) []byte{}}, nodes: map[int]*testNode{}, stop: make(chan struct{})}
	g.phantomAcks.Store(true)
	var servers []Server
	var urls []string
	addrs := map[int]string{}
	for i := range n {
		nd := &testNode{id: i, dir: t.TempDir(), addr: raft.ServerAddress("node" + strconv.Itoa(i))}
		g.nodes[i] = nd
		servers = append(servers, Server{ID: i, Addr: string(nd.addr)})
		urls = append(urls, urlOf(i))
		if !slices.Contains(unlisted, i) {
			addrs[i] = string(nd.addr)
		}
	}
	for i := range n {
		g.start(i)
	}
	for i := range n {
		require.NoError(t, g.nodes[i].log.Bootstrap(servers))
	}
	m, err := clustermap.Seed(urls, 3)
	require.NoError(t, err)
	res, err := g.nodes[0].log.Submit(g.ctx(), Command{Op: OpSeed, Map: m, Addrs: addrs})
	require.NoError(t, err)
	if !res.Accepted {
		// Submit tried again after an uncertain outcome (the first
		// leader lost its office while the seed committed): a seed's
		// retry is refused with the log's map, which is then this seed,
		// as the node's seedMapLog takes it.
		require.NotNil(t, res.Map, res.String())
		require.Equal(t, m.Encode(), res.Map.Encode(), res.String())
	}
	g.done.Go(g.ackPhantoms)
	t.Cleanup(g.close)
	g.settle()
	return g
}

func (g *group) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	g.t.Cleanup(cancel)
	return ctx
}

// start opens node id's log from its directory and starts it.
func (g *group) start(id int) { g.startRelease(id, Rules, nil) }

// startRelease starts node id as a release that applies the log's rules
// up to rules, telling behind of the error if its replica finds the log's
// above them (Log.OnBehind).
func (g *group) startRelease(id, rules int, behind chan<- error) {
	nd := g.nodes[id]
	_, nd.trans = raft.NewInmemTransport(nd.addr)
	g.mu.Lock()
	for _, o := range g.nodes {
		if o.id != id && o.trans != nil && o.log != nil {
			o.trans.Connect(nd.addr, nd.trans)
			nd.trans.Connect(o.addr, o.trans)
		}
	}
	g.mu.Unlock()
	l, err := Open(vfs.Default, nd.dir, id, nd.trans, &memFwd{h: g.hub, addr: string(nd.addr)}, g.o, quiet)
	require.NoError(g.t, err)
	l.fsm.rules = rules
	if behind != nil {
		l.OnBehind(func(err error) { behind <- err })
	}
	require.NoError(g.t, l.Start())
	g.mu.Lock()
	nd.log = l
	g.mu.Unlock()
	stop := make(chan struct{})
	nd.stop = stop
	nd.ack.Store(true)
	nd.done.Go(func() { g.acker(nd, l, stop) })
}

// kill closes node id's log and cuts it off.
func (g *group) kill(id int) {
	nd := g.nodes[id]
	close(nd.stop)
	nd.done.Wait()
	g.mu.Lock()
	for _, o := range g.nodes {
		if o.id != id && o.log != nil {
			o.trans.Disconnect(nd.addr)
		}
	}
	l := nd.log
	nd.log = nil
	g.mu.Unlock()
	require.NoError(g.t, l.Close())
}

func (g *group) close() {
	close(g.stop)
	g.done.Wait()
	for id, nd := range g.nodes {
		if nd.log != nil {
			g.kill(id)
		}
	}
}

// acker acks, for node nd, every map it applies (and reports its copy
// in the stream stage), as the node would once it installed the map.
func (g *group) acker(nd *testNode, l *Log, stop chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-stop; cancel() }()
	for {
		st, changed := l.Watch()
		if m := st.Map; m != nil && m.Node(nd.id) != nil && nd.ack.Load() {
			if st.Acks[nd.id] < m.Epoch {
				_, _ = l.Ack(ctx, m.Epoch)
			} else if m.Change != nil && m.Change.Stage == clustermap.Stream && st.Copied[nd.id] < m.Epoch {
				_, _ = l.Copied(ctx, m.Epoch)
			}
		}
		select {
		case <-stop:
			return
		case <-changed:
		case <-time.After(50 * time.Millisecond): // an ack lost with a leader
		}
	}
}

// ackPhantoms acks for the map members that are not log nodes.
func (g *group) ackPhantoms() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-g.stop; cancel() }()
	for {
		select {
		case <-g.stop:
			return
		case <-time.After(20 * time.Millisecond):
		}
		l := g.any()
		if l == nil || !g.phantomAcks.Load() {
			continue
		}
		st := l.State()
		if st.Map == nil {
			continue
		}
		for _, n := range st.Map.Nodes {
			if g.isLogNode(n.ID) {
				continue
			}
			if st.Acks[n.ID] < st.Map.Epoch {
				_, _ = l.Submit(ctx, Command{Op: OpAck, Node: n.ID, Epoch: st.Map.Epoch})
			} else if c := st.Map.Change; c != nil && c.Stage == clustermap.Stream && st.Copied[n.ID] < st.Map.Epoch {
				_, _ = l.Submit(ctx, Command{Op: OpCopied, Node: n.ID, Epoch: st.Map.Epoch})
			}
		}
	}
}

func (g *group) isLogNode(id int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.nodes[id]
	return ok
}

// any returns a running node's log.
func (g *group) any() *Log {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i := range len(g.nodes) {
		if nd := g.nodes[i]; nd != nil && nd.log != nil {
			return nd.log
		}
	}
	return nil
}

func (g *group) running() []*testNode {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []*testNode
	for i := range len(g.nodes) {
		if nd := g.nodes[i]; nd.log != nil {
			out = append(out, nd)
		}
	}
	return out
}

// settle waits until every running node applied the same map, with no
// change under way and every member's acknowledgement in.
func (g *group) settle() *State {
	var st *State
	require.Eventually(g.t, func() bool {
		nodes := g.running()
		st = nodes[0].log.State()
		if st.Map == nil || st.Map.Change != nil || len(st.Waiting(-1)) > 0 {
			return false
		}
		for _, nd := range nodes[1:] {
			if s := nd.log.State(); s.Map == nil || s.Map.Epoch != st.Map.Epoch || len(s.Waiting(-1)) > 0 {
				return false
			}
		}
		return true
	}, 20*time.Second, 10*time.Millisecond)
	return st
}

func (g *group) leader() *testNode {
	var leader *testNode
	require.Eventually(g.t, func() bool {
		for _, nd := range g.running() {
			if nd.log.IsLeader() {
				leader = nd
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond)
	return leader
}

// Many change requests fired at once, made from the same map, from every
// member (voters and non-voters alike): in every round exactly one is
// accepted, every other gets a refusal with its reason, and the map ends
// as the accepted changes made it.
func TestConcurrentChanges(t *testing.T) {
	g := newGroup(t, 5, fastOptions()) // 3 voters, 2 non-voters
	conf, err := g.leader().log.Configuration()
	require.NoError(t, err)
	voters := 0
	for _, s := range conf {
		if s.Suffrage == raft.Voter {
			voters++
		}
	}
	require.Equal(t, 3, voters)

	phantoms := []int{} // joined by URL, acked for by the test
	nextURL := 9000
	for round := range 8 {
		st := g.settle()
		e := st.Map.Epoch
		var wg sync.WaitGroup
		results := make([]*Result, 5)
		cmds := make([]Command, 5)
		for i := range 5 {
			c := Command{Op: OpJoin, Epoch: e, From: i, URL: fmt.Sprintf("http://127.0.0.1:%d", nextURL)}
			nextURL++
			if i%2 == 1 && len(phantoms) > 0 {
				c = Command{Op: OpDecommission, Epoch: e, From: i, Node: phantoms[(round+i)%len(phantoms)]}
			}
			cmds[i] = c
			wg.Go(func() {
				res, err := g.nodes[i].log.Submit(g.ctx(), c)
				require.NoError(t, err)
				results[i] = res
			})
		}
		wg.Wait()
		accepted := -1
		for i, r := range results {
			if r.Accepted {
				if accepted >= 0 {
					t.Fatalf("round %d: two accepted: %v and %v", round, cmds[accepted], cmds[i])
				}
				accepted = i
				require.Equal(t, e+1, r.Map.Epoch)
			} else {
				require.NotEmpty(t, r.Reason)
				require.Contains(t, r.Reason, "the map moved on", "round %d, request %d: %s", round, i, r.Reason)
			}
		}
		require.NotEqual(t, -1, accepted, "round %d: none accepted", round)
		c, r := cmds[accepted], results[accepted]
		st = g.settle()
		switch c.Op {
		case OpJoin:
			require.Equal(t, st.Map.NextID-1, r.Node)
			require.NotNil(t, st.Map.ByURL(c.URL))
			phantoms = append(phantoms, r.Node)
		case OpDecommission:
			require.Nil(t, st.Map.Node(c.Node))
			for j, p := range phantoms {
				if p == c.Node {
					phantoms = append(phantoms[:j], phantoms[j+1:]...)
					break
				}
			}
		}
		require.Equal(t, 5+len(phantoms), len(st.Map.Nodes))
	}
}

// Joins asked at once, each retried until it is in: every node gets its
// own id, the next ones of the log's counter.
func TestConcurrentJoinsUniqueIDs(t *testing.T) {
	g := newGroup(t, 3, fastOptions())
	ids := make([]int, 6)
	var wg sync.WaitGroup
	for i := range ids {
		url := fmt.Sprintf("http://127.0.0.1:%d", 9100+i)
		l := g.nodes[i%3].log
		wg.Go(func() {
			ctx := g.ctx()
			for {
				st, changed := l.Watch()
				if n := st.Map.ByURL(url); n != nil {
					ids[i] = n.ID
					return
				}
				res, err := l.Submit(ctx, Command{Op: OpJoin, Epoch: st.Map.Epoch, From: i % 3, URL: url})
				require.NoError(t, err)
				if !res.Accepted {
					select {
					case <-changed:
					case <-ctx.Done():
						t.Errorf("join of %s: %v", url, ctx.Err())
						return
					}
				}
			}
		})
	}
	wg.Wait()
	require.ElementsMatch(t, []int{3, 4, 5, 6, 7, 8}, ids)
}

// The leader dies mid-change: the next leader has the change at the
// stage it reached, the change waits for the dead member, and completes
// once it restarts from its persisted log.
func TestLeaderKilledMidChange(t *testing.T) {
	g := newGroup(t, 5, fastOptions())
	g.phantomAcks.Store(false) // the joining node does not ack yet
	leader := g.leader()
	from := (leader.id + 1) % 5
	st := g.nodes[from].log.State()
	res, err := g.nodes[from].log.Submit(g.ctx(), Command{Op: OpJoin, ID: "join-x", Epoch: st.Map.Epoch, From: from, URL: "http://127.0.0.1:9200"})
	require.NoError(t, err)
	require.True(t, res.Accepted, res.String())
	began := res.Map.Epoch

	g.kill(leader.id)
	next := g.leader()
	require.NotEqual(t, leader.id, next.id)
	require.Eventually(t, func() bool {
		s := next.log.State()
		return s.Map.Epoch == began && s.Current != nil && s.Current.ID == "join-x"
	}, 10*time.Second, 10*time.Millisecond, "the new leader has the change")
	g.phantomAcks.Store(true)
	// The change waits for the dead member's acknowledgement.
	require.Eventually(t, func() bool {
		w := next.log.State().Waiting(-1)
		return len(w) == 1 && w[0] == leader.id
	}, 10*time.Second, 10*time.Millisecond)
	require.NotNil(t, next.log.State().Map.Change, "the change is still under way")

	g.start(leader.id)
	out, err := g.nodes[from].log.AwaitOutcome(g.ctx(), "join-x")
	require.NoError(t, err)
	require.False(t, out.Aborted)
	require.Equal(t, res.Node, out.Node)
	st = g.settle()
	require.Equal(t, st.Map.Epoch, g.nodes[leader.id].log.State().Map.Epoch)
}

// A restart restores the map from the latest snapshot at once, before
// any leader confirms the entries after it, and the log was compacted,
// so the snapshot is what it was restored from.
func TestRestartFromSnapshot(t *testing.T) {
	o := fastOptions()
	o.TrailingLogs = 1
	g := newGroup(t, 3, o)
	st := g.settle()
	res, err := g.any().Submit(g.ctx(), Command{Op: OpJoin, Epoch: st.Map.Epoch, From: 0, URL: "http://127.0.0.1:9300"})
	require.NoError(t, err)
	require.True(t, res.Accepted)
	want := g.settle()
	for _, nd := range g.running() {
		require.NoError(t, nd.log.r.Snapshot().Error())
	}
	for id := range 3 {
		g.kill(id)
	}
	for id := range 3 {
		nd := g.nodes[id]
		l, err := Open(vfs.Default, nd.dir, id, nil, nil, o, quiet)
		require.NoError(t, err)
		has, err := l.HasState()
		require.NoError(t, err)
		require.True(t, has)
		first, err := l.store.FirstIndex()
		require.NoError(t, err)
		require.Greater(t, first, uint64(1), "the log was compacted")
		require.NoError(t, l.Close())
	}
	g.start(0)
	got := g.nodes[0].log.State()
	require.Equal(t, want.Map, got.Map, "restored from the snapshot before any leader")
	g.start(1)
	g.start(2)
	require.Equal(t, want.Map.Epoch, g.settle().Map.Epoch)
}

// A node removed from the group while cut off comes back believing it
// still votes: its vote requests are refused (it is not in the
// configuration), the leader keeps its office and term, and changes go on.
func TestRemovedNodeCannotDisrupt(t *testing.T) {
	// Voters 0, 1, 2; non-voter 3. The map lists no log address for the
	// victim, so the leader's upkeep does not add it back once removed.
	const victim = 2
	g := newGroup(t, 4, fastOptions(), victim)
	leader := g.leader()
	for leader.id == victim {
		require.NoError(t, leader.log.r.LeadershipTransfer().Error())
		leader = g.leader()
	}
	// Cut the victim off.
	vn := g.nodes[victim]
	vn.ack.Store(false)
	g.mu.Lock()
	for _, o := range g.nodes {
		if o.id != victim {
			o.trans.Disconnect(vn.addr)
			vn.trans.Disconnect(o.addr)
		}
	}
	g.mu.Unlock()
	// Take it out of the group: the non-voter is promoted.
	require.NoError(t, leader.log.Remove(victim))
	require.Eventually(t, func() bool {
		conf, err := leader.log.Configuration()
		if err != nil {
			return false
		}
		voters := 0
		for _, s := range conf {
			if s.ID == ServerID(victim) {
				return false
			}
			if s.Suffrage == raft.Voter {
				voters++
			}
		}
		return voters == 3
	}, 10*time.Second, 10*time.Millisecond)
	term := leader.log.r.CurrentTerm()

	votes := make(chan raft.Observation, 16)
	obs := raft.NewObserver(votes, false, func(o *raft.Observation) bool {
		switch d := o.Data.(type) {
		case raft.RequestVoteRequest:
			return string(d.ID) == string(ServerID(victim))
		case raft.RequestPreVoteRequest:
			return string(d.ID) == string(ServerID(victim))
		}
		return false
	})
	leader.log.r.RegisterObserver(obs)
	defer leader.log.r.DeregisterObserver(obs)
	// Let the victim stand for election alone, then reconnect it.
	require.Eventually(t, func() bool { return vn.log.r.State() == raft.Candidate }, 10*time.Second, 5*time.Millisecond)
	g.mu.Lock()
	for _, o := range g.nodes {
		if o.id != victim {
			o.trans.Connect(vn.addr, vn.trans)
			vn.trans.Connect(o.addr, o.trans)
		}
	}
	g.mu.Unlock()
	select {
	case <-votes:
	case <-time.After(10 * time.Second):
		t.Fatal("the removed node never asked the leader for a vote")
	}
	require.True(t, leader.log.IsLeader())
	require.Equal(t, term, leader.log.r.CurrentTerm())
	res, err := leader.log.Submit(g.ctx(), Command{Op: OpAck, Node: leader.id, Epoch: 1})
	require.NoError(t, err)
	require.True(t, res.Accepted)
}

// A node a decommission leaves out stops voting as soon as the leader
// sees the map without it, stays in the group (a non-voter the leader
// still replicates to) until its replica of the log holds that map, and
// is removed once the grace has passed: it learns that it is out, and a
// stopped departed node never counts in a quorum.
func TestDepartedNodeLearnsItIsOut(t *testing.T) {
	// Ten heartbeats of 100 ms: the grace is a second.
	g := newGroup(t, 4, fastOptions())
	leader := g.leader()
	victim := 0
	for victim == leader.id || victim == 3 {
		victim++
	}
	st := leader.log.State()
	res, err := leader.log.Submit(g.ctx(), Command{Op: OpDecommission, Epoch: st.Map.Epoch, From: leader.id, Node: victim})
	require.NoError(t, err)
	require.True(t, res.Accepted, res.String())

	suffrage := func() (raft.ServerSuffrage, bool) {
		conf, err := g.leader().log.Configuration()
		require.NoError(t, err)
		for _, s := range conf {
			if s.ID == ServerID(victim) {
				return s.Suffrage, true
			}
		}
		return 0, false
	}
	var final *State
	require.Eventually(t, func() bool {
		final = g.leader().log.State()
		return final.Map.Node(victim) == nil && final.Map.Change == nil
	}, 20*time.Second, 10*time.Millisecond, "the decommission ends")
	// Demoted at once, not removed before the grace.
	require.Eventually(t, func() bool {
		s, in := suffrage()
		return in && s == raft.Nonvoter
	}, 5*time.Second, 5*time.Millisecond, "the departed voter stops voting and stays a member")
	// Its replica of the log receives the map that leaves it out.
	require.Eventually(t, func() bool {
		m := g.nodes[victim].log.State().Map
		return m != nil && m.Epoch >= final.Map.Epoch && m.Node(victim) == nil
	}, 5*time.Second, 5*time.Millisecond, "the departed node learns it is out")
	// Then it leaves the group, and three vote.
	require.Eventually(t, func() bool {
		_, in := suffrage()
		return !in
	}, 10*time.Second, 10*time.Millisecond, "removed after the grace")
	conf, err := g.leader().log.Configuration()
	require.NoError(t, err)
	voters := 0
	for _, s := range conf {
		if s.Suffrage == raft.Voter {
			voters++
		}
	}
	require.Equal(t, 3, voters)
}

// A member rolled back to a release whose rules are older than the log's
// (as a new node of such a release would be) applies nothing more: its
// replica says so from the snapshot it restores at start, refuses the
// entries after it, takes no snapshot that would drop them, and once the
// node runs a release that applies the rules again its replica applies
// every one of them and catches up.
func TestReplicaBehindTheRules(t *testing.T) {
	g := newGroup(t, 3, fastOptions())
	st := g.settle()
	require.Equal(t, Rules, st.Rules, "every member reported this release")
	for _, nd := range g.running() {
		require.NoError(t, nd.log.r.Snapshot().Error())
	}
	const old = 2
	g.kill(old)
	// A change made while it is down: its first map is in the log, its
	// stages wait for node 2.
	leader := g.leader()
	res, err := leader.log.Submit(g.ctx(), Command{Op: OpJoin, Epoch: st.Map.Epoch, From: leader.id, URL: "http://127.0.0.1:9300"})
	require.NoError(t, err)
	require.True(t, res.Accepted, res.String())

	behind := make(chan error, 1)
	g.nodes[old].ack.Store(false) // an old node would stop; this one stays, to be watched
	g.startRelease(old, Rules-1, behind)
	l := g.nodes[old].log
	require.ErrorIs(t, l.Behind(), ErrBehindRules, "found in the snapshot restored at start")
	require.ErrorIs(t, <-behind, ErrBehindRules)
	require.Contains(t, l.Behind().Error(), fmt.Sprintf("the log's rules are at %d and this release applies them up to %d", Rules, Rules-1))

	last := leader.log.r.LastIndex()
	require.Eventually(t, func() bool { return l.r.AppliedIndex() >= last }, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, st.Map.Epoch, l.Map().Epoch, "the join's map is refused, not applied by older rules")
	require.Greater(t, leader.log.Map().Epoch, st.Map.Epoch)
	require.ErrorContains(t, l.r.Snapshot().Error(), ErrBehindRules.Error(), "no snapshot drops the refused entries")

	// Made its leader, it hands the office on: its map stopped, so it
	// must neither shape the group by it nor answer proposals.
	leader = g.leader()
	// The future ends once the transfer is done: node 2 won an election.
	require.NoError(t, leader.log.r.LeadershipTransferToServer(ServerID(old), g.nodes[old].addr).Error())
	require.Eventually(t, func() bool {
		return !l.IsLeader() && g.leader().id != old
	}, 10*time.Second, 10*time.Millisecond, "another voter leads again")
	res, err = g.nodes[0].log.Submit(g.ctx(), Command{Op: OpAddr, Node: 0, Addr: string(g.nodes[0].addr)})
	require.NoError(t, err)
	require.True(t, res.Accepted, res.String())

	g.kill(old)
	g.start(old) // upgraded again
	final := g.settle()
	require.Nil(t, g.nodes[old].log.Behind())
	require.NotNil(t, final.Map.Node(3), "the join completed")
	require.Equal(t, final.Map, g.nodes[old].log.Map())
}

package maplog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
)

// memNet is listeners by address, and links between them that a test
// cuts: the shape of the in-memory test cluster's network. The listeners
// are loopback TCP: fasthttputil's in-memory pipes break net.Conn's rule
// that its methods may be called at once (their deadline setters race
// with each other and with Write), which the Network relies on when a
// cut or a caller's end sets a handshake's deadline from another
// goroutine.
type memNet struct {
	mu  sync.Mutex
	lns map[string]net.Listener
	cut map[[2]string]bool // [from, to]
	// refused counts the dials a cut link refused, by [from, to].
	refused map[[2]string]int
}

func (m *memNet) listen(addr string) net.Listener {
	m.mu.Lock()
	defer m.mu.Unlock()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(fmt.Sprintf("listen for %s: %v", addr, err))
	}
	m.lns[addr] = ln
	return ln
}

func (m *memNet) dialer(from string) Dialer {
	return func(ctx context.Context, addr string, timeout time.Duration) (net.Conn, error) {
		m.mu.Lock()
		ln, cut := m.lns[addr], m.cut[[2]string{from, addr}]
		m.mu.Unlock()
		if ln == nil || cut {
			m.mu.Lock()
			if m.refused == nil {
				m.refused = map[[2]string]int{}
			}
			m.refused[[2]string{from, addr}]++
			m.mu.Unlock()
			return nil, fmt.Errorf("no route from %s to %s", from, addr)
		}
		d := net.Dialer{Timeout: timeout}
		return d.DialContext(ctx, "tcp", ln.Addr().String())
	}
}

func (m *memNet) refusals(from, to string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.refused[[2]string{from, to}]
}

func (m *memNet) setCut(a string, cut bool, others ...string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, o := range others {
		m.cut[[2]string{a, o}], m.cut[[2]string{o, a}] = cut, cut
	}
}

// A group over NewNetwork's in-memory listeners and dialers, with a
// secret: the transport the in-memory test cluster gives its nodes, so
// that the raft traffic goes over links a test cuts. A member cut off
// from the others before it could hear of the seed gets the map only once
// its links heal; a node outside the group (its own replica knows no
// leader) asks for a change through a member (SubmitVia), which a
// follower answers by naming the leader.
func TestNetworkInMemory(t *testing.T) {
	o := fastOptions()
	mn := &memNet{lns: map[string]net.Listener{}, cut: map[[2]string]bool{}}
	auth := Auth{Secret: "s3cret"}
	addrs := []string{"mem0:1", "mem1:1", "mem2:1", "mem3:1"}
	mn.setCut(addrs[2], true, addrs[0], addrs[1])
	var servers []Server
	for i := range 3 {
		servers = append(servers, Server{ID: i, Addr: addrs[i]})
	}
	open := func(i int) *Log {
		n := NewNetwork(mn.listen(addrs[i]), addrs[i], mn.dialer(addrs[i]), auth, o, quiet)
		l, err := Open(vfs.NewMem(), "log", i, NewTCPTransport(n, quiet), n, o, quiet)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, l.Close()) })
		return l
	}
	var logs []*Log
	for i := range 3 {
		l := open(i)
		require.NoError(t, l.Start())
		l.fwd.(*Network).Start()
		require.NoError(t, l.Bootstrap(servers))
		logs = append(logs, l)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	seedLog(t, ctx, logs[0], urlOf(0), urlOf(1), urlOf(2))
	require.Eventually(t, func() bool { return logs[1].Map() != nil }, 10*time.Second, 5*time.Millisecond)
	require.Nil(t, logs[2].Map(), "cut off: the seed does not reach it")

	mn.setCut(addrs[2], false, addrs[0], addrs[1])
	require.Eventually(t, func() bool { return logs[2].Map() != nil }, 10*time.Second, 5*time.Millisecond, "healed: it does")
	ackEvery(t, ctx, logs, 1)

	// A node outside the group: its replica has no configuration and
	// knows no leader, so only a member can route its request.
	outsider := open(3)
	var follower string
	require.Eventually(t, func() bool {
		for i, l := range logs {
			if id, _ := l.Leader(); id >= 0 && !l.IsLeader() {
				follower = addrs[i]
				return true
			}
		}
		return false
	}, 10*time.Second, 5*time.Millisecond)
	res, err := outsider.SubmitVia(ctx, follower, Command{Op: OpJoin, Epoch: 1, From: 0, URL: urlOf(3), Addr: addrs[3]})
	require.NoError(t, err)
	require.True(t, res.Accepted, res.String())
	require.Equal(t, 3, res.Node)
	res, err = outsider.SubmitVia(ctx, follower, Command{Op: OpJoin, Epoch: 1, From: 0, URL: urlOf(4)})
	require.NoError(t, err)
	require.False(t, res.Accepted)
	require.Contains(t, res.Reason, "the map moved on")
}

// gauges gathers reg's single-value metrics by name.
func gauges(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		m := mf.GetMetric()[0]
		switch {
		case m.GetGauge() != nil:
			out[mf.GetName()] = m.GetGauge().GetValue()
		case m.GetCounter() != nil:
			out[mf.GetName()] = m.GetCounter().GetValue()
		}
	}
	return out
}

// The log's instruments tell a healthy group of three: one leader, three
// voters everywhere, every replica applied the last entry and heard from
// the leader just now; refused connections are counted, and warned of
// once per interval however many come.
func TestLogMetrics(t *testing.T) {
	o := fastOptions()
	var warnings atomic.Int64
	counting := slog.New(countingHandler{n: &warnings})
	var nets []*Network
	var servers []Server
	for i := range 3 {
		n, err := Listen("127.0.0.1:0", Auth{Secret: "right"}, o, counting)
		require.NoError(t, err)
		nets = append(nets, n)
		servers = append(servers, Server{ID: i, Addr: n.Addr().String()})
	}
	var logs []*Log
	var regs []*prometheus.Registry
	for i, n := range nets {
		l, err := Open(vfs.NewMem(), "log", i, NewTCPTransport(n, quiet), n, o, quiet)
		require.NoError(t, err)
		require.NoError(t, l.Start())
		n.Start()
		t.Cleanup(func() { require.NoError(t, l.Close()) })
		require.NoError(t, l.Bootstrap(servers))
		reg := prometheus.NewRegistry()
		l.Register(reg)
		logs, regs = append(logs, l), append(regs, reg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m, err := clustermap.Seed([]string{urlOf(0), urlOf(1), urlOf(2)}, 3)
	require.NoError(t, err)
	res, err := logs[0].Submit(ctx, Command{Op: OpSeed, Map: m})
	require.NoError(t, err)
	require.True(t, res.Accepted)
	require.Eventually(t, func() bool {
		leaders := 0.0
		for _, reg := range regs {
			g := gauges(t, reg)
			if g["dhtkv_maplog_voters"] != 3 || g["dhtkv_maplog_applied_index"] < float64(res.Index) ||
				g["dhtkv_maplog_last_contact_seconds"] < 0 || g["dhtkv_maplog_last_contact_seconds"] > 1 ||
				g["dhtkv_maplog_unreachable_peers"] != 0 {
				return false
			}
			leaders += g["dhtkv_maplog_leader"]
		}
		return leaders == 1
	}, 10*time.Second, 10*time.Millisecond)

	wrong, err := Listen("127.0.0.1:0", Auth{Secret: "wrong"}, o, quiet)
	require.NoError(t, err)
	defer wrong.Close()
	for range 5 {
		_, err := wrong.Dial(raftAddr(nets[0].Addr().String()), time.Second)
		require.Error(t, err)
	}
	require.Eventually(t, func() bool { return gauges(t, regs[0])["dhtkv_maplog_refused_connections_total"] == 5 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, int64(1), warnings.Load(), "one warning for five refusals within the interval")
}

// countingHandler counts the warnings of refused connections.
type countingHandler struct{ n *atomic.Int64 }

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn && strings.Contains(r.Message, "connection refused") {
		h.n.Add(1)
	}
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }

// A member cut from the leader alone (both still reach the third) gets
// its commands to the leader through the third member, which relays
// them (Command.Relay): a link cut between two nodes must not keep a
// member's acknowledgement, and with it every change, from the log.
func TestSubmitRelaysAroundACutLink(t *testing.T) {
	o := fastOptions()
	mn := &memNet{lns: map[string]net.Listener{}, cut: map[[2]string]bool{}}
	addrs := []string{"mem0:1", "mem1:1", "mem2:1"}
	var servers []Server
	for i := range 3 {
		servers = append(servers, Server{ID: i, Addr: addrs[i]})
	}
	var logs []*Log
	for i := range 3 {
		n := NewNetwork(mn.listen(addrs[i]), addrs[i], mn.dialer(addrs[i]), Auth{Secret: "s3cret"}, o, quiet)
		l, err := Open(vfs.NewMem(), "log", i, NewTCPTransport(n, quiet), n, o, quiet)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, l.Close()) })
		require.NoError(t, l.Start())
		n.Start()
		require.NoError(t, l.Bootstrap(servers))
		logs = append(logs, l)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seedLog(t, ctx, logs[0], urlOf(0), urlOf(1), urlOf(2))
	leader := -1
	require.Eventually(t, func() bool {
		for i, l := range logs {
			if l.IsLeader() {
				leader = i
				return true
			}
		}
		return false
	}, 10*time.Second, 5*time.Millisecond)
	follower := (leader + 1) % 3
	mn.setCut(addrs[follower], true, addrs[leader])
	for _, l := range logs {
		if l == logs[follower] {
			continue
		}
		res, err := l.Ack(ctx, 1)
		require.NoError(t, err)
		require.True(t, res.Accepted, res.String())
	}
	res, err := logs[follower].Ack(ctx, 1)
	require.NoError(t, err, "the cut member's acknowledgement, relayed")
	require.True(t, res.Accepted, res.String())
	require.Eventually(t, func() bool { return logs[leader].State().Acks[follower] == 1 }, 10*time.Second, 5*time.Millisecond)
	require.True(t, logs[leader].IsLeader(), "the cut member did not depose the leader")
}

// memGroup is a group of n logs over memNet, bootstrapped with the first
// size of them, the nodes' URLs http://memI:1 and their log addresses
// the URLs' host:port (Options.AddrFromURL, as the node runs it).
func memGroup(t *testing.T, mn *memNet, o Options, size, n int) ([]*Log, []string) {
	t.Helper()
	o.AddrFromURL = true
	var addrs []string
	var servers []Server
	for i := range n {
		addrs = append(addrs, fmt.Sprintf("mem%d:1", i))
		if i < size {
			servers = append(servers, Server{ID: i, Addr: addrs[i]})
		}
	}
	var logs []*Log
	for i := range n {
		nw := NewNetwork(mn.listen(addrs[i]), addrs[i], mn.dialer(addrs[i]), Auth{Secret: "s3cret"}, o, quiet)
		l, err := Open(vfs.NewMem(), "log", i, NewTCPTransport(nw, quiet), nw, o, quiet)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, l.Close()) })
		require.NoError(t, l.Start())
		nw.Start()
		if i < size {
			require.NoError(t, l.Bootstrap(servers))
		}
		logs = append(logs, l)
	}
	return logs, addrs
}

func memURL(i int) string { return fmt.Sprintf("http://mem%d:1", i) }

// awaitLeader waits until one of logs leads, and returns its index.
func awaitLeader(t *testing.T, logs []*Log) int {
	t.Helper()
	leader := -1
	require.Eventually(t, func() bool {
		for i, l := range logs {
			if l.IsLeader() {
				leader = i
				return true
			}
		}
		return false
	}, 10*time.Second, 5*time.Millisecond)
	return leader
}

// A member that asked while it knew no leader goes through the other
// members as relays; when the one relay left is cut off from it and it
// then learns of a leader it reaches, it must go to that leader directly
// (after the last relay, the leader again), not try the cut relay
// forever: the cause of TestNetworkInMemory's seed never answered.
func TestSubmitGoesToTheLeaderAfterTheRelays(t *testing.T) {
	o := fastOptions()
	mn := &memNet{lns: map[string]net.Listener{}, cut: map[[2]string]bool{}}
	mn.setCut("mem0:1", true, "mem1:1", "mem2:1")
	logs, addrs := memGroup(t, mn, o, 3, 3)
	leader := awaitLeader(t, logs[1:]) + 1
	other := 3 - leader // the member neither 0 nor the leader
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := seedLog(t, ctx, logs[leader], memURL(0), memURL(1), memURL(2))
	logs[0].SetPeers(m)
	require.Equal(t, -1, func() int { id, _ := logs[0].Leader(); return id }(), "cut off from every member: no leader known")

	done := make(chan error, 1)
	go func() {
		res, err := logs[0].Ack(ctx, 1)
		if err == nil && !res.Accepted {
			err = fmt.Errorf("refused: %s", res.Reason)
		}
		done <- err
	}()
	// Heal the link to the leader once the submitter went through the
	// relays (each refused by the cut link) at least once.
	before := mn.refusals(addrs[0], addrs[other])
	require.Eventually(t, func() bool {
		return mn.refusals(addrs[0], addrs[other]) > before && mn.refusals(addrs[0], addrs[leader]) > 0
	}, 10*time.Second, time.Millisecond)
	mn.setCut(addrs[0], false, addrs[leader])
	require.Eventually(t, func() bool { id, _ := logs[0].Leader(); return id == leader }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, <-done, "acknowledged through the leader, with %s still cut off", addrs[other])
	require.Equal(t, uint64(1), logs[leader].State().Acks[0])
	// After the last relay, nextRelay starts over from the leader.
	require.Equal(t, "", logs[0].nextRelay(addrs[other], leader))
	require.Equal(t, addrs[other], logs[0].nextRelay("", leader))
}

// A node added to the group while cut off from the leader has neither
// the configuration nor a map in its replica, and knows no leader: the
// members of the map it installed (SetPeers) route its acknowledgement
// to the leader.
func TestSubmitThroughTheInstalledMapsMembers(t *testing.T) {
	o := fastOptions()
	mn := &memNet{lns: map[string]net.Listener{}, cut: map[[2]string]bool{}}
	logs, addrs := memGroup(t, mn, o, 3, 4)
	leader := awaitLeader(t, logs[:3])
	mn.setCut(addrs[3], true, addrs[leader])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seedLog(t, ctx, logs[leader], memURL(0), memURL(1), memURL(2))
	for _, l := range logs[:3] {
		res, err := l.Ack(ctx, 1)
		require.NoError(t, err)
		require.True(t, res.Accepted, res.String())
	}
	res, err := logs[leader].Submit(ctx, Command{Op: OpJoin, Epoch: 1, From: leader, URL: memURL(3)})
	require.NoError(t, err)
	require.True(t, res.Accepted, res.String())
	require.Equal(t, 3, res.Node)
	joined := res.Map

	short, cancelShort := context.WithTimeout(ctx, time.Second)
	_, err = logs[3].Ack(short, joined.Epoch)
	cancelShort()
	require.ErrorIs(t, err, context.DeadlineExceeded, "no leader, no configuration, no peers: no route")
	require.Nil(t, logs[3].Map())

	logs[3].SetPeers(joined)
	res, err = logs[3].Ack(ctx, joined.Epoch)
	require.NoError(t, err)
	require.True(t, res.Accepted, res.String())
	require.Eventually(t, func() bool { return logs[leader].State().Acks[3] == joined.Epoch }, 10*time.Second, 5*time.Millisecond)
}

// answerLost is a member's Network whose first forward to lost reaches
// it (the leader applies the command) but whose answer is lost on the
// way back: a link cut between the two while the leader answers.
type answerLost struct {
	*Network
	lost    string
	dropped atomic.Bool
}

func (a *answerLost) Forward(ctx context.Context, addr string, cmd []byte) ([]byte, error) {
	out, err := a.Network.Forward(ctx, addr, cmd)
	if err == nil && addr == a.lost && a.dropped.CompareAndSwap(false, true) {
		return nil, errors.New("connection reset (the answer was lost)")
	}
	return out, err
}

// A change whose answer from the leader is lost is sent again through
// another member (the relay, Command.Relay) with the first attempt's
// request id: the log answers it with the first attempt's outcome,
// accepted, not "the map moved on" for a change it applied.
func TestSubmitRelayKeepsTheRequestID(t *testing.T) {
	o := fastOptions()
	mn := &memNet{lns: map[string]net.Listener{}, cut: map[[2]string]bool{}}
	logs, _ := memGroup(t, mn, o, 3, 3)
	leader := awaitLeader(t, logs)
	from := (leader + 1) % 3
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seedLog(t, ctx, logs[leader], memURL(0), memURL(1), memURL(2))
	ackEvery(t, ctx, logs, 1)
	require.Eventually(t, func() bool {
		id, _ := logs[from].Leader()
		return id == leader && logs[from].State().Map != nil
	}, 10*time.Second, 5*time.Millisecond)
	_, leaderAddr := logs[from].Leader()
	logs[from].fwd = &answerLost{Network: logs[from].fwd.(*Network), lost: leaderAddr}

	res, err := logs[from].Submit(ctx, Command{Op: OpJoin, Epoch: 1, From: from, URL: memURL(7)})
	require.NoError(t, err)
	st := logs[leader].State()
	require.NotNil(t, st.Map.ByURL(memURL(7)), "the log applied the join")
	require.True(t, res.Accepted, "the log applied the join, and its requester is told: %s", res.String())
	require.Equal(t, st.Current.Node, res.Node)
	require.NotEmpty(t, st.Current.ID)
}

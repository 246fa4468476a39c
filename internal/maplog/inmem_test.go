package maplog

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/dhtkv/dhtkv/internal/clustermap"
)

// memNet is in-memory listeners by address, and links between them that
// a test cuts: the shape of the in-memory test cluster's network.
type memNet struct {
	mu  sync.Mutex
	lns map[string]*fasthttputil.InmemoryListener
	cut map[[2]string]bool // [from, to]
}

func (m *memNet) listen(addr string) net.Listener {
	m.mu.Lock()
	defer m.mu.Unlock()
	ln := fasthttputil.NewInmemoryListener()
	m.lns[addr] = ln
	return ln
}

func (m *memNet) dialer(from string) Dialer {
	return func(addr string, _ time.Duration) (net.Conn, error) {
		m.mu.Lock()
		ln, cut := m.lns[addr], m.cut[[2]string{from, addr}]
		m.mu.Unlock()
		if ln == nil || cut {
			return nil, fmt.Errorf("no route from %s to %s", from, addr)
		}
		return ln.Dial()
	}
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
	mn := &memNet{lns: map[string]*fasthttputil.InmemoryListener{}, cut: map[[2]string]bool{}}
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
	m, err := clustermap.Seed([]string{urlOf(0), urlOf(1), urlOf(2)}, 3)
	require.NoError(t, err)
	res, err := logs[0].Submit(ctx, Command{Op: OpSeed, Map: m})
	require.NoError(t, err)
	require.True(t, res.Accepted, res.String())
	require.Eventually(t, func() bool { return logs[1].Map() != nil }, 10*time.Second, 5*time.Millisecond)
	require.Nil(t, logs[2].Map(), "cut off: the seed does not reach it")

	mn.setCut(addrs[2], false, addrs[0], addrs[1])
	require.Eventually(t, func() bool { return logs[2].Map() != nil }, 10*time.Second, 5*time.Millisecond, "healed: it does")
	for _, l := range logs {
		res, err := l.Ack(ctx, 1)
		require.NoError(t, err)
		require.True(t, res.Accepted, res.String())
	}

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
	res, err = outsider.SubmitVia(ctx, follower, Command{Op: OpJoin, Epoch: 1, From: 0, URL: urlOf(3), Addr: addrs[3]})
	require.NoError(t, err)
	require.True(t, res.Accepted, res.String())
	require.Equal(t, 3, res.Node)
	res, err = outsider.SubmitVia(ctx, follower, Command{Op: OpJoin, Epoch: 1, From: 0, URL: urlOf(4)})
	require.NoError(t, err)
	require.False(t, res.Accepted)
	require.Contains(t, res.Reason, "the map moved on")
}

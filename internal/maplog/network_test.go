package maplog

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/testpki"
	"github.com/dhtkv/dhtkv/internal/tlsconf"
)

func listen(t *testing.T, auth Auth, o Options) *Network {
	t.Helper()
	n, err := Listen("127.0.0.1:0", auth, o, quiet)
	require.NoError(t, err)
	n.Start()
	return n
}

// A group of three over TCP with a cluster secret: a change asked of a
// follower is forwarded to the leader over the authenticated stream and
// answered with its real outcome.
func TestNetworkGroup(t *testing.T) {
	o := fastOptions()
	auth := Auth{Secret: "s3cret"}
	var nets []*Network
	var servers []Server
	for i := range 3 {
		n := listen(t, auth, o)
		nets = append(nets, n)
		servers = append(servers, Server{ID: i, Addr: n.Addr().String()})
	}
	var logs []*Log
	for i, n := range nets {
		l, err := Open(vfs.NewMem(), "log", i, NewTCPTransport(n, quiet), n, o, quiet)
		require.NoError(t, err)
		require.NoError(t, l.Start())
		t.Cleanup(func() { require.NoError(t, l.Close()) })
		logs = append(logs, l)
	}
	for _, l := range logs {
		require.NoError(t, l.Bootstrap(servers))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	seedLog(t, ctx, logs[1], urlOf(0), urlOf(1), urlOf(2))
	ackEvery(t, ctx, logs, 1)
	var follower *Log
	require.Eventually(t, func() bool {
		for _, l := range logs {
			if id, _ := l.Leader(); id >= 0 && !l.IsLeader() {
				follower = l
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond)
	res, err := follower.Submit(ctx, Command{Op: OpJoin, Epoch: 1, From: 0, URL: "http://127.0.0.1:9400"})
	require.NoError(t, err)
	require.True(t, res.Accepted, res.String())
	require.Equal(t, 3, res.Node)
	res, err = follower.Submit(ctx, Command{Op: OpJoin, Epoch: 1, From: 0, URL: "http://127.0.0.1:9401"})
	require.NoError(t, err)
	require.False(t, res.Accepted, "made from the same map")
	require.Contains(t, res.Reason, "the map moved on")
	for _, n := range nets {
		require.Zero(t, n.Refused())
	}
}

// Connections that do not authenticate are refused, both ways, before
// raft or a proposal sees them: a wrong secret, another protocol, a peer
// that says nothing (closed after the handshake timeout), and more
// connections handshaking than the bound.
func TestNetworkRefuses(t *testing.T) {
	o := fastOptions()
	o.HandshakeTimeout = 300 * time.Millisecond
	o.MaxPending = 2
	srv := listen(t, Auth{Secret: "right"}, o)
	defer srv.Close()
	addr := srv.Addr().String()

	wrong := listen(t, Auth{Secret: "wrong"}, o)
	defer wrong.Close()
	_, err := wrong.Dial(raftAddr(addr), time.Second)
	require.Error(t, err)
	_, err = wrong.Forward(context.Background(), addr, []byte(`{"op":"ack"}`))
	require.Error(t, err)
	require.Eventually(t, func() bool { return srv.Refused() == 2 }, 5*time.Second, 5*time.Millisecond)

	// The client side refuses a server without the secret too.
	_, err = srv.Dial(raftAddr(wrong.Addr().String()), time.Second)
	require.ErrorContains(t, err, "does not hold the cluster secret")

	// Another protocol.
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	_, err = c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	require.NoError(t, err)
	requireClosed(t, c)

	// Silence: held until the handshake timeout, with the others.
	held := make([]net.Conn, 0, 3)
	for range 3 {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		held = append(held, c)
	}
	// The third is over MaxPending and closed at once; the first two at
	// the timeout.
	for _, c := range held {
		requireClosed(t, c)
	}

	// A right secret still gets in.
	right := listen(t, Auth{Secret: "right"}, o)
	defer right.Close()
	conn, err := right.Dial(raftAddr(addr), time.Second)
	require.NoError(t, err)
	require.NoError(t, conn.Close())
	got, err := srv.Accept()
	require.NoError(t, err)
	require.NoError(t, got.Close())
}

// Under mutual TLS a peer needs a certificate of the cluster's CA.
func TestNetworkMutualTLS(t *testing.T) {
	ca := testpki.NewCA(t, "cluster")
	other := testpki.NewCA(t, "other")
	certs := func(ca *testpki.CA, name string) *tlsconf.Certs {
		cert, key, _ := ca.Issue(name)
		c, err := tlsconf.Load(tlsconf.Files{Cert: cert, Key: key, PeerCA: ca.File})
		require.NoError(t, err)
		return c
	}
	o := fastOptions()
	srv := listen(t, Auth{TLS: certs(ca, "a")}, o)
	defer srv.Close()
	member := listen(t, Auth{TLS: certs(ca, "b")}, o)
	defer member.Close()
	stranger := listen(t, Auth{TLS: certs(other, "c")}, o)
	defer stranger.Close()

	conn, err := member.Dial(raftAddr(srv.Addr().String()), time.Second)
	require.NoError(t, err)
	_, isTLS := conn.(*tracked).Conn.(*tls.Conn)
	require.True(t, isTLS)
	require.NoError(t, conn.Close())
	got, err := srv.Accept()
	require.NoError(t, err)
	require.NoError(t, got.Close())

	_, err = stranger.Dial(raftAddr(srv.Addr().String()), time.Second)
	require.Error(t, err)
	require.Eventually(t, func() bool { return srv.Refused() == 1 }, 5*time.Second, 5*time.Millisecond)
}

func raftAddr(s string) raft.ServerAddress { return raft.ServerAddress(s) }

// requireClosed waits until the server closes c.
func requireClosed(t *testing.T, c net.Conn) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err := io.ReadAll(c)
	require.NoError(t, err, "closed by the server, not timed out")
	require.NoError(t, c.Close())
}

// A proposal forwarded to a member that accepts connections and never
// answers (a hung process) ends when its caller's context does, not at
// the handshake's timeout: a node stopping its seeding, or an operator's
// request cut, does not wait it out. Raft's own dials end at Interrupt.
func TestForwardEndsWithItsContext(t *testing.T) {
	o := fastOptions()
	o.HandshakeTimeout = time.Minute
	n := listen(t, Auth{Secret: "s"}, o)
	defer n.Close()
	hung, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer hung.Close()
	go func() {
		for {
			c, err := hung.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered, until the test ends
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = n.Forward(ctx, hung.Addr().String(), []byte(`{"op":"ack"}`))
	require.Error(t, err)
	require.Less(t, time.Since(start), 20*time.Second, "ended with its context, not the minute's handshake timeout")

	done := make(chan error, 1)
	go func() {
		_, err := n.Dial(raftAddr(hung.Addr().String()), time.Minute)
		done <- err
	}()
	time.Sleep(100 * time.Millisecond) // the behaviour under test: a dial under way when the node stops
	n.Interrupt()
	select {
	case err := <-done:
		require.Error(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("raft's dial outlived Interrupt")
	}
}

// seedLog seeds the map of urls at factor 3 through l, and returns it.
func seedLog(t *testing.T, ctx context.Context, l *Log, urls ...string) *clustermap.Map {
	t.Helper()
	m, err := clustermap.Seed(urls, 3)
	require.NoError(t, err)
	res, err := l.Submit(ctx, Command{Op: OpSeed, Map: m})
	require.NoError(t, err)
	require.True(t, res.Accepted, res.String())
	return m
}

// ackEvery has every log report that its node installed epoch.
func ackEvery(t *testing.T, ctx context.Context, logs []*Log, epoch uint64) {
	t.Helper()
	for _, l := range logs {
		res, err := l.Ack(ctx, epoch)
		require.NoError(t, err)
		require.True(t, res.Accepted, res.String())
	}
}

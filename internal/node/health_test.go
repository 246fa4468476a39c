package node_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// probe GETs an admin path and returns the status and body ("" and 0 when
// the listener does not answer).
func probe(adminAddr, path string) (int, string) {
	resp, err := http.Get("http://" + adminAddr + path)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func withAdmin(_ int, c *node.Config) { c.AdminListen = "127.0.0.1:0" }

// A serving node is alive and ready; only GET and HEAD are answered; once
// shut down it is neither.
func TestLiveAndReady(t *testing.T) {
	c, _ := testcluster.Single(t, withAdmin)
	n := c.Node(0)
	admin := n.AdminAddr()
	for _, path := range []string{"/livez", "/readyz"} {
		code, body := probe(admin, path)
		assert.Equal(t, http.StatusOK, code, path)
		assert.Equal(t, "ok\n", body, path)
		resp, err := http.Head("http://" + admin + path)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode, "HEAD %s", path)
		resp, err = http.Post("http://"+admin+path, "text/plain", nil)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, "POST %s", path)
	}
	require.NoError(t, n.Ready())
}

// Ready says so once shutdown began, and the admin listener is gone once
// it ended, its goroutines with it.
func TestNotReadyOnceStopped(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	cfg := node.DefaultConfig()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.DataDir = t.TempDir()
	cfg.Logger = slog.New(slog.DiscardHandler)
	n, err := node.Start(cfg)
	require.NoError(t, err)
	admin := n.AdminAddr()
	code, _ := probe(admin, "/readyz")
	require.Equal(t, http.StatusOK, code)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, n.Shutdown(ctx))
	require.ErrorIs(t, n.Ready(), node.ErrStopping)
	code, _ = probe(admin, "/readyz")
	require.Zero(t, code, "the admin listener closed")
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	// fasthttp's worker pool cleaner sleeps out its idle period (10 s)
	// after the server stopped before it exits; it cannot be woken.
	goleak.VerifyNone(t, ignore, goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"))
}

// A node that lost its disk rebuilds before serving reads, and cannot
// finish while a peer is down: it is alive but not ready (503, the reason
// in the body), /v0/status?verbose says rebuilding, and once the peer is
// back and the rebuild done it is ready.
func TestNotReadyWhileRebuilding(t *testing.T) {
	const a, b, down = 0, 1, 2
	c := testcluster.Start(t, 3, withAdmin)
	cl := testcluster.NewClient(t)
	require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(a), "k", []byte("v"), 3, 3))
	for i := range 3 { // the cluster has run long enough to know it exists
		require.Eventually(t, func() bool { return formed(c.URL(i)) }, 10*time.Second, 20*time.Millisecond, "node %d formed", i)
	}
	c.StopNode(b)
	c.WipeNode(b)
	c.StopNode(down)
	c.StartNode(b)

	admin := c.Node(b).AdminAddr()
	code, body := probe(admin, "/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Equal(t, node.ErrRebuilding.Error()+"\n", body)
	code, _ = probe(admin, "/livez")
	assert.Equal(t, http.StatusOK, code, "alive while rebuilding")
	st := status(t, c.URL(b))
	assert.True(t, st.Rebuilding)
	assert.Contains(t, st.Warnings, node.ErrRebuilding.Error())

	c.StartNode(down)
	require.Eventually(t, func() bool {
		code, _ := probe(admin, "/readyz")
		return code == http.StatusOK
	}, 20*time.Second, 20*time.Millisecond, "ready once the rebuild is done")
	assert.False(t, status(t, c.URL(b)).Rebuilding)
}

// status reads base's /v0/status?verbose through the client.
func status(t *testing.T, base string) *client.Status {
	t.Helper()
	st, err := fetchStatus(base)
	require.NoError(t, err)
	return st
}

func formed(base string) bool {
	st, err := fetchStatus(base)
	return err == nil && st.ClusterFormed
}

func fetchStatus(base string) (*client.Status, error) {
	c, err := client.New(client.Config{Endpoints: []string{base}})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.Status(ctx, base)
}

// A node that cannot reach a majority of some partition's replicas is not
// ready, and says so in its status, while every request at the default
// ack would fail; with one peer of two back it is ready again. (The
// issue: with 2 of 3 peers down /v0/status said OK and /readyz 200 while
// every PUT and GET answered 504.)
func TestNotReadyWithoutQuorum(t *testing.T) {
	const a, b, c3 = 0, 1, 2
	c := testcluster.Start(t, 3, withAdmin)
	admin := c.Node(a).AdminAddr()
	require.Eventually(t, func() bool {
		code, _ := probe(admin, "/readyz")
		return code == http.StatusOK
	}, 10*time.Second, 20*time.Millisecond, "ready once its peers answered a probe")
	// Ready comes with a majority of replicas reachable; the clock's lease
	// (writes with ack of 2 or more) needs a probe round that measured a
	// majority of the peers, which may be the next round: until then the
	// status warns of it.
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		st, err := fetchStatus(c.URL(a))
		if assert.NoError(ct, err) {
			assert.Empty(ct, st.Warnings)
		}
	}, 10*time.Second, 20*time.Millisecond, "no warning once a probe round measured every peer")

	c.StopNode(b)
	code, _ := probe(admin, "/readyz")
	assert.Equal(t, http.StatusOK, code, "one replica of three down leaves a majority")
	c.StopNode(c3)
	require.Eventually(t, func() bool {
		return errors.Is(c.Node(a).Ready(), node.ErrNoQuorum)
	}, 10*time.Second, 20*time.Millisecond, "not ready once the probe finds both peers down")
	code, body := probe(admin, "/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body, "4096 of 4096 partitions have fewer than 2 of their 3 replicas reachable from here")
	assert.Contains(t, body, c.URL(b))
	warnings := strings.Join(status(t, c.URL(a)).Warnings, "\n")
	assert.Contains(t, warnings, "no quorum: 4096 of 4096 partitions")
	cl := testcluster.NewClient(t)
	assert.Equal(t, http.StatusGatewayTimeout, cl.Put(t, c.URL(a), "k", []byte("v"), 2, 3), "what readiness predicts")

	c.StartNode(b)
	require.Eventually(t, func() bool { return c.Node(a).Ready() == nil }, 20*time.Second, 20*time.Millisecond,
		"ready again with one peer back")
}

// The admin listener takes the node's --admin-* settings: an idle
// keep-alive connection is closed after --admin-idle-timeout, a profile
// longer than --admin-max-profile is refused, and a connection beyond
// --admin-max-connections is answered 503 and closed until one of those
// open closes.
func TestAdminPortBounds(t *testing.T) {
	const idle = 300 * time.Millisecond
	c, _ := testcluster.Single(t, func(_ int, cfg *node.Config) {
		cfg.AdminListen = "127.0.0.1:0"
		cfg.Admin.IdleTimeout, cfg.Admin.MaxProfile, cfg.Admin.MaxConnections = idle, 2*time.Second, 2
	})
	admin := c.Node(0).AdminAddr()
	code, body := probe(admin, "/debug/pprof/profile?seconds=3")
	require.Equal(t, http.StatusBadRequest, code)
	require.Equal(t, "seconds=3: longer than --admin-max-profile 2s; ask for at most 2 seconds\n", body)

	conn, err := net.Dial("tcp", admin)
	require.NoError(t, err)
	defer conn.Close()
	_, err = io.WriteString(conn, "GET /livez HTTP/1.1\r\nHost: admin\r\n\r\n")
	require.NoError(t, err)
	r := bufio.NewReader(conn)
	resp, err := http.ReadResponse(r, nil)
	require.NoError(t, err)
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	start := time.Now()
	require.NoError(t, conn.SetReadDeadline(start.Add(5*time.Second)))
	_, err = r.ReadByte()
	require.ErrorIs(t, err, io.EOF, "closed by the server, before the deadline")
	require.GreaterOrEqual(t, time.Since(start), idle/3, "after the idle timeout, not at once (its clock started before this read)")

	// Two connections held open (each sends half a request line); the
	// third is refused, and taken once one of the two closes. The
	// connections of the requests above close first (idle timeout).
	http.DefaultClient.CloseIdleConnections()
	require.Eventually(t, func() bool { return c.Metric(t, 0, "dhtkv_admin_connections_open") == 0 }, 5*time.Second, 5*time.Millisecond)
	held := make([]net.Conn, 2)
	for i := range held {
		held[i], err = net.Dial("tcp", admin)
		require.NoError(t, err)
		defer held[i].Close()
		_, err = io.WriteString(held[i], "GET /liv")
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return c.Metric(t, 0, "dhtkv_admin_connections_open") == 2 }, 5*time.Second, 5*time.Millisecond)
	third, err := net.Dial("tcp", admin)
	require.NoError(t, err)
	defer third.Close()
	require.NoError(t, third.SetReadDeadline(time.Now().Add(5*time.Second)))
	answer, err := io.ReadAll(third)
	require.NoError(t, err)
	require.Contains(t, string(answer), "HTTP/1.1 503 Service Unavailable")
	require.Contains(t, string(answer), "too many connections to this node's admin port (--admin-max-connections)")
	require.Equal(t, 1.0, c.Metric(t, 0, "dhtkv_admin_connections_refused_total", "reason", "max_connections"))
	require.NoError(t, held[0].Close())
	require.Eventually(t, func() bool {
		code, _ := probe(admin, "/livez")
		return code == http.StatusOK
	}, 5*time.Second, 5*time.Millisecond, "served again once a connection closed")
}

// One address holding the admin port's connections open (its probes and
// /metrics take no token) could take every slot, and the kubelet's
// liveness probe from another address then got 503 and restarted the
// pod. One address may hold three quarters of --admin-max-connections:
// its next connection is refused with 429, and another address is
// still served.
func TestAdminPortKeepsSlotsForOtherAddresses(t *testing.T) {
	c, _ := testcluster.Single(t, func(_ int, cfg *node.Config) {
		cfg.AdminListen = "127.0.0.1:0"
		cfg.Admin.MaxConnections = 4 // three from one address
	})
	admin := c.Node(0).AdminAddr()
	from := func(ip string) (net.Conn, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		return d.Dial("tcp", admin)
	}
	for range 3 {
		conn, err := from("127.0.0.1")
		require.NoError(t, err)
		defer conn.Close()
		_, err = io.WriteString(conn, "GET /liv") // held open, half a request line
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return c.Metric(t, 0, "dhtkv_admin_connections_open") == 3 }, 5*time.Second, 5*time.Millisecond)
	fourth, err := from("127.0.0.1")
	require.NoError(t, err)
	defer fourth.Close()
	require.NoError(t, fourth.SetReadDeadline(time.Now().Add(5*time.Second)))
	answer, err := io.ReadAll(fourth)
	require.NoError(t, err)
	require.Contains(t, string(answer), "HTTP/1.1 429 Too Many Requests")
	require.Contains(t, string(answer), "too many connections from your address to this node's admin port")
	require.Equal(t, 1.0, c.Metric(t, 0, "dhtkv_admin_connections_refused_total", "reason", "max_connections_per_ip"))

	other, err := from("127.0.0.2") // the kubelet's probe, from elsewhere
	require.NoError(t, err)
	defer other.Close()
	_, err = io.WriteString(other, "GET /livez HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n")
	require.NoError(t, err)
	require.NoError(t, other.SetReadDeadline(time.Now().Add(5*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(other), nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

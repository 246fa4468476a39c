package node_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/leakcheck"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// dialFrom connects to addr from the local address from (nil: any); the
// connection is closed at the end of the test.
func dialFrom(t *testing.T, addr string, from net.IP) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if from != nil {
		d.LocalAddr = &net.TCPAddr{IP: from}
	}
	c, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	return c
}

// heldConn is a keep-alive connection that was served once, so the node
// has certainly accepted and counted it.
func heldConn(t *testing.T, addr string, from net.IP) net.Conn {
	t.Helper()
	c := dialFrom(t, addr, from)
	_, err := io.WriteString(c, "GET /v0/status HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode)
	return c
}

// refusedConn dials and reads what the node answers without being asked:
// a refused connection gets one response and EOF.
func refusedConn(t *testing.T, addr string, from net.IP) string {
	t.Helper()
	c := dialFrom(t, addr, from)
	defer c.Close()
	b, err := io.ReadAll(c)
	require.NoError(t, err, "a refused connection is answered and closed")
	return string(b)
}

// A node at --max-connections refuses new connections with a one-line
// 503 and closes them, and takes clients again as soon as connections
// close, round after round: it never stops accepting.
func TestMaxConnections(t *testing.T) {
	leakcheck.Register(t)
	const capacity = 8
	c := testcluster.Start(t, 1, func(_ int, cfg *node.Config) { cfg.MaxConnections = capacity })
	addr := strings.TrimPrefix(c.URL(0), "http://")
	for round := range 3 {
		held := make([]net.Conn, capacity)
		for i := range held {
			held[i] = heldConn(t, addr, nil)
		}
		for range 3 * capacity {
			got := refusedConn(t, addr, nil)
			require.Regexp(t, `^HTTP/1.1 503 Service Unavailable\r\n`, got, "round %d", round)
			require.Contains(t, got, "\r\n\r\ntoo many connections to this node (--max-connections)\n")
		}
		// The refusal is written at accept, before net/http sends its
		// request: it may see the 503 or only the closed connection.
		require.Contains(t, []int{0, 503}, testcluster.Status(c.URL(0)), "a normal client is refused too while the node is full")
		for _, h := range held {
			require.NoError(t, h.Close())
		}
		require.Eventually(t, func() bool { return testcluster.Status(c.URL(0)) == 200 }, 10*time.Second, 10*time.Millisecond,
			"round %d: the node serves again once the connections closed", round)
		// The node sees the closes one by one: the next round starts
		// once it has seen them all.
		require.Eventually(t, func() bool { return c.Metric(t, 0, "dhtkv_connections_open") == 0 }, 10*time.Second, 10*time.Millisecond)
	}
	// 3 rounds of 3×capacity raw connections and one client each.
	require.GreaterOrEqual(t, c.Metric(t, 0, "dhtkv_connections_refused_total", "reason", "max_connections"), float64(3*(3*capacity+1)))
}

// --max-connections-per-ip refuses one address's excess with 429 and
// leaves other addresses alone.
func TestMaxConnectionsPerIP(t *testing.T) {
	leakcheck.Register(t)
	const perIP = 4
	c := testcluster.Start(t, 1, func(_ int, cfg *node.Config) { cfg.MaxConnectionsPerIP = perIP })
	addr := strings.TrimPrefix(c.URL(0), "http://")
	one, two := net.IPv4(127, 0, 0, 1), net.IPv4(127, 0, 0, 2)
	held := make([]net.Conn, perIP)
	for i := range held {
		held[i] = heldConn(t, addr, one)
	}
	got := refusedConn(t, addr, one)
	require.Regexp(t, `^HTTP/1.1 429 Too Many Requests\r\n`, got)
	require.Contains(t, got, "too many connections from your address (--max-connections-per-ip)\n")
	for range perIP {
		heldConn(t, addr, two) // another address has its own allowance
	}
	require.NoError(t, held[0].Close())
	require.Eventually(t, func() bool {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: one}}
		conn, err := d.Dial("tcp", addr)
		if err != nil {
			return false
		}
		defer conn.Close()
		_, _ = io.WriteString(conn, "GET /v0/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		b, _ := io.ReadAll(conn)
		return strings.HasPrefix(string(b), "HTTP/1.1 200 ")
	}, 10*time.Second, 10*time.Millisecond, "a closed connection frees its address's place")
}

package node_test

import (
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/leakcheck"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
	"github.com/dhtkv/dhtkv/internal/testpki"
)

// openConns is the node's dhtkv_connections_open.
func openConns(t *testing.T, n *node.Node) float64 {
	return testcluster.Metric(t, n.Registry(), "dhtkv_connections_open")
}

// overLimit is a PUT whose Content-Length is one byte over a 1000-byte
// --max-value-bytes, without its body.
const overLimit = "PUT /v0/entity?id=k HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\n\r\n"

// After a refusal that leaves the body unread, the node sends its answer
// and FIN at once, then reads what the client still sends: for at most
// --linger-timeout when the client neither sends nor closes, and for at
// most twice the largest body when it keeps sending.
func TestLingeringCloseIsBounded(t *testing.T) {
	leakcheck.Register(t)
	t.Run("by time", func(t *testing.T) {
		const linger = 300 * time.Millisecond
		c, _ := testcluster.Single(t, func(_ int, cfg *node.Config) {
			cfg.MaxValueBytes = 1000
			cfg.LingerTimeout = linger
		})
		n := c.Node(0)
		before := openConns(t, n)
		conn := dialFrom(t, n.Addr(), nil)
		sent := time.Now()
		_, err := io.WriteString(conn, overLimit)
		require.NoError(t, err)
		resp, err := io.ReadAll(conn)
		require.NoError(t, err, "the answer, then the node's FIN (half-close)")
		require.Regexp(t, `^HTTP/1.1 413 `, string(resp))
		require.Eventually(t, func() bool { return openConns(t, n) == before }, 10*time.Second, 5*time.Millisecond,
			"closed once --linger-timeout passed, though the client did not close")
		assert.GreaterOrEqual(t, time.Since(sent), linger, "not closed before: it lingered")
	})
	t.Run("by bytes", func(t *testing.T) {
		c, _ := testcluster.Single(t, func(_ int, cfg *node.Config) {
			cfg.MaxValueBytes = 1000
			cfg.LingerTimeout = time.Minute // far past the test's deadline
		})
		n := c.Node(0)
		before := openConns(t, n)
		conn := dialFrom(t, n.Addr(), nil)
		_, err := io.WriteString(conn, overLimit)
		require.NoError(t, err)
		// The client sends on and on: the node drops at most 2 × (1000 +
		// 1024 + 64) bytes, then closes; the writes then fail.
		wrote := make(chan error, 1)
		go func() {
			chunk := bytes.Repeat([]byte("v"), 64<<10)
			for range 1024 {
				if _, err := conn.Write(chunk); err != nil {
					wrote <- err
					return
				}
			}
			wrote <- nil
		}()
		require.Eventually(t, func() bool { return openConns(t, n) == before }, 10*time.Second, 5*time.Millisecond,
			"closed once the bytes bound was read, long before --linger-timeout")
		require.Error(t, <-wrote, "the node stopped reading")
	})
}

// Under TLS the lingering close works below the TLS layer: a client that
// sends a whole body one byte over the default 16 MiB limit before it
// reads gets the 413.
func TestLingeringCloseWithTLS(t *testing.T) {
	leakcheck.Register(t)
	const limit = 16 << 20
	ca := testpki.NewCA(t, "cluster")
	var files [2]string
	c, _ := testcluster.Single(t, withTLS(ca, &files), func(_ int, cfg *node.Config) { cfg.MaxValueBytes = limit })
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", c.Node(0).Addr(), ca.ClientConfig())
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(20*time.Second)))
	_, err = io.WriteString(conn, "PUT /v0/entity?id=k HTTP/1.1\r\nHost: x\r\nContent-Length: "+strconv.Itoa(limit+1)+"\r\n\r\n")
	require.NoError(t, err)
	_, err = conn.Write(make([]byte, limit+1))
	require.NoError(t, err, "the node reads what the client sends: no reset")
	resp, err := io.ReadAll(conn)
	require.NoError(t, err)
	require.Regexp(t, `^HTTP/1.1 413 `, string(resp))
}

package node

import (
	"io"
	"time"
)

// Lingering close (--linger-timeout).
//
// A connection closed with bytes the node never read makes the kernel
// send a reset instead of a FIN, and a reset discards what the client has
// received but not yet read: a client still sending a body that the node
// refused (413 for a value over --max-value-bytes, 503 over the body
// budget, a malformed request) usually saw "connection reset" instead of
// the answer, and the Go client failed over to another node with the same
// request. The handler that leaves a body unread asks for a lingering
// close (httpapi.LingerCloser); the connection's Close then sends FIN
// after the answer (a half-close: the client reads the answer and its
// end), and reads and drops what the client still sends until it closes
// its side, for at most --linger-timeout and at most twice the largest
// body a request may carry (chunk framing, TLS records), then closes. nginx's lingering_close does the same.
// Nothing lingers while the node shuts down.

// LingerOnClose makes the connection's first Close linger (httpapi).
func (c *limitConn) LingerOnClose() { c.lingering.Store(true) }

// linger half-closes c and drops what its client sends until it closes,
// within the listener's bounds. It runs in the fasthttp worker that
// closes the connection, so a lingering connection holds its worker and
// its place under --max-connections until it is closed.
func (l *limitListener) linger(c *limitConn) {
	if l.lingerTimeout <= 0 || l.lingerBytes <= 0 {
		return
	}
	select {
	case <-l.done: // shutting down
		return
	default:
	}
	hc, ok := c.Conn.(interface{ CloseWrite() error })
	if !ok || hc.CloseWrite() != nil {
		return
	}
	if c.Conn.SetReadDeadline(time.Now().Add(l.lingerTimeout)) != nil {
		return
	}
	_, _ = io.CopyN(io.Discard, c.Conn, l.lingerBytes)
}

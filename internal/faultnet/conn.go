package faultnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// direction is one half of a proxied connection.
type direction int

const (
	toTarget   direction = iota // dialer -> target
	fromTarget                  // target -> dialer
)

// chunk is what a reader hands its writer: data read at one time, or the
// end of the stream (err set, io.EOF for a clean end).
type chunk struct {
	buf *[]byte // from Link.bufs; nil for the end of the stream
	n   int
	at  time.Time // when it was read: a delayed chunk is due at at+delay
	err error
}

// conn is one proxied connection. Each direction is a reader goroutine
// feeding a bounded queue and a writer goroutine draining it: the writer
// alone decides, per chunk and under the link's lock, whether the mode
// forwards, delays or drops it, so a mode change takes effect between two
// chunks of every open connection. A full queue blocks the reader, which
// stops reading from its socket: that is the backpressure.
//
// The target is dialed only once the mode forwards, so a connection opened
// into a blackhole never reaches the target, and one opened through a cut
// link is reset before any dial.
type conn struct {
	l      *Link
	client net.Conn
	ctx    context.Context // done once the connection is torn down
	cancel context.CancelFunc

	poisoned bool // guarded by l.mu: the blackhole dropped some of its bytes

	mu       sync.Mutex
	upstream net.Conn      // guarded by mu; nil until dialed
	dialed   chan struct{} // closed once upstream is set
	queues   [2]chan chunk
}

func newConn(l *Link, client net.Conn) *conn {
	ctx, cancel := context.WithCancel(context.Background())
	c := &conn{l: l, client: client, ctx: ctx, cancel: cancel, dialed: make(chan struct{})}
	for i := range c.queues {
		c.queues[i] = make(chan chunk, l.cfg.queueLen())
	}
	return c
}

// run serves the connection until both directions have ended or it is
// reset, then releases everything it holds and unregisters it.
func (c *conn) run() {
	defer c.l.wg.Done()
	var wg sync.WaitGroup
	wg.Go(func() { c.read(c.client, toTarget) })
	wg.Go(func() { c.write(toTarget) })
	if up, err := c.connect(); err == nil {
		wg.Go(func() { c.read(up, fromTarget) })
		wg.Go(func() { c.write(fromTarget) })
	} else {
		c.reset()
	}
	wg.Wait()
	if c.isPoisoned() {
		// The blackhole swallowed an end of stream: stay silent
		// (no FIN) until the link leaves the blackhole or closes, which
		// resets the connection.
		<-c.ctx.Done()
	}
	if c.ctx.Err() == nil {
		// Both directions ended cleanly and were half-closed in turn.
		c.cancel()
		_ = c.client.Close()
		if up := c.target(); up != nil {
			_ = up.Close()
		}
	}
	for _, q := range c.queues {
		for len(q) > 0 {
			c.release(<-q)
		}
	}
	c.l.remove(c)
}

// reset tears the connection down with a RST on both sockets. It is safe
// to call more than once and from any goroutine; the blocked reads and
// writes fail and every goroutine of the connection ends.
func (c *conn) reset() {
	c.cancel()
	abort(c.client)
	if up := c.target(); up != nil {
		abort(up)
	}
}

// isPoisoned reports whether the blackhole dropped some of c's bytes.
func (c *conn) isPoisoned() bool {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	return c.poisoned
}

// target returns the dialed upstream connection, or nil.
func (c *conn) target() net.Conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.upstream
}

// connect waits for a mode that forwards, then dials the target. A reset
// meanwhile (Cut, Close, or leaving the blackhole with a poisoned stream)
// cancels the wait or the dial.
func (c *conn) connect() (net.Conn, error) {
	for {
		m, _, changed := c.l.snapshot()
		if m.forwards() {
			break
		}
		select {
		case <-changed:
		case <-c.ctx.Done():
			return nil, c.ctx.Err()
		}
	}
	d := net.Dialer{Timeout: dialTimeout}
	up, err := d.DialContext(c.ctx, "tcp", c.l.target)
	if err != nil {
		return nil, fmt.Errorf("faultnet: dial %s: %w", c.l.target, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx.Err() != nil {
		// reset ran after the dial began and could not see up.
		abort(up)
		return nil, c.ctx.Err()
	}
	c.upstream = up
	close(c.dialed)
	return up, nil
}

// read moves chunks from src into dir's queue until the stream ends, and
// then queues the end too, so the writer can forward (or drop) it in order.
func (c *conn) read(src net.Conn, dir direction) {
	q := c.queues[dir]
	for {
		buf := c.l.bufs.Get().(*[]byte)
		n, err := src.Read(*buf)
		at := time.Now()
		if n > 0 {
			c.l.buffered.Add(int64(n))
			if !c.enqueue(q, chunk{buf: buf, n: n, at: at}) {
				return
			}
		} else {
			c.l.bufs.Put(buf)
		}
		if err != nil {
			c.enqueue(q, chunk{at: at, err: err})
			return
		}
	}
}

// enqueue hands ch to the writer, blocking while the queue is full, unless
// the connection is torn down first.
func (c *conn) enqueue(q chan chunk, ch chunk) bool {
	select {
	case q <- ch:
		return true
	case <-c.ctx.Done():
		c.release(ch)
		return false
	}
}

// write drains dir's queue, forwarding each chunk when the mode says and
// dropping it in the blackhole, until the end of the stream or a reset.
func (c *conn) write(dir direction) {
	q := c.queues[dir]
	for {
		var ch chunk
		select {
		case ch = <-q:
		case <-c.ctx.Done():
			return
		}
		err := c.deliver(ch, dir)
		c.release(ch)
		if err != nil || ch.buf == nil {
			return
		}
	}
}

// deliver waits until ch is due under the current mode, then writes it (or
// forwards the end of the stream) to dir's destination, or drops it if the
// link is blackholed by then. The mode is read again after every wait, so a
// mode change reaches chunks already queued.
func (c *conn) deliver(ch chunk, dir direction) error {
	for {
		m, d, changed := c.l.snapshot()
		switch {
		case m == modeBlackhole:
			if c.l.dropIfBlackholed(c) {
				c.l.dropped.Add(int64(ch.n))
				return nil
			}
			continue // the mode changed between the two looks
		case !m.forwards(): // cut: reset is under way or imminent
			c.reset()
			return errReset
		case m == modeDelay:
			if wait := time.Until(ch.at.Add(d)); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-t.C:
				case <-changed:
				case <-c.ctx.Done():
				}
				t.Stop()
				if c.ctx.Err() != nil {
					return errReset
				}
				continue
			}
		}
		return c.forward(ch, dir)
	}
}

// errReset ends a writer whose connection was torn down.
var errReset = errors.New("faultnet: connection reset")

// forward writes ch to dir's destination: data, a half-close for a clean
// end, or a reset for a broken one.
func (c *conn) forward(ch chunk, dir direction) error {
	dst := c.client
	if dir == toTarget {
		select {
		case <-c.dialed:
			dst = c.target()
		case <-c.ctx.Done():
			return errReset
		}
	}
	if c.ctx.Err() != nil {
		return errReset
	}
	switch {
	case ch.buf != nil:
		n, err := dst.Write((*ch.buf)[:ch.n])
		if dir == toTarget {
			c.l.toTarget.Add(int64(n))
		} else {
			c.l.fromTarget.Add(int64(n))
		}
		if err != nil {
			c.reset()
			return err
		}
		return nil
	case errors.Is(ch.err, io.EOF):
		if hc, ok := dst.(interface{ CloseWrite() error }); ok {
			if err := hc.CloseWrite(); err != nil {
				c.reset()
				return err
			}
		}
		return nil
	default:
		c.reset()
		return ch.err
	}
}

// release returns ch's buffer and takes its bytes off the Buffered count.
func (c *conn) release(ch chunk) {
	if ch.buf == nil {
		return
	}
	c.l.buffered.Add(-int64(ch.n))
	c.l.bufs.Put(ch.buf)
}

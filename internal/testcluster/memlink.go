package testcluster

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// MemLink is one directed in-memory link between two nodes: every
// connection the "from" node opens to the "to" node passes through it. It
// is healthy, cut or delayed; a change applies at once to the connections
// already open as well as to new ones. Its methods are safe for
// concurrent use.
//
// It behaves as faultnet.Link does over TCP, without a proxy: it wraps
// each in-memory connection the dialer gets. A cut refuses new dials as a
// closed port does (ECONNREFUSED), and resets the open connections
// (ECONNRESET on their next read or write). A delay of d delivers every
// chunk of bytes d after it was written, each direction in order, while
// the writer carries on as with a socket's buffer: a slow link, not a
// slow writer. Blackhole is not provided; a long delay is close to one.
type MemLink struct {
	mu    sync.Mutex
	cut   bool
	delay time.Duration
	conns map[*linkConn]struct{}
}

// Cut refuses new connections and resets the open ones.
func (l *MemLink) Cut() {
	l.mu.Lock()
	l.cut = true
	conns := l.conns
	l.conns = map[*linkConn]struct{}{}
	l.mu.Unlock()
	for lc := range conns {
		lc.abort()
	}
}

// Delay delivers every chunk of bytes d after it was written, chunks
// already on their way included; 0 delivers them at once.
func (l *MemLink) Delay(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.delay = max(d, 0)
}

// Heal ends a cut and a delay.
func (l *MemLink) Heal() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut, l.delay = false, 0
}

// Mode describes the link's state: "pass", "cut" or "delay 50ms".
func (l *MemLink) Mode() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.cut:
		return "cut"
	case l.delay > 0:
		return "delay " + l.delay.String()
	}
	return "pass"
}

func (l *MemLink) currentDelay() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.delay
}

// dial connects through the link unless it is cut. The dial itself runs
// unlocked (it waits for the listener's accept); a Cut meanwhile is seen
// after it, and the new connection closed.
func (l *MemLink) dial(addr string, dial func() (net.Conn, error)) (net.Conn, error) {
	if l.Mode() == "cut" {
		return nil, refused(addr)
	}
	nc, err := dial()
	if err != nil {
		return nil, fmt.Errorf("dial %s in memory: %w", addr, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cut {
		_ = nc.Close()
		return nil, refused(addr)
	}
	lc := newLinkConn(l, nc)
	l.conns[lc] = struct{}{}
	return lc, nil
}

// closeConns closes the link's open connections (their node stopped).
func (l *MemLink) closeConns() {
	l.mu.Lock()
	conns := l.conns
	l.conns = map[*linkConn]struct{}{}
	l.mu.Unlock()
	for lc := range conns {
		lc.abort()
	}
}

// linkChunkSize is the most bytes one read of the underlying connection
// takes: the unit of delivery, and so of delay.
const linkChunkSize = 16 << 10

// linkQueueLen is how many chunks each direction holds in flight; a
// writer beyond it waits, as on a full socket buffer.
const linkQueueLen = 64

// chunk is bytes written at one time, or the end of a direction (err).
type chunk struct {
	b   []byte
	at  time.Time
	err error
}

// linkConn is the dialer's end of a connection through a MemLink. Each
// direction runs through a queue and a goroutine of its own, which
// delivers every chunk the link's delay after it was written: out, from
// Write to the underlying connection; in, from the underlying connection
// to Read. Read and Write honour the deadlines set on the linkConn (the
// peer clients' timeouts rely on them); the underlying connection has
// none, so that its goroutines never see a timeout.
//
// Once the link reset it (a cut, or its node stopped) its reads and
// writes fail with ECONNRESET, as a TCP connection's do after a reset:
// what the nodes' peer clients take for a dead pooled connection, to
// retry on a fresh one, as they do over the wire.
type linkConn struct {
	net.Conn
	l    *MemLink
	out  chan chunk
	in   chan chunk
	done chan struct{} // closed by Close or abort: the goroutines end
	wg   sync.WaitGroup

	closeOnce sync.Once
	mu        sync.Mutex
	reset     bool      // guarded by mu
	writeErr  error     // guarded by mu: the out goroutine's failure
	rdl, wdl  time.Time // guarded by mu: the deadlines
	pending   []byte    // Read's only: the rest of the last chunk
	readErr   error     // Read's only: the end of the in direction
}

func newLinkConn(l *MemLink, nc net.Conn) *linkConn {
	c := &linkConn{
		Conn: nc, l: l,
		out: make(chan chunk, linkQueueLen), in: make(chan chunk, linkQueueLen),
		done: make(chan struct{}),
	}
	c.wg.Add(2)
	go c.sendLoop()
	go c.receiveLoop()
	return c
}

// sendLoop writes each chunk Write queued to the underlying connection
// once it is due.
func (c *linkConn) sendLoop() {
	defer c.wg.Done()
	for {
		select {
		case <-c.done:
			return
		case ch := <-c.out:
			if !c.waitDue(ch.at) {
				return
			}
			if _, err := c.Conn.Write(ch.b); err != nil {
				c.mu.Lock()
				c.writeErr = err
				c.mu.Unlock()
				return
			}
		}
	}
}

// receiveLoop reads the underlying connection into stamped chunks for
// Read, until it fails or ends.
func (c *linkConn) receiveLoop() {
	defer c.wg.Done()
	for {
		buf := make([]byte, linkChunkSize)
		n, err := c.Conn.Read(buf)
		ch := chunk{b: buf[:n], at: time.Now(), err: err}
		if n == 0 && err == nil {
			continue
		}
		select {
		case c.in <- ch:
		case <-c.done:
			return
		}
		if err != nil {
			return
		}
	}
}

// waitDue waits until a chunk stamped at is due under the link's current
// delay (checked again after each wait, so a shorter delay releases it
// earlier); false if the connection closed meanwhile.
func (c *linkConn) waitDue(at time.Time) bool {
	for {
		wait := time.Until(at.Add(c.l.currentDelay()))
		if wait <= 0 {
			return true
		}
		t := time.NewTimer(min(wait, 10*time.Millisecond))
		select {
		case <-t.C:
		case <-c.done:
			t.Stop()
			return false
		}
	}
}

// Write queues b for delivery; it waits only while the queue is full.
func (c *linkConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	reset, werr, dl := c.reset, c.writeErr, c.wdl
	c.mu.Unlock()
	switch {
	case reset:
		return 0, resetErr("write")
	case c.isDone():
		return 0, c.closedErr("write")
	case werr != nil:
		return 0, werr
	}
	ch := chunk{b: append([]byte(nil), b...), at: time.Now()}
	timeout, stop := deadlineC(dl)
	defer stop()
	select {
	case c.out <- ch:
		return len(b), nil
	case <-c.done:
		return 0, c.closedErr("write")
	case <-timeout:
		return 0, os.ErrDeadlineExceeded
	}
}

// Read returns the next bytes once they are due, or fails at the read
// deadline. A closed or reset connection reads nothing more, whatever is
// still queued.
func (c *linkConn) Read(b []byte) (int, error) {
	if c.isDone() {
		return 0, c.closedErr("read")
	}
	if len(c.pending) > 0 {
		n := copy(b, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	if c.readErr != nil {
		return 0, c.readErr
	}
	c.mu.Lock()
	dl := c.rdl
	c.mu.Unlock()
	timeout, stop := deadlineC(dl)
	defer stop()
	var ch chunk
	select {
	case ch = <-c.in:
		if c.isDone() { // both were ready: the close wins
			return 0, c.closedErr("read")
		}
	case <-c.done:
		return 0, c.closedErr("read")
	case <-timeout:
		return 0, os.ErrDeadlineExceeded
	}
	// Due at ch.at plus the delay; the deadline still applies.
	for {
		wait := time.Until(ch.at.Add(c.l.currentDelay()))
		if wait <= 0 {
			break
		}
		t := time.NewTimer(min(wait, 10*time.Millisecond))
		select {
		case <-t.C:
		case <-c.done:
			t.Stop()
			return 0, c.closedErr("read")
		case <-timeout:
			t.Stop()
			c.pending = ch.b // it stays first in line
			if ch.err != nil {
				c.readErr = ch.err
			}
			return 0, os.ErrDeadlineExceeded
		}
	}
	n := copy(b, ch.b)
	c.pending = ch.b[n:]
	if ch.err != nil {
		c.readErr = ch.err
		if n == 0 {
			return 0, ch.err
		}
	}
	return n, nil
}

func (c *linkConn) isDone() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// closedErr is the error of a read or write on a connection that was
// closed: ECONNRESET if the link reset it, net.ErrClosed if its owner
// closed it.
func (c *linkConn) closedErr(op string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reset {
		return resetErr(op)
	}
	return &net.OpError{Op: op, Net: "tcp", Err: net.ErrClosed}
}

func (c *linkConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rdl, c.wdl = t, t
	return nil
}

func (c *linkConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rdl = t
	return nil
}

func (c *linkConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wdl = t
	return nil
}

// Close closes the connection and waits for its goroutines to end; the
// chunks still on their way are dropped.
func (c *linkConn) Close() error {
	c.l.mu.Lock()
	delete(c.l.conns, c)
	c.l.mu.Unlock()
	return c.shut()
}

// abort resets the connection: both ends see it fail (ECONNRESET here,
// a closed connection on the other end).
func (c *linkConn) abort() {
	c.mu.Lock()
	c.reset = true
	c.mu.Unlock()
	_ = c.shut()
}

func (c *linkConn) shut() error {
	var err error
	c.closeOnce.Do(func() {
		close(c.done)
		err = c.Conn.Close() // ends receiveLoop's read
		c.wg.Wait()
	})
	if errors.Is(err, io.ErrClosedPipe) {
		err = nil
	}
	return err
}

// deadlineC returns a channel that fires at dl (never for the zero time)
// and a function that releases its timer.
func deadlineC(dl time.Time) (<-chan time.Time, func()) {
	if dl.IsZero() {
		return nil, func() {}
	}
	t := time.NewTimer(time.Until(dl))
	return t.C, func() { t.Stop() }
}

func resetErr(op string) error {
	return &net.OpError{Op: op, Net: "tcp", Err: os.NewSyscallError(op, syscall.ECONNRESET)}
}

// refused is the error of a dial to a closed port.
func refused(addr string) error {
	return &net.OpError{Op: "dial", Net: "tcp", Addr: tcpAddr(addr), Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
}

// tcpAddr parses host:port, which the harness made: a valid address.
func tcpAddr(hostport string) *net.TCPAddr {
	host, port, _ := net.SplitHostPort(hostport)
	p, _ := strconv.Atoi(port)
	return &net.TCPAddr{IP: net.ParseIP(host), Port: p}
}

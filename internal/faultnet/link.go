// Package faultnet puts a controllable TCP proxy on one directed link
// between two processes, so that tests can cut, blackhole or delay the link
// without root, without iptables and without touching the processes.
//
// A Link listens on 127.0.0.1 and forwards every connection it accepts to
// one target address. The process on the "from" side dials the link's
// address instead of the target's. The link is in one mode at a time, and a
// mode change applies at once to the connections already open as well as to
// new ones:
//
//   - Pass forwards bytes both ways as they come.
//   - Cut resets every open connection (both sides see a TCP RST) and resets
//     new ones as soon as they are accepted: the dialer sees "connection
//     reset" on its first read or write, quickly, as it would from a closed
//     port. (The kernel completes the handshake before the link can refuse,
//     so the dial itself succeeds.)
//   - Blackhole keeps accepting and reading, and drops what it reads, in both
//     directions: nothing is forwarded, nothing is answered, not even a FIN or
//     a RST, and a new connection does not even reach the target. The
//     dialer sees only its own timeouts.
//   - Delay(d) forwards every chunk of bytes d after it was read, each
//     direction separately, in order.
//
// A connection that lost bytes to the blackhole is reset when the link
// leaves blackhole mode: its byte stream has a gap, and forwarding what
// follows the gap would hand the other side a corrupt stream. A connection
// that carried no bytes while blackholed (an idle keep-alive connection)
// carries on, as an idle TCP connection survives a short partition.
//
// Resources are bounded: at most MaxConns connections are open per link
// (more are reset at once), and each direction of a connection holds at most
// about BufferBytes of data in flight. When a delayed direction's buffer is
// full the link stops reading from that side, so the sender feels TCP
// backpressure instead of the link growing without bound.
//
// Close resets every connection and returns after every goroutine the link
// started has ended.
package faultnet

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// chunkSize is the largest read a connection does at once, so the unit of
// forwarding and of delay.
const chunkSize = 16 << 10

// dialTimeout bounds the dial to the target; a failed dial resets the
// client's connection, as the target's closed port would.
const dialTimeout = 5 * time.Second

// config is what the options set.
type config struct {
	maxConns    int
	bufferBytes int
}

// Option configures a Link.
type Option func(*config)

// MaxConns caps the connections a link has open at once (default 64). A
// connection accepted at the cap is reset at once and counted as refused.
func MaxConns(n int) Option {
	return func(c *config) { c.maxConns = max(n, 1) }
}

// BufferBytes caps the bytes each direction of a connection holds between
// reading them and writing them (default 256 KiB), rounded up to whole 16 KiB
// chunks, plus one chunk being read and one being written. It matters in
// delay mode: d of traffic at most this size is in flight per direction.
func BufferBytes(n int) Option {
	return func(c *config) { c.bufferBytes = max(n, 1) }
}

// queueLen is how many read chunks wait for their writer.
func (c config) queueLen() int { return (c.bufferBytes + chunkSize - 1) / chunkSize }

// maxHeld is the most bytes one direction of one connection holds.
func (c config) maxHeld() int64 { return int64(c.queueLen()+2) * chunkSize }

// mode is what a link does with bytes.
type mode int

const (
	modePass mode = iota
	modeCut
	modeBlackhole
	modeDelay
)

// forwards reports whether bytes move in this mode.
func (m mode) forwards() bool { return m == modePass || m == modeDelay }

// Stats are a link's counters since it was created.
type Stats struct {
	Accepted   int64 // connections accepted, refused ones included
	Refused    int64 // connections reset as soon as accepted: link cut, or at MaxConns
	Active     int64 // connections open now
	ToTarget   int64 // bytes written to the target
	FromTarget int64 // bytes written back to the dialers
	Dropped    int64 // bytes read and dropped by the blackhole
	Buffered   int64 // bytes read and not yet written or dropped
}

// Link is a TCP proxy from its own address to one target. Its methods are
// safe for concurrent use.
type Link struct {
	target string
	cfg    config
	ln     net.Listener
	bufs   sync.Pool      // *[]byte of chunkSize
	wg     sync.WaitGroup // the accept loop and every connection's run
	done   chan struct{}  // closed by Close

	accepted, refused, active atomic.Int64
	toTarget, fromTarget      atomic.Int64
	dropped, buffered         atomic.Int64

	mu      sync.Mutex
	mode    mode
	delay   time.Duration
	changed chan struct{} // closed and replaced on every mode change
	conns   map[*conn]struct{}
	closed  bool
}

// NewLink listens on 127.0.0.1:0 and forwards every connection it accepts
// to target (host:port), starting in pass mode.
func NewLink(target string, opts ...Option) (*Link, error) {
	cfg := config{maxConns: 64, bufferBytes: 256 << 10}
	for _, o := range opts {
		o(&cfg)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultnet: link to %s: %w", target, err)
	}
	l := &Link{
		target:  target,
		cfg:     cfg,
		ln:      ln,
		done:    make(chan struct{}),
		changed: make(chan struct{}),
		conns:   make(map[*conn]struct{}),
	}
	l.bufs.New = func() any { b := make([]byte, chunkSize); return &b }
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

// Addr is the address to dial instead of the target's.
func (l *Link) Addr() string { return l.ln.Addr().String() }

// Target is the address the link forwards to.
func (l *Link) Target() string { return l.target }

// String names the link and its mode, for test logs.
func (l *Link) String() string {
	return fmt.Sprintf("link %s->%s (%s)", l.Addr(), l.target, l.Mode())
}

// Mode describes the current mode: "pass", "cut", "blackhole" or "delay 50ms".
func (l *Link) Mode() string {
	m, d, _ := l.snapshot()
	switch m {
	case modeCut:
		return "cut"
	case modeBlackhole:
		return "blackhole"
	case modeDelay:
		return "delay " + d.String()
	default:
		return "pass"
	}
}

// Pass forwards bytes as they come, on open and new connections.
func (l *Link) Pass() { l.setMode(modePass, 0) }

// Restore is Pass: the link heals.
func (l *Link) Restore() { l.Pass() }

// Cut resets every open connection and every new one.
func (l *Link) Cut() { l.setMode(modeCut, 0) }

// Blackhole reads and drops everything, both ways, on open and new
// connections, and answers nothing.
func (l *Link) Blackhole() { l.setMode(modeBlackhole, 0) }

// Delay forwards every chunk d after it was read, each direction in order.
// It applies to chunks already waiting too: shortening the delay (or Pass)
// releases them earlier. Delay(0) is Pass.
func (l *Link) Delay(d time.Duration) {
	if d <= 0 {
		l.Pass()
		return
	}
	l.setMode(modeDelay, d)
}

// Stats returns the link's counters.
func (l *Link) Stats() Stats {
	return Stats{
		Accepted:   l.accepted.Load(),
		Refused:    l.refused.Load(),
		Active:     l.active.Load(),
		ToTarget:   l.toTarget.Load(),
		FromTarget: l.fromTarget.Load(),
		Dropped:    l.dropped.Load(),
		Buffered:   l.buffered.Load(),
	}
}

// Close stops listening, resets every connection and waits for the link's
// goroutines to end. It is idempotent.
func (l *Link) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.done)
	for c := range l.conns {
		c.reset()
	}
	l.mu.Unlock()
	err := l.ln.Close()
	l.wg.Wait()
	if err != nil {
		return fmt.Errorf("faultnet: close link to %s: %w", l.target, err)
	}
	return nil
}

// setMode switches modes. Under the same lock it resets the connections the
// new mode cannot carry: all of them for Cut, the ones with a gap in their
// stream (poisoned by the blackhole) for a forwarding mode. Writers decide
// to drop a chunk, and mark the connection poisoned, under this lock too
// (dropIfBlackholed), so no poisoned connection forwards another byte.
func (l *Link) setMode(m mode, d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.mode, l.delay = m, d
	close(l.changed)
	l.changed = make(chan struct{})
	for c := range l.conns {
		if m == modeCut || (m.forwards() && c.poisoned) {
			c.reset()
		}
	}
}

// snapshot returns the mode and a channel closed at the next change.
func (l *Link) snapshot() (mode, time.Duration, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mode, l.delay, l.changed
}

// dropIfBlackholed reports whether the link is blackholed now, and if so
// marks c poisoned: the caller drops its chunk.
func (l *Link) dropIfBlackholed(c *conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mode != modeBlackhole {
		return false
	}
	c.poisoned = true
	return true
}

// acceptLoop accepts until the listener closes. Each connection is either
// registered and served or reset on the spot, decided under l.mu so that a
// concurrent Cut or Close sees every registered connection.
func (l *Link) acceptLoop() {
	defer l.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		nc, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors or the like: wait and retry, as
			// net/http does, unless the link closes meanwhile.
			select {
			case <-l.done:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		l.accepted.Add(1)
		l.mu.Lock()
		switch {
		case l.closed:
			abort(nc)
		case l.mode == modeCut || len(l.conns) >= l.cfg.maxConns:
			l.refused.Add(1)
			abort(nc)
		default:
			c := newConn(l, nc)
			l.conns[c] = struct{}{}
			l.active.Add(1)
			l.wg.Add(1)
			go c.run()
		}
		l.mu.Unlock()
	}
}

// remove unregisters a connection whose goroutines have ended.
func (l *Link) remove(c *conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
	l.active.Add(-1)
}

// abort closes nc with a RST instead of a FIN, so that the peer's next read
// or write fails at once instead of seeing a clean end of stream.
func abort(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = nc.Close()
}

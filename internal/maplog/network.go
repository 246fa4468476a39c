package maplog

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"golang.org/x/time/rate"

	"github.com/dhtkv/dhtkv/internal/tlsconf"
)

// Auth is how the log's connections authenticate the node at the other
// end, by the rules of the node's internal HTTP endpoints (rpc.Accept):
//
//   - under mutual TLS (TLS with a peer CA), every connection is TLS and
//     the accepting side requires a client certificate that chains to
//     the peer CA; a secret, if set, is required as well;
//   - otherwise, with a secret, both ends prove they hold it (below);
//   - with neither, only loopback peers are accepted.
//
// The secret is proven by a challenge-response: each end sends a random
// 32-byte nonce and answers the other's with HMAC-SHA256(secret, role,
// both nonces), so the secret never crosses the wire and a recorded
// exchange cannot be replayed. It authenticates the connection's peer,
// not each message: on a network where connections can be hijacked, use
// TLS, as for the rest of the node-to-node traffic (docs/security.md).
type Auth struct {
	// TLS, when set, wraps every connection (the node's --tls-cert and
	// --peer-tls-ca); nil: plain TCP.
	TLS *tlsconf.Certs
	// Secret is the cluster secret (--cluster-secret-file); empty: none.
	Secret string
	// Upgraded says the connections come authenticated already: the
	// node's HTTP port let them in by rpc.Accept's rules (the verified
	// client certificate, the secret, or a loopback peer) and upgraded
	// them to the log (rpc.LogListener, rpc.DialLog), under the node's
	// TLS when it runs TLS. The loopback rule is then not applied again
	// (a hijacked connection may come from any peer the HTTP port let
	// in), and TLS must be nil (it is already under the connection).
	Upgraded bool
}

// The connection's first bytes (after TLS, if any): the dialer's magic
// and nonce, the acceptor's nonce and proof, the dialer's proof and the
// kind of connection, the acceptor's verdict.
var magic = []byte("dhtkvlg1")

const (
	nonceLen  = 32
	kindRaft  = 'R' // a raft.NetworkTransport connection
	kindApply = 'P' // a forwarded proposal: one command, one answer
	verdictOK = 'K'
)

// refusedLogEvery is the least time between two warnings of refused
// connections.
const refusedLogEvery = 10 * time.Second

// ErrRefused is a connection the other end did not authenticate.
var ErrRefused = errors.New("maplog: the peer refused this node's authentication")

// Network is a raft.StreamLayer over TCP whose connections are
// authenticated both ways (Auth) before raft sees them, and the carrier
// of proposals forwarded to the leader (Forward). Listen binds; Start
// accepts. Connections that do not authenticate within HandshakeTimeout
// are closed, and at most MaxPending connections are handshaking or
// being answered at once (beyond, a new one is closed at once): a peer
// that is not a member holds nothing else of the node.
type Network struct {
	ln     net.Listener
	addr   net.Addr // advertised: where peers reach this network
	dialer Dialer
	auth   Auth
	o      Options
	log    *slog.Logger
	conns  chan net.Conn
	sem    chan struct{}
	closed chan struct{}
	// dials is canceled by Interrupt and Close: a dial under way (the
	// dialer's upgrade included) ends at once.
	dials     context.Context
	stopDials context.CancelFunc
	once      sync.Once
	wg        sync.WaitGroup
	// apply answers a forwarded proposal (set by the Log that uses this
	// network; nil: proposals are refused).
	apply atomic.Pointer[func(ctx context.Context, cmd []byte) []byte]
	// Refused counts connections refused for failing authentication;
	// refusedLog paces their warnings.
	refused    atomic.Int64
	refusedLog rate.Sometimes
	// busyLog paces the warnings of connections closed because
	// MaxPending are handshaking already.
	busyLog rate.Sometimes
	// open is every connection of this network not closed yet, accepted
	// or dialed, keyed by the TCP connection: Close closes them all.
	// raft's transport closes neither its pooled connections nor the
	// ones it serves when it closes, and a goroutine of it reads each of
	// the latter until the peer hangs up.
	openMu sync.Mutex
	open   map[net.Conn]struct{}
	// served counts the connections raft took through Accept and has not
	// closed yet: its transport handles each on a goroutine of its own,
	// which answers a heartbeat there (raft.processHeartbeat, writing the
	// term to the log's store) and closes the connection as it returns.
	// Close waits for them, so that the Log closes its store under none
	// (Pebble panics on a write to a closed store, and so does raft on
	// any error of it).
	served sync.WaitGroup
	// interrupted: Interrupt closed every connection, and no new one is
	// dialed or accepted.
	interrupted bool
}

// track records raw as open; it returns false once the network is closed
// (raw is then closed).
func (n *Network) track(raw net.Conn) bool {
	n.openMu.Lock()
	defer n.openMu.Unlock()
	if n.open == nil || n.interrupted {
		raw.Close()
		return false
	}
	n.open[raw] = struct{}{}
	return true
}

// Interrupt ends every dial under way and closes every connection of the
// network, dialed or accepted, and refuses new ones; the listener stays
// until Close. A node stopping calls it before raft's Shutdown
// (Log.Close), which waits for raft's RPCs in flight: one to a peer that
// accepts connections and never answers (a hung process) would hold it
// for the dial's timeout, 10 s, once for each RPC under way.
func (n *Network) Interrupt() {
	n.stopDials()
	n.openMu.Lock()
	n.interrupted = true
	open := make([]net.Conn, 0, len(n.open))
	for c := range n.open {
		open = append(open, c)
	}
	n.openMu.Unlock()
	for _, c := range open {
		c.Close()
	}
}

func (n *Network) untrack(raw net.Conn) {
	n.openMu.Lock()
	defer n.openMu.Unlock()
	if n.open != nil {
		delete(n.open, raw)
	}
}

// tracked is a connection handed to raft or a forwarder: closing it
// closes the TCP connection under it and forgets it.
type tracked struct {
	net.Conn
	raw net.Conn
	n   *Network
	// served: raft took it through Accept (Network.served); closed once.
	served bool
	closed sync.Once
}

func (c *tracked) Close() error {
	c.n.untrack(c.raw)
	err := c.Conn.Close() // a *tls.Conn closes raw too
	c.closed.Do(func() {
		if c.served {
			c.n.served.Done()
		}
	})
	return err
}

// Dialer opens a connection to a peer's log address (host:port) within
// timeout, or until ctx ends: a TCP dial (and the node's upgrade of an
// HTTP connection, rpc.DialLog), or in tests one over an in-memory link
// that a test can cut.
type Dialer func(ctx context.Context, addr string, timeout time.Duration) (net.Conn, error)

// Listen binds addr (host:port) over TCP and advertises the address
// bound (a wildcard host is advertised as such: bind a reachable host, or
// use NewNetwork). Nothing is accepted before Start.
func Listen(addr string, auth Auth, o Options, log *slog.Logger) (*Network, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("maplog: listen %s: %w", addr, err)
	}
	return NewNetwork(ln, ln.Addr().String(), func(ctx context.Context, addr string, timeout time.Duration) (net.Conn, error) {
		return (&net.Dialer{Timeout: timeout}).DialContext(ctx, "tcp", addr)
	}, auth, o, log), nil
}

// NewNetwork is a Network that accepts on ln, is reached by its peers at
// advertise (host:port: what raft tells them as this node's address, and
// the address of a leader they forward proposals to), and dials peers
// with dial: Listen's over TCP, or an in-memory cluster's listener and
// links. It owns ln (Close closes it). Nothing is accepted before Start.
// Without TLS or a secret only loopback TCP peers are accepted, so an
// in-memory listener needs one of them.
func NewNetwork(ln net.Listener, advertise string, dial Dialer, auth Auth, o Options, log *slog.Logger) *Network {
	o.EnsureDefaults()
	dials, stopDials := context.WithCancel(context.Background())
	return &Network{
		dials: dials, stopDials: stopDials,
		ln: ln, addr: advertised(advertise), dialer: dial, auth: auth, o: o, log: log,
		refusedLog: rate.Sometimes{Interval: refusedLogEvery},
		busyLog:    rate.Sometimes{Interval: refusedLogEvery},
		conns:      make(chan net.Conn),
		sem:        make(chan struct{}, o.MaxPending),
		closed:     make(chan struct{}),
		open:       map[net.Conn]struct{}{},
	}
}

// Start accepts connections until Close.
func (n *Network) Start() {
	n.wg.Go(n.acceptLoop)
}

func (n *Network) acceptLoop() {
	for {
		c, err := n.ln.Accept()
		if err != nil {
			select {
			case <-n.closed:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			n.log.Error("maplog: accept", "err", err)
			select {
			case <-n.closed:
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		select {
		case n.sem <- struct{}{}:
		default:
			// One warning per refusedLogEvery: a burst of upgrades
			// logged a line for each connection it closed.
			n.busyLog.Do(func() {
				n.log.Warn("maplog: too many connections handshaking; closing the ones beyond (one warning per 10s)",
					"from", c.RemoteAddr().String(), "max", n.o.MaxPending)
			})
			c.Close()
			continue
		}
		if !n.track(c) {
			<-n.sem
			return
		}
		n.wg.Go(func() {
			defer func() { <-n.sem }()
			n.serve(c)
		})
	}
}

// serve authenticates raw, then hands a raft connection to Accept or
// answers a forwarded proposal.
func (n *Network) serve(raw net.Conn) {
	c, kind, err := n.handshakeAccept(raw)
	if err != nil {
		total := n.refused.Add(1)
		// At most one warning per refusedLogEvery: a peer of another
		// cluster (or a scanner) retrying would otherwise fill the log.
		n.refusedLog.Do(func() {
			n.log.Warn("maplog: connection refused (more are counted in dhtkv_maplog_refused_connections_total, one warning per 10s)",
				"from", raw.RemoteAddr().String(), "err", err, "refused_total", total)
		})
		n.untrack(raw)
		raw.Close()
		return
	}
	tc := &tracked{Conn: c, raw: raw, n: n}
	switch kind {
	case kindRaft:
		select {
		case n.conns <- tc:
		case <-n.closed:
			tc.Close()
		}
	case kindApply:
		defer tc.Close()
		if err := n.answer(c); err != nil {
			n.log.Warn("maplog: forwarded proposal", "from", c.RemoteAddr().String(), "err", err)
		}
	}
}

func (n *Network) handshakeAccept(raw net.Conn) (net.Conn, byte, error) {
	c := raw
	if err := c.SetDeadline(time.Now().Add(n.o.HandshakeTimeout)); err != nil {
		return c, 0, err
	}
	mutual := n.auth.TLS != nil && n.auth.TLS.Mutual()
	if n.auth.TLS != nil {
		tc := tls.Server(raw, n.auth.TLS.ServerConfig())
		if err := tc.Handshake(); err != nil {
			return raw, 0, fmt.Errorf("TLS handshake: %w", err)
		}
		if mutual {
			cs := tc.ConnectionState()
			if !tlsconf.PeerVerified(&cs) {
				return raw, 0, errors.New("no client certificate from --peer-tls-ca")
			}
		}
		c = tc
	}
	if !mutual && !n.auth.Upgraded && n.auth.Secret == "" && !isLoopback(raw.RemoteAddr()) {
		return c, 0, errors.New("without --cluster-secret-file or --peer-tls-ca only loopback peers are accepted")
	}
	var hello [len("dhtkvlg1") + nonceLen]byte
	if _, err := io.ReadFull(c, hello[:]); err != nil {
		return c, 0, fmt.Errorf("read hello: %w", err)
	}
	if !hmac.Equal(hello[:len(magic)], magic) {
		return c, 0, errors.New("not a dhtkv log connection")
	}
	cn := hello[len(magic):]
	sn := nonce()
	if _, err := c.Write(append(sn, n.proof('S', cn, sn)...)); err != nil {
		return c, 0, fmt.Errorf("write challenge: %w", err)
	}
	var reply [sha256.Size + 1]byte
	if _, err := io.ReadFull(c, reply[:]); err != nil {
		return c, 0, fmt.Errorf("read proof: %w", err)
	}
	if !hmac.Equal(reply[:sha256.Size], n.proof('C', cn, sn)) {
		return c, 0, errors.New("missing or wrong cluster secret")
	}
	kind := reply[sha256.Size]
	if kind != kindRaft && kind != kindApply {
		return c, 0, fmt.Errorf("unknown connection kind %q", kind)
	}
	if _, err := c.Write([]byte{verdictOK}); err != nil {
		return c, 0, fmt.Errorf("write verdict: %w", err)
	}
	// Raft sets its own deadlines per RPC; a proposal gets ApplyTimeout.
	return c, kind, c.SetDeadline(time.Time{})
}

// dial connects to addr and authenticates both ways, within timeout, or
// until ctx ends or the network is interrupted: a proposal forwarded for
// a caller that gave up (a node stopping its seeding, an operator's
// request cut) does not wait out the timeout on a member that accepts
// connections and never answers.
func (n *Network) dial(ctx context.Context, addr string, kind byte, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopDials := context.AfterFunc(n.dials, cancel)
	defer stopDials()
	raw, err := n.dialer(ctx, addr, timeout)
	if err != nil {
		return nil, fmt.Errorf("maplog: dial %s: %w", addr, err)
	}
	if !n.track(raw) {
		return nil, fmt.Errorf("maplog: dial %s: %w", addr, net.ErrClosed)
	}
	// The handshake's reads end when ctx does. If the cut has begun when
	// the handshake is over, the connection's deadline may be in the past
	// whatever the handshake left: it is not handed on.
	stopCut := context.AfterFunc(ctx, func() { _ = raw.SetDeadline(time.Now()) })
	c, err := n.handshakeDial(raw, addr, kind, timeout)
	if !stopCut() && err == nil {
		err = context.Cause(ctx)
	}
	if err != nil {
		n.untrack(raw)
		raw.Close()
		return nil, fmt.Errorf("maplog: %s: %w", addr, err)
	}
	return &tracked{Conn: c, raw: raw, n: n}, nil
}

func (n *Network) handshakeDial(raw net.Conn, addr string, kind byte, timeout time.Duration) (net.Conn, error) {
	c := raw
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	if n.auth.TLS != nil {
		cfg := n.auth.TLS.ClientConfig().Clone()
		if cfg.ServerName == "" {
			host, _, _ := net.SplitHostPort(addr)
			cfg.ServerName = host
		}
		tc := tls.Client(raw, cfg)
		if err := tc.Handshake(); err != nil {
			return nil, fmt.Errorf("TLS handshake: %w", err)
		}
		c = tc
	}
	cn := nonce()
	if _, err := c.Write(append(append([]byte{}, magic...), cn...)); err != nil {
		return nil, fmt.Errorf("write hello: %w", err)
	}
	var chal [nonceLen + sha256.Size]byte
	if _, err := io.ReadFull(c, chal[:]); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrRefused, err)
	}
	sn := chal[:nonceLen]
	if !hmac.Equal(chal[nonceLen:], n.proof('S', cn, sn)) {
		return nil, errors.New("the peer does not hold the cluster secret")
	}
	if _, err := c.Write(append(n.proof('C', cn, sn), kind)); err != nil {
		return nil, fmt.Errorf("write proof: %w", err)
	}
	var verdict [1]byte
	if _, err := io.ReadFull(c, verdict[:]); err != nil || verdict[0] != verdictOK {
		return nil, fmt.Errorf("%w (verdict: %v)", ErrRefused, err)
	}
	return c, c.SetDeadline(time.Time{})
}

func (n *Network) proof(role byte, cn, sn []byte) []byte {
	h := hmac.New(sha256.New, []byte(n.auth.Secret))
	h.Write(magic)
	h.Write([]byte{role})
	h.Write(cn)
	h.Write(sn)
	return h.Sum(nil)
}

func nonce() []byte {
	b := make([]byte, nonceLen)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return b
}

func isLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// Accept implements raft.StreamLayer: the next authenticated raft
// connection.
func (n *Network) Accept() (net.Conn, error) {
	select {
	case c := <-n.conns:
		if tc, ok := c.(*tracked); ok {
			// Under openMu, against Close: served is not added to once
			// Close may be waiting on it.
			n.openMu.Lock()
			if n.open == nil {
				n.openMu.Unlock()
				tc.Close()
				return nil, net.ErrClosed
			}
			tc.served = true
			n.served.Add(1)
			n.openMu.Unlock()
		}
		return c, nil
	case <-n.closed:
		return nil, net.ErrClosed
	}
}

// Close implements raft.StreamLayer: it stops accepting, closes every
// connection of this network, and waits for the goroutines that
// handshook or answered them. It may be called more than once (raft's
// transport closes its stream layer, and so does the Log).
func (n *Network) Close() error {
	var err error
	n.once.Do(func() {
		close(n.closed)
		err = n.ln.Close()
		n.Interrupt()
		n.openMu.Lock()
		n.open = nil
		n.openMu.Unlock()
		n.wg.Wait()
		// raft's handlers of the connections just closed return at
		// their next read, and close them as they do.
		served := make(chan struct{})
		go func() { n.served.Wait(); close(served) }()
		select {
		case <-served:
		case <-time.After(closeServedWait):
			n.log.Warn("maplog: closing with raft still handling a connection", "waited", closeServedWait)
		}
	})
	return err
}

// closeServedWait bounds Close's wait for raft's connection handlers: each
// returns at its next read of the connection Close closed, after the
// command it is handling, whose store write takes milliseconds.
const closeServedWait = 5 * time.Second

// Addr implements raft.StreamLayer: the advertised address.
func (n *Network) Addr() net.Addr { return n.addr }

// advertised is an advertised host:port as a net.Addr.
type advertised string

func (a advertised) Network() string { return "tcp" }
func (a advertised) String() string  { return string(a) }

// Dial implements raft.StreamLayer.
func (n *Network) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return n.dial(context.Background(), string(addr), kindRaft, timeout)
}

// Refused returns how many connections were refused for failing
// authentication.
func (n *Network) Refused() int64 { return n.refused.Load() }

// Forwarder carries proposals from a member that does not lead to the
// leader: Network over TCP; tests may carry them in memory beside raft's
// in-memory transport.
type Forwarder interface {
	// Forward sends an encoded Command to the log at addr and returns
	// the encoded answer (forwardReply).
	Forward(ctx context.Context, addr string, cmd []byte) ([]byte, error)
	// ServeForwarded sets how this node answers forwarded commands.
	ServeForwarded(f func(ctx context.Context, cmd []byte) []byte)
}

// forwardReply is a forwarded proposal's answer.
type forwardReply struct {
	Result *Result `json:"result,omitempty"`
	// Leader is the answering node's leader when it is not the leader.
	Leader string `json:"leader,omitempty"`
	Err    string `json:"err,omitempty"`
}

// ServeForwarded implements Forwarder.
func (n *Network) ServeForwarded(f func(ctx context.Context, cmd []byte) []byte) {
	n.apply.Store(&f)
}

// answer reads one proposal from c and writes its answer.
func (n *Network) answer(c net.Conn) error {
	if err := c.SetDeadline(time.Now().Add(n.o.ApplyTimeout + n.o.HandshakeTimeout)); err != nil {
		return err
	}
	cmd, err := readFrame(c, n.o.MaxCommandBytes)
	if err != nil {
		return err
	}
	var out []byte
	if f := n.apply.Load(); f == nil {
		out, _ = json.Marshal(forwardReply{Err: "this node's log is not started"})
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), n.o.ApplyTimeout)
		out = (*f)(ctx, cmd)
		cancel()
	}
	return writeFrame(c, out)
}

// Forward implements Forwarder: it sends cmd to the node at addr over an
// authenticated connection, and returns its answer.
func (n *Network) Forward(ctx context.Context, addr string, cmd []byte) ([]byte, error) {
	timeout := n.o.HandshakeTimeout
	c, err := n.dial(ctx, addr, kindApply, timeout)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	deadline := time.Now().Add(n.o.ApplyTimeout + timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := c.SetDeadline(deadline); err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	if err := writeFrame(c, cmd); err != nil {
		return nil, fmt.Errorf("maplog: forward to %s: %w", addr, err)
	}
	b, err := readFrame(c, 4*n.o.MaxCommandBytes+int(n.o.MaxSnapshotBytes))
	if err != nil {
		return nil, fmt.Errorf("maplog: forward to %s: %w", addr, err)
	}
	return b, nil
}

// A frame is a 4-byte big-endian length and as many bytes.
func writeFrame(w io.Writer, b []byte) error {
	bw := bufio.NewWriter(w)
	var h [4]byte
	binary.BigEndian.PutUint32(h[:], uint32(len(b)))
	bw.Write(h[:])
	bw.Write(b)
	return bw.Flush()
}

func readFrame(r io.Reader, limit int) ([]byte, error) {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, fmt.Errorf("read frame: %w", err)
	}
	size := binary.BigEndian.Uint32(h[:])
	if int64(size) > int64(limit) {
		return nil, fmt.Errorf("frame of %d bytes over the limit of %d", size, limit)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("read frame: %w", err)
	}
	return b, nil
}

package node

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The public listener's connection limits (--max-connections,
// --max-connections-per-ip) and its accept loop's resilience.
//
// fasthttp v1.74.0 has limits of its own, and neither fits: Concurrency
// counts connections handed to its workers (a hijacked one leaves the
// count while it still holds a descriptor), and MaxConnsPerIP ignores
// IPv6 clients (its counter is keyed by a uint32). Worse, its Serve
// returns for good on any accept error but a timeout, so one burst past
// RLIMIT_NOFILE (accept4: too many open files) stopped the node serving.
// limitListener sits between the socket and fasthttp: it counts every
// connection from accept to Close, refuses the excess with a one-line
// answer, and waits out descriptor exhaustion instead of failing.

// Refusal reasons, the label values of dhtkv_connections_refused_total.
const (
	refusedMax   = "max_connections"
	refusedPerIP = "max_connections_per_ip"
)

// refusals are the whole answers written to a refused connection before it
// is closed: an HTTP/1.1 response, so that a client sees why.
var refusals = map[string][]byte{
	refusedMax:   refusal(503, "Service Unavailable", "too many connections to this node (--max-connections)"),
	refusedPerIP: refusal(429, "Too Many Requests", "too many connections from your address (--max-connections-per-ip)"),
}

// listenerKind names what a limitListener serves: its metrics (spelled
// out, so that a search of the code finds each) and the answers to the
// connections it refuses.
type listenerKind struct {
	open, max, perIPMax, refused, retries string // the metrics' names; perIPMax "": no per-address cap
	what                                  string // in their help: "Client connections" ...
	capFlag                               string // what sets the cap, in its help
	refusals                              map[string][]byte
}

var (
	// publicListener is the client and peer port's (--max-connections,
	// --max-connections-per-ip).
	publicListener = listenerKind{
		open: "dhtkv_connections_open", max: "dhtkv_connections_max", perIPMax: "dhtkv_connections_per_ip_max",
		refused: "dhtkv_connections_refused_total", retries: "dhtkv_accept_retries_total",
		what: "Client connections", capFlag: "--max-connections, or the one derived from the descriptor limit", refusals: refusals,
	}
	// adminListener is the admin port's (--admin-max-connections, and
	// adminPerIP of them from one address): its probes and /metrics need
	// no token, and each connection holds a descriptor, which the cap on
	// the public port leaves to Pebble (reservedFiles).
	adminListener = listenerKind{
		open: "dhtkv_admin_connections_open", max: "dhtkv_admin_connections_max",
		refused: "dhtkv_admin_connections_refused_total", retries: "dhtkv_admin_accept_retries_total",
		what: "Admin port connections", capFlag: "--admin-max-connections", refusals: map[string][]byte{
			refusedMax:   refusal(503, "Service Unavailable", "too many connections to this node's admin port (--admin-max-connections)"),
			refusedPerIP: refusal(429, "Too Many Requests", "too many connections from your address to this node's admin port (three quarters of --admin-max-connections)"),
		}}
)

func refusal(code int, text, reason string) []byte {
	return fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n\r\n%s\n",
		code, text, len(reason)+1, reason)
}

const (
	// refuseWriteTimeout bounds the write of a refusal, which runs on the
	// accept loop: a fresh socket's send buffer takes it at once, this
	// only guards against the impossible.
	refuseWriteTimeout = 100 * time.Millisecond
	// acceptRetryMin and acceptRetryMax bound the wait before accepting
	// again after descriptor or memory exhaustion; the wait doubles while
	// it lasts (net/http's accept loop does the same).
	acceptRetryMin = 5 * time.Millisecond
	acceptRetryMax = time.Second
	// acceptWarnEvery rate-limits the warning logged while accepting
	// fails.
	acceptWarnEvery = 10 * time.Second
)

// Descriptors that DefaultMaxConnections keeps out of the connection cap
// for the rest of the node.
const (
	// reservedFiles is Pebble's and the process's own: Pebble keeps at
	// most MaxOpenFiles (1000, its default, which store.Options leaves as
	// it is) tables open, plus its WAL, MANIFEST, LOCK and OPTIONS files;
	// then the listeners, the admin listener's connections (at most
	// --admin-max-connections, 64 by default), stdio.
	reservedFiles = 1088
	// reservedPerPeerStreams is, per other node, room for the range and
	// rebuild streams opened to it on top of rpc.Peer's pooled
	// connections (2 request lanes × --peer-conns, one for background
	// reads, one for pings).
	reservedPerPeerStreams = 16
)

// DefaultMaxConnections is the connection cap used when --max-connections
// is 0, for a soft RLIMIT_NOFILE of nofile descriptors:
//
//	nofile − 1088 − (clusterSize − 1) × (2 × peerConns + 2 + 16)
//
// that is, the descriptor limit less what Pebble, the process and the
// connections to every other node may hold (see reservedFiles and
// reservedPerPeerStreams), but never less than nofile/4: below that the
// reserve is a guess anyway, and a node must take some clients.
func DefaultMaxConnections(nofile uint64, clusterSize, peerConns int) int {
	const ceiling = 1 << 24 // RLIM_INFINITY and the like: no real bound
	n := int(min(nofile, ceiling))
	reserve := reservedFiles + (clusterSize-1)*(2*peerConns+2+reservedPerPeerStreams)
	return max(n-reserve, n/4)
}

// limitListener caps the connections accepted from its inner listener:
// at most maxConns at once (0: no cap) and at most perIP from one address (0:
// no cap). A connection counts from Accept until its first Close. Under
// TLS it sits below the TLS listener: a tls.Conn's Close closes the
// limitConn it wraps, so the count is the same.
//
// Invariant: open equals the number of accepted connections not yet
// closed, and byIP[a] the number of those from address a (an address
// leaves the map at 0), so both always fall back once clients close.
type limitListener struct {
	net.Listener
	kind      listenerKind
	maxConns  int
	perIP     int
	silent    bool // close refused connections without an answer (TLS)
	log       *slog.Logger
	instr     listenerMetrics
	done      chan struct{} // closed by Close: ends an accept retry wait
	closeOnce sync.Once

	// lingerTimeout and lingerBytes bound a lingering close (linger.go);
	// set before the first Accept. 0: none.
	lingerTimeout time.Duration
	lingerBytes   int64

	mu   sync.Mutex
	open int
	byIP map[netip.Addr]int

	lastWarn time.Time // accept loop only
}

type listenerMetrics struct {
	refused *prometheus.CounterVec
	retries prometheus.Counter
}

// newLimitListener wraps inner. Under TLS (tlsAbove) a refused connection
// is closed without the plain-text answer, which a TLS client would only
// see as a malformed record; it then fails its handshake on the close.
func newLimitListener(inner net.Listener, maxConns, perIP int, tlsAbove bool, reg prometheus.Registerer, log *slog.Logger) *limitListener {
	return newKindListener(publicListener, inner, maxConns, perIP, tlsAbove, reg, log)
}

// newAdminLimitListener wraps the admin listener: at most maxConns
// connections at once (0: no cap), and at most adminPerIP(maxConns) from
// one address, plain HTTP.
func newAdminLimitListener(inner net.Listener, maxConns int, reg prometheus.Registerer, log *slog.Logger) *limitListener {
	return newKindListener(adminListener, inner, maxConns, adminPerIP(maxConns), false, reg, log)
}

// adminPerIP is how many of the admin port's maxConns connections one
// address may hold: all but a quarter, so that one client holding
// connections open (the port takes no token for /livez, /readyz and
// /metrics) cannot take every slot and fail the kubelet's liveness probe
// or Prometheus's scrape from elsewhere; 0 (no cap) below 4.
func adminPerIP(maxConns int) int {
	if maxConns < 4 {
		return 0
	}
	return maxConns - maxConns/4
}

func newKindListener(kind listenerKind, inner net.Listener, maxConns, perIP int, tlsAbove bool, reg prometheus.Registerer, log *slog.Logger) *limitListener {
	l := &limitListener{
		Listener: inner, kind: kind, maxConns: maxConns, perIP: perIP, silent: tlsAbove, log: log,
		done: make(chan struct{}), byIP: map[netip.Addr]int{},
		instr: listenerMetrics{
			refused: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: kind.refused,
				Help: kind.what + " closed at accept because a connection cap was reached, by cap.",
			}, []string{"reason"}),
			retries: prometheus.NewCounter(prometheus.CounterOpts{
				Name: kind.retries,
				Help: "Accepts that failed for lack of descriptors or memory and were retried after a wait.",
			}),
		},
	}
	for reason := range kind.refusals {
		l.instr.refused.WithLabelValues(reason) // exported at 0 before the first refusal
	}
	if reg != nil {
		reg.MustRegister(l.instr.refused, l.instr.retries, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: kind.open,
			Help: kind.what + " accepted and not yet closed.",
		}, func() float64 { return float64(l.Open()) }), prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: kind.max,
			Help: "The cap on " + strings.ToLower(kind.what) + " open at once (" + kind.capFlag + "); 0: no cap.",
		}, func() float64 { return float64(l.maxConns) }))
		if kind.perIPMax != "" {
			reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: kind.perIPMax,
				Help: "The cap on connections open at once from one address (--max-connections-per-ip); 0: no cap.",
			}, func() float64 { return float64(l.perIP) }))
		}
	}
	return l
}

// Accept returns the next connection within the caps. Connections beyond
// a cap get a one-line 503 or 429 (none under TLS) and are closed here; fasthttp never
// sees them. Accept errors that mean "out of descriptors or memory for
// now" are waited out, so the loop keeps going once connections close;
// any other error is returned (fasthttp's Serve then returns it).
func (l *limitListener) Accept() (net.Conn, error) {
	var wait time.Duration
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if !exhausted(err) {
				return nil, err
			}
			wait = min(max(2*wait, acceptRetryMin), acceptRetryMax)
			l.instr.retries.Inc()
			if now := time.Now(); now.Sub(l.lastWarn) >= acceptWarnEvery {
				l.lastWarn = now
				l.log.Warn("accept failed for lack of resources; retrying until connections close",
					"err", err, "open_connections", l.Open(), "max_connections", l.maxConns)
			}
			select {
			case <-time.After(wait):
				continue
			case <-l.done:
				return nil, fmt.Errorf("accept: %w", net.ErrClosed)
			}
		}
		wait = 0
		addr := remoteAddr(c)
		if reason := l.admit(addr); reason != "" {
			l.instr.refused.WithLabelValues(reason).Inc()
			if !l.silent {
				_ = c.SetWriteDeadline(time.Now().Add(refuseWriteTimeout))
				_, _ = c.Write(l.kind.refusals[reason])
			}
			_ = c.Close()
			continue
		}
		return &limitConn{Conn: c, l: l, addr: addr}, nil
	}
}

// Close closes the inner listener and ends a retry wait in Accept. A
// listener closed already (the socket failed under fasthttp) is not an
// error: it is closed, as asked.
func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	if err := l.Listener.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("close listener: %w", err)
	}
	return nil
}

// Open is the number of connections accepted and not yet closed.
func (l *limitListener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// admit counts a new connection from addr, or returns the cap it would
// exceed.
func (l *limitListener) admit(addr netip.Addr) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.maxConns > 0 && l.open >= l.maxConns {
		return refusedMax
	}
	if l.perIP > 0 && addr.IsValid() && l.byIP[addr] >= l.perIP {
		return refusedPerIP
	}
	l.open++
	if addr.IsValid() {
		l.byIP[addr]++
	}
	return ""
}

func (l *limitListener) release(addr netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if addr.IsValid() {
		if l.byIP[addr] <= 1 {
			delete(l.byIP, addr)
		} else {
			l.byIP[addr]--
		}
	}
}

// limitConn is an admitted connection; its first Close releases its
// place, after a lingering close if one was asked for (linger.go).
type limitConn struct {
	net.Conn
	l         *limitListener
	addr      netip.Addr
	closed    atomic.Bool
	lingering atomic.Bool
}

// NetConn is the connection limitConn wraps (as tls.Conn's NetConn): a
// range stream caps its TCP send buffer through it (httpapi).
func (c *limitConn) NetConn() net.Conn { return c.Conn }

func (c *limitConn) Close() error {
	first := c.closed.CompareAndSwap(false, true)
	if first && c.lingering.Load() {
		c.l.linger(c)
	}
	err := c.Conn.Close()
	if first {
		c.l.release(c.addr)
	}
	return err
}

// remoteAddr is the connection's peer address, IPv4-mapped IPv6 addresses
// unmapped so that one client counts once; the zero Addr when it is not
// an IP connection (then no per-address cap applies).
func remoteAddr(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			return ip.Unmap()
		}
	}
	return netip.Addr{}
}

// exhausted reports whether an accept error means the process or system
// is out of descriptors or memory for the moment: connections closing
// will cure it, so the accept loop waits and retries.
func exhausted(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

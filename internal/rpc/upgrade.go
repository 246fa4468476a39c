package rpc

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// The cluster map's log (package maplog) rides the node's own port: a
// peer sends POST LogPath with "Connection: Upgrade" and "Upgrade:
// LogProtocol", authenticated as every internal request is (Accept: the
// verified client certificate under mutual TLS, the cluster secret, or a
// loopback peer without either). The node answers 101 Switching
// Protocols and hands the connection, hijacked from the HTTP server with
// its deadlines cleared, to a LogListener, whose Accept is the log's
// network listener (maplog.NewNetwork). DialLog is the other end. So a
// node's log address is its node URL's host:port, TLS is the node's own
// when the cluster runs TLS, and no port is added.
//
// Bounds: an upgraded connection stays counted by the public listener's
// --max-connections until it closes (it is the same connection); the
// log's network bounds the connections it handshakes or answers at once
// and the time a handshake may take (--maplog-max-pending,
// maplog.Options.HandshakeTimeout); and a hijacked connection waits at
// most LogHandoffTimeout for the log to take it.

// LogPath is the internal path a peer upgrades to the log's protocol on.
const LogPath = "/v0/internal/maplog"

// LogProtocol is the Upgrade header's token.
const LogProtocol = "dhtkv-maplog/1"

// LogHandoffTimeout bounds the wait of an upgraded connection for the
// log's listener to take it; past it, the connection is closed.
const LogHandoffTimeout = 5 * time.Second

// LogListener is a net.Listener whose connections are the upgraded
// ones HandleLogUpgrade hands over. Close makes Accept return
// net.ErrClosed and closes every connection handed over after.
type LogListener struct {
	addr   net.Addr
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

// NewLogListener is a LogListener that reports addr (host:port, the
// node URL's) as its address.
func NewLogListener(addr string) *LogListener {
	return &LogListener{addr: logAddr(addr), conns: make(chan net.Conn), closed: make(chan struct{})}
}

// logAddr is a LogListener's address.
type logAddr string

func (a logAddr) Network() string { return "tcp" }
func (a logAddr) String() string  { return string(a) }

// Accept returns the next upgraded connection.
func (l *LogListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener.
func (l *LogListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

// Addr implements net.Listener.
func (l *LogListener) Addr() net.Addr { return l.addr }

// handoff gives c to Accept within LogHandoffTimeout; false if it was not
// taken (c is then the caller's to close).
func (l *LogListener) handoff(c net.Conn) bool {
	t := time.NewTimer(LogHandoffTimeout)
	defer t.Stop()
	select {
	case l.conns <- c:
		return true
	case <-l.closed:
	case <-t.C:
	}
	return false
}

// upgraded is a hijacked connection handed to the log: its Close closes
// the connection and releases the hijack handler, which holds the
// connection until then (fasthttp closes a hijacked connection when the
// handler returns).
type upgraded struct {
	net.Conn
	once sync.Once
	done chan struct{}
}

func (c *upgraded) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { close(c.done) })
	return err
}

// HandleLogUpgrade serves LogPath, once Accept let the request in: with
// no log (s.LogConns nil) 503; a request that does not ask for the
// upgrade 400; else 101 and the connection goes to s.LogConns.
func (s *Server) HandleLogUpgrade(ctx *fasthttp.RequestCtx) {
	ln := s.LogConns
	if ln == nil {
		ctx.Error("this node runs without the cluster map's log\n", fasthttp.StatusServiceUnavailable)
		return
	}
	if !headerHasToken(string(ctx.Request.Header.Peek("Connection")), "upgrade") ||
		!strings.EqualFold(string(ctx.Request.Header.Peek("Upgrade")), LogProtocol) {
		ctx.Error("bad request: "+LogPath+" needs Connection: Upgrade and Upgrade: "+LogProtocol+"\n", fasthttp.StatusBadRequest)
		return
	}
	// The connection itself (under TLS the tls.Conn): the one fasthttp
	// hands to the hijack handler ignores Close. Nothing of ctx is kept.
	conn := ctx.Conn()
	// The hijack handler writes the 101 itself; the status set here is
	// what the request metrics and the access log see.
	ctx.SetStatusCode(fasthttp.StatusSwitchingProtocols)
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(net.Conn) {
		// The server's read and write deadlines were for the request;
		// the log sets its own.
		if err := conn.SetDeadline(time.Time{}); err != nil {
			return
		}
		if _, err := io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: "+LogProtocol+"\r\n\r\n"); err != nil {
			return
		}
		c := &upgraded{Conn: conn, done: make(chan struct{})}
		if !ln.handoff(c) {
			return
		}
		select {
		case <-c.done:
		case <-ln.closed:
		}
	})
}

// headerHasToken reports whether the comma-separated header value v
// holds token (case-insensitively).
func headerHasToken(v, token string) bool {
	for f := range strings.SplitSeq(v, ",") {
		if strings.EqualFold(strings.TrimSpace(f), token) {
			return true
		}
	}
	return false
}

// LogDialOptions is how DialLog reaches a peer's log: the node's peer
// settings.
type LogDialOptions struct {
	// Dial connects to host:port (node.Config.PeerDial); nil: TCP.
	Dial func(addr string, timeout time.Duration) (net.Conn, error)
	// TLS, when set, wraps the connection (the node's client config,
	// with its certificate under mutual TLS); nil: plain HTTP.
	TLS *tls.Config
	// Secret is sent in SecretHeader when set.
	Secret string
}

// maxUpgradeAnswer bounds the answer DialLog reads before the upgrade.
const maxUpgradeAnswer = 64 << 10

// DialLog opens a connection to the log of the node at addr (its URL's
// host:port), upgraded to LogProtocol, within timeout, or until ctx ends
// (a node stopping: maplog.Network.Interrupt).
func DialLog(ctx context.Context, addr string, timeout time.Duration, o LogDialOptions) (net.Conn, error) {
	deadline := time.Now().Add(timeout)
	var raw net.Conn
	var err error
	if o.Dial != nil {
		raw, err = o.Dial(addr, timeout)
	} else {
		raw, err = (&net.Dialer{Timeout: timeout}).DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	if err := raw.SetDeadline(deadline); err != nil {
		raw.Close()
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	// ctx ending ends the upgrade: its reads and writes fail at once.
	stop := context.AfterFunc(ctx, func() { _ = raw.SetDeadline(time.Now()) })
	c, err := upgradeLog(raw, addr, o)
	if !stop() { // ctx ended: the deadline was cut, whatever came of it
		if err == nil {
			err = ctx.Err()
		} else {
			err = fmt.Errorf("%w: %w", ctx.Err(), err)
		}
	}
	if err != nil {
		raw.Close()
		return nil, fmt.Errorf("upgrade %s to the cluster map's log: %w", addr, err)
	}
	return c, nil
}

func upgradeLog(raw net.Conn, addr string, o LogDialOptions) (net.Conn, error) {
	c := raw
	if o.TLS != nil {
		cfg := o.TLS.Clone()
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
	var req strings.Builder
	fmt.Fprintf(&req, "POST %s HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: %s\r\nContent-Length: 0\r\n", LogPath, addr, LogProtocol)
	if o.Secret != "" {
		fmt.Fprintf(&req, "%s: %s\r\n", SecretHeader, o.Secret)
	}
	req.WriteString("\r\n")
	if _, err := io.WriteString(c, req.String()); err != nil {
		return nil, fmt.Errorf("write request: %w", err)
	}
	br := bufio.NewReader(io.LimitReader(c, maxUpgradeAnswer))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return nil, fmt.Errorf("read answer: %w", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		return nil, fmt.Errorf("%w: %s: %s", errLogRefused, resp.Status, strings.TrimSpace(string(body)))
	}
	if br.Buffered() > 0 {
		// The log's protocol has the dialer speak first: the peer sends
		// nothing after 101 before it reads our hello.
		return nil, errors.New("bytes after the 101 answer")
	}
	return c, c.SetDeadline(time.Time{})
}

var errLogRefused = errors.New("refused")

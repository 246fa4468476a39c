package node

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/dhtkv/dhtkv/internal/lograte"
)

// Plain HTTP sent to the public listener when it speaks TLS. crypto/tls
// refuses the first bytes ("first record does not look like a TLS
// handshake") and fasthttp closes the connection without a word, so a
// client that forgot https:// saw an empty reply (curl: (52), dhtkvctl:
// EOF) and the node logged nothing above debug. Like net/http, the node
// now recognises an HTTP request line where the TLS record header should
// be, answers 400 in plain text, and logs a warning, at most once a
// minute per client address.

const (
	// plainHTTPWarnEvery is how often one client address may cause a
	// warning.
	plainHTTPWarnEvery = time.Minute
	// plainHTTPMaxAddrs bounds the addresses remembered: beyond them,
	// every other address shares one warning per plainHTTPWarnEvery.
	plainHTTPMaxAddrs = 1024
)

// plainHTTPAnswer is the whole answer to a plain HTTP request on the TLS
// port; the connection is closed after it.
var plainHTTPAnswer = refusal(400, "Bad Request",
	"Client sent an HTTP request to an HTTPS server: this port speaks TLS (use https://)")

// tlsListener is tls.NewListener's listener whose connections answer a
// plain HTTP request with plainHTTPAnswer.
type tlsListener struct {
	net.Listener // from tls.NewListener
	warn         *plainHTTPWarner
}

func newTLSListener(inner net.Listener, cfg *tls.Config, log *slog.Logger) *tlsListener {
	return &tlsListener{Listener: tls.NewListener(inner, cfg), warn: newPlainHTTPWarner(log, time.Now)}
}

func (l *tlsListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &tlsConn{Conn: c.(*tls.Conn), warn: l.warn}, nil
}

// tlsConn is a server-side *tls.Conn whose Handshake answers plain HTTP.
// fasthttp finds it a TLS connection as it finds a *tls.Conn (through
// the Handshake and ConnectionState methods), runs Handshake first in the
// connection's worker, and closes the connection when a request cannot be
// read after a failed handshake.
type tlsConn struct {
	*tls.Conn
	warn *plainHTTPWarner
}

func (c *tlsConn) Handshake() error {
	err := c.Conn.Handshake()
	var rh tls.RecordHeaderError
	if errors.As(err, &rh) && rh.Conn != nil && looksLikeHTTP(rh.RecordHeader) {
		// On the raw connection: no TLS record can carry it.
		_ = rh.Conn.SetWriteDeadline(time.Now().Add(refuseWriteTimeout))
		_, _ = rh.Conn.Write(plainHTTPAnswer)
		c.warn.warn(remoteAddr(rh.Conn), c.LocalAddr())
		return fmt.Errorf("plain HTTP request on the TLS port: %w", err)
	}
	return err
}

// httpMethods are the request methods whose request line looksLikeHTTP
// recognises.
var httpMethods = []string{"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "CONNECT", "TRACE"}

// looksLikeHTTP reports whether the first five bytes of a connection, read
// as a TLS record header, are the start of an HTTP request line (a
// method, a space). A TLS record starts with a content type below 0x20,
// never a letter.
func looksLikeHTTP(hdr [5]byte) bool {
	for _, m := range httpMethods {
		line := m + " "
		n := min(len(line), len(hdr))
		if string(hdr[:n]) == line[:n] {
			return true
		}
	}
	return false
}

// plainHTTPWarner logs plain HTTP requests on the TLS port at warn level,
// at most once per plainHTTPWarnEvery per client address. It remembers at
// most plainHTTPMaxAddrs addresses; when all of them warned within the
// interval, the addresses beyond share one more slot (the zero Addr).
type plainHTTPWarner struct {
	log   *slog.Logger
	limit *lograte.Limiter[netip.Addr]
}

func newPlainHTTPWarner(log *slog.Logger, now func() time.Time) *plainHTTPWarner {
	return &plainHTTPWarner{log: log, limit: lograte.New[netip.Addr](plainHTTPWarnEvery, plainHTTPMaxAddrs, now)}
}

// warn records a plain HTTP request from addr to local and logs it if no
// warning about addr was logged within plainHTTPWarnEvery.
func (w *plainHTTPWarner) warn(addr netip.Addr, local net.Addr) {
	suppressed, ok := w.due(addr)
	if !ok {
		return
	}
	client := addr.String()
	if !addr.IsValid() {
		client = "other addresses"
	}
	w.log.Warn("plain HTTP request on the TLS port: answered 400; the client must use https://",
		"client", client, "listen", local.String(), "suppressed_since_last_warning", suppressed,
		"warns_every", plainHTTPWarnEvery)
}

// due reports whether a warning about addr is due now and records it if
// so, with how many requests from addr went without one since the last.
func (w *plainHTTPWarner) due(addr netip.Addr) (suppressed int, ok bool) {
	v := w.limit.Note(addr)
	return v.Suppressed, v.Log
}

package rpc

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/testpki"
)

// A ping's error says whether a process at the peer's address answered
// it (Answered): any HTTP status (but a proxy's 502 or 504, which says the
// node behind it did not answer) and any TLS handshake the other end took
// part in are answers, so a node that refuses this one (another cluster
// secret, another CA, TLS on one side only) is alive; a connection
// refused, left unanswered or closed unanswered is silence. A replace or
// remove counts a node dead by it (package membership).
func TestAnswered(t *testing.T) {
	status := func(code int, body string) func() string {
		return func() string {
			s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(code)
				_, _ = w.Write([]byte(body))
			}))
			t.Cleanup(s.Close)
			return s.URL
		}
	}
	ca, other := testpki.NewCA(t, "ca"), testpki.NewCA(t, "other")
	serveTLS := func(ca *testpki.CA, clientAuth tls.ClientAuthType, maxVersion uint16) func() string {
		return func() string {
			cert, key, _ := ca.Issue("127.0.0.1", x509.ExtKeyUsageServerAuth)
			s := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			s.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshakes refused
			s.TLS = &tls.Config{Certificates: []tls.Certificate{testpki.KeyPair(t, cert, key)},
				ClientAuth: clientAuth, ClientCAs: ca.Pool, MinVersion: tls.VersionTLS12, MaxVersion: maxVersion}
			s.StartTLS()
			t.Cleanup(s.Close)
			return "http://" + s.Listener.Addr().String()
		}
	}
	closed := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := ln.Addr().String()
		require.NoError(t, ln.Close())
		return "http://" + addr
	}
	// listener accepts connections and hands each to conn.
	listener := func(conn func(net.Conn)) func() string {
		return func() string {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			t.Cleanup(func() { _ = ln.Close() })
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					conn(c)
				}
			}()
			return "http://" + ln.Addr().String()
		}
	}
	// late is this node's own 504 for a batch past its deadline, which
	// carries its clock; a proxy's 502 or 504 does not.
	late := func() string {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set(TimeHeader, strconv.FormatInt(time.Now().UnixMicro(), 10))
			w.WriteHeader(http.StatusGatewayTimeout)
		}))
		t.Cleanup(s.Close)
		return s.URL
	}
	unanswered := listener(func(c net.Conn) { t.Cleanup(func() { _ = c.Close() }) }) // reads nothing, answers nothing
	hangsUp := listener(func(c net.Conn) { _ = c.Close() })                          // closes at once, as a cut link may
	for _, tc := range []struct {
		name     string
		url      func() string
		tls      *tls.Config
		answered bool
	}{
		{"200", status(http.StatusOK, ""), nil, true},
		{"403: another cluster secret", status(http.StatusForbidden, "forbidden: missing or wrong cluster secret\n"), nil, true},
		{"409: a newer map", status(http.StatusConflict, "not a map\n"), nil, true},
		{"503: shutting down", status(http.StatusServiceUnavailable, "shutting down\n"), nil, true},
		{"504 of a late batch, its clock with it", late, nil, true},
		{"a proxy's 502: the node behind it does not answer", status(http.StatusBadGateway, "upstream connect error\n"), nil, false},
		{"a proxy's 504: the node behind it does not answer", status(http.StatusGatewayTimeout, "upstream request timeout\n"), nil, false},
		{"its certificate from a CA this node does not trust", serveTLS(other, tls.NoClientCert, 0), ca.ClientConfig(), true},
		{"it wants a client certificate this node does not have (TLS 1.2: its alert)", serveTLS(ca, tls.RequireAndVerifyClientCert, tls.VersionTLS12), ca.ClientConfig(), true},
		{"it wants a client certificate this node does not have (TLS 1.3: a closed connection)", serveTLS(ca, tls.RequireAndVerifyClientCert, 0), ca.ClientConfig(), false},
		{"plain HTTP where TLS is asked", status(http.StatusOK, ""), ca.ClientConfig(), true},
		{"connection refused", closed, nil, false},
		{"connected, never answered", unanswered, nil, false},
		{"connected, closed unanswered", hangsUp, nil, false},
		{"connected over TLS, never answered", unanswered, ca.ClientConfig(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := NewPeer(tc.url(), PeerOptions{Timeout: 200 * time.Millisecond, TLS: tc.tls}, nil)
			defer p.Close()
			_, err := p.Ping(0, time.Now().Add(200*time.Millisecond))
			if tc.name != "200" {
				require.Error(t, err)
			}
			require.Equal(t, tc.answered, Answered(err), "%v", err)
		})
	}
}

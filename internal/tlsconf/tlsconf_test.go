package tlsconf_test

import (
	"crypto/tls"
	"crypto/x509"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dhtkv/dhtkv/internal/testpki"
	"github.com/dhtkv/dhtkv/internal/tlsconf"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// handshake runs one TLS handshake over a real loopback connection between
// server and client and returns the server side's state when it
// succeeded, and each side's error. Both sides read once after the handshake, so
// that an alert the other sends after its own handshake (TLS 1.3: the
// server verifies the client's certificate after the client is done)
// surfaces as an error.
func handshake(t testing.TB, server, client *tls.Config) (st *tls.ConnectionState, clientErr, serverErr error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	type result struct {
		err error
		st  tls.ConnectionState
	}
	done := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer c.Close()
		tc := tls.Server(c, server)
		_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
		if err := tc.Handshake(); err != nil {
			done <- result{err: err}
			return
		}
		// The client's request: one byte, answered with one byte.
		if _, err := tc.Read(make([]byte, 1)); err != nil {
			done <- result{err: err}
			return
		}
		_, err = tc.Write([]byte{1})
		done <- result{err: err, st: tc.ConnectionState()}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	if client.ServerName == "" {
		client = client.Clone()
		client.ServerName = "127.0.0.1" // as an HTTP client sets it from the URL
	}
	tc := tls.Client(c, client)
	_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
	clientErr = tc.Handshake()
	if clientErr == nil {
		if _, clientErr = tc.Write([]byte{1}); clientErr == nil {
			_, clientErr = tc.Read(make([]byte, 1))
		}
	}
	tc.Close()
	r := <-done
	if r.err == nil {
		st = &r.st
	}
	return st, clientErr, r.err
}

func load(t testing.TB, f tlsconf.Files) *tlsconf.Certs {
	t.Helper()
	c, err := tlsconf.Load(f)
	require.NoError(t, err)
	return c
}

// TestLoadRefuses: what a node refuses to start with, each with a reason
// naming the flag.
func TestLoadRefuses(t *testing.T) {
	ca, other := testpki.NewCA(t, "cluster"), testpki.NewCA(t, "other")
	cert, key, _ := ca.Issue("node")
	_, otherKey, _ := ca.Issue("node-b")
	foreign, foreignKey, _ := other.Issue("foreign")
	serverOnly, serverOnlyKey, _ := ca.Issue("server-only", x509.ExtKeyUsageServerAuth)
	garbage := filepath.Join(t.TempDir(), "garbage.pem")
	require.NoError(t, os.WriteFile(garbage, []byte("not a certificate\n"), 0o600))
	for _, tc := range []struct {
		name string
		f    tlsconf.Files
		err  string
	}{
		{"key missing", tlsconf.Files{Cert: cert}, "give both"},
		{"cert missing", tlsconf.Files{Key: key}, "give both"},
		{"no such file", tlsconf.Files{Cert: cert + ".nope", Key: key}, "--tls-cert"},
		{"key of another certificate", tlsconf.Files{Cert: cert, Key: otherKey}, "private key does not match"},
		{"not PEM", tlsconf.Files{Cert: garbage, Key: key}, "--tls-cert"},
		{"CA file missing", tlsconf.Files{Cert: cert, Key: key, PeerCA: garbage + ".nope"}, "--peer-tls-ca"},
		{"CA file not PEM", tlsconf.Files{Cert: cert, Key: key, PeerCA: garbage}, "no PEM certificate"},
		{"certificate of another CA", tlsconf.Files{Cert: foreign, Key: foreignKey, PeerCA: ca.File}, "unknown authority"},
		{"no clientAuth usage", tlsconf.Files{Cert: serverOnly, Key: serverOnlyKey, PeerCA: ca.File}, "as clientAuth"},
	} {
		_, err := tlsconf.Load(tc.f)
		require.ErrorContains(t, err, tc.err, tc.name)
	}
	// The same files in working order.
	load(t, tlsconf.Files{Cert: cert, Key: key, PeerCA: ca.File})
	load(t, tlsconf.Files{Cert: serverOnly, Key: serverOnlyKey}) // no mutual TLS: serverAuth is enough
}

// TestMutualHandshakes: who the listener of a node under mutual TLS lets
// in, and whom it marks as a node (PeerVerified), and whom a node's
// client accepts as a server.
func TestMutualHandshakes(t *testing.T) {
	ca, other := testpki.NewCA(t, "cluster"), testpki.NewCA(t, "other")
	nodeA := func() tlsconf.Files {
		c, k, _ := ca.Issue("a")
		return tlsconf.Files{Cert: c, Key: k, PeerCA: ca.File}
	}()
	nodeB := func() tlsconf.Files {
		c, k, _ := ca.Issue("b")
		return tlsconf.Files{Cert: c, Key: k, PeerCA: ca.File}
	}()
	rogue := func() tlsconf.Files { // a node of another cluster: its own CA
		c, k, _ := other.Issue("rogue")
		return tlsconf.Files{Cert: c, Key: k, PeerCA: other.File}
	}()
	serverOnly := func() tls.Certificate {
		c, k, _ := ca.Issue("server-only", x509.ExtKeyUsageServerAuth)
		return testpki.KeyPair(t, c, k)
	}()
	otherCert := func() tls.Certificate {
		c, k, _ := other.Issue("other-client")
		return testpki.KeyPair(t, c, k)
	}()
	a, b, r := load(t, nodeA), load(t, nodeB), load(t, rogue)

	for _, tc := range []struct {
		name           string
		server, client *tls.Config
		ok, node       bool // handshake succeeds; the server sees a verified node
	}{
		{"node to node", a.ServerConfig(), b.ClientConfig(), true, true},
		{"public client, no certificate", a.ServerConfig(), ca.ClientConfig(), true, false},
		// Go's client leaves out a certificate whose issuer is not among
		// the CAs the server names in its request: it arrives as a public
		// client. Sent anyway, the handshake fails.
		{"client certificate of another CA", a.ServerConfig(), ca.ClientConfig(otherCert), true, false},
		{"client certificate of another CA, sent anyway", a.ServerConfig(), always(ca.ClientConfig(), otherCert), false, false},
		{"client certificate without clientAuth", a.ServerConfig(), ca.ClientConfig(serverOnly), false, false},
		{"rogue node calls a node", a.ServerConfig(), r.ClientConfig(), false, false},
		{"node calls a rogue node", r.ServerConfig(), a.ClientConfig(), false, false},
	} {
		st, clientErr, serverErr := handshake(t, tc.server, tc.client)
		if !tc.ok {
			require.True(t, clientErr != nil || serverErr != nil, "%s: handshake succeeded", tc.name)
			continue
		}
		require.NoError(t, clientErr, tc.name)
		require.NoError(t, serverErr, tc.name)
		require.Equal(t, tc.node, tlsconf.PeerVerified(st), tc.name)
	}
	require.False(t, tlsconf.PeerVerified(nil))
}

// TestReload: a renewed pair is served by the next handshake, a CA
// replaced in the bundle stops the old one's certificates, and a reload
// that fails keeps what was in use.
func TestReload(t *testing.T) {
	ca, other := testpki.NewCA(t, "cluster"), testpki.NewCA(t, "other")
	certFile, keyFile, first := ca.Issue("a")
	caFile := filepath.Join(t.TempDir(), "peers.pem")
	copyFile(t, ca.File, caFile)
	a := load(t, tlsconf.Files{Cert: certFile, Key: keyFile, PeerCA: caFile})
	bc, bk, _ := ca.Issue("b")
	b := load(t, tlsconf.Files{Cert: bc, Key: bk, PeerCA: ca.File})

	servedToClient := func() *big.Int {
		cfg := ca.ClientConfig()
		var got *big.Int
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			got = cs.PeerCertificates[0].SerialNumber
			return nil
		}
		_, clientErr, serverErr := handshake(t, a.ServerConfig(), cfg)
		require.NoError(t, clientErr)
		require.NoError(t, serverErr)
		return got
	}
	st, _, _ := handshake(t, a.ServerConfig(), b.ClientConfig())
	require.True(t, tlsconf.PeerVerified(st), "b is a node to a")
	require.Equal(t, first.SerialNumber, servedToClient())
	require.Equal(t, first.SerialNumber, a.Leaf().SerialNumber)

	// Renewal: same CA, new serial.
	second := ca.IssueTo(certFile, keyFile, "a")
	require.NoError(t, a.Reload())
	require.Equal(t, second.SerialNumber, servedToClient())
	require.Equal(t, second.SerialNumber, a.Leaf().SerialNumber)

	// A broken file: the reload fails, the renewed pair stays.
	require.NoError(t, os.WriteFile(keyFile, []byte("truncated"), 0o600))
	require.Error(t, a.Reload())
	require.Equal(t, second.SerialNumber, servedToClient())

	// The CA bundle now names another CA only (and a's own certificate
	// from it): b's certificate no longer gets in.
	oc, ok, _ := other.Issue("a2")
	copyFile(t, oc, certFile)
	copyFile(t, ok, keyFile)
	copyFile(t, other.File, caFile)
	require.NoError(t, a.Reload())
	_, clientErr, serverErr := handshake(t, a.ServerConfig(), b.ClientConfig())
	require.True(t, clientErr != nil || serverErr != nil, "a node of the removed CA still got in")
}

// always makes cfg present cert whatever CAs the server asks for.
func always(cfg *tls.Config, cert tls.Certificate) *tls.Config {
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
	return cfg
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(to, b, 0o600))
}

// BenchmarkMutualHandshake is one full handshake between two nodes under
// mutual TLS (ECDSA P-256, TLS 1.3, both certificates verified), both
// sides in this process, on a fresh loopback connection: what a node pays
// for each new connection to or from a peer (pooled connections pay it
// once).
func BenchmarkMutualHandshake(b *testing.B) {
	ca := testpki.NewCA(b, "cluster")
	ac, ak, _ := ca.Issue("a")
	bc, bk, _ := ca.Issue("b")
	a := load(b, tlsconf.Files{Cert: ac, Key: ak, PeerCA: ca.File})
	n := load(b, tlsconf.Files{Cert: bc, Key: bk, PeerCA: ca.File})
	server, client := a.ServerConfig(), n.ClientConfig()
	// No resumption: every iteration is a full handshake.
	for b.Loop() {
		st, clientErr, serverErr := handshake(b, server, client)
		if clientErr != nil || serverErr != nil || !tlsconf.PeerVerified(st) {
			b.Fatal(clientErr, serverErr)
		}
	}
}

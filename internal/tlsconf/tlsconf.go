// Package tlsconf builds a node's TLS configurations from PEM files, the
// public listener's and the one it calls other nodes with, and reloads
// them without a restart (docs/security.md).
//
// Both configurations are fixed *tls.Config values whose callbacks read
// the current material through one atomic pointer: fasthttp clones a
// client configuration once per address and keeps the clone, and the
// listener's configuration is shared by every connection, so swapping
// fields of a config in place would be neither seen nor race-free.
// Reload builds a complete new generation (certificate, key, CA pool and
// the server configuration made of them), validates it, and swaps it in
// whole; a reload that fails leaves the generation in use untouched.
// Connections already open keep the certificates they were opened with.
package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"
)

// Files names the PEM files a node's TLS is made of.
type Files struct {
	// Cert is the certificate chain, leaf first (--tls-cert).
	Cert string
	// Key is Cert's private key (--tls-key).
	Key string
	// PeerCA is a bundle of the CA certificates that other nodes'
	// certificates must chain to (--peer-tls-ca). Empty: no mutual TLS;
	// other nodes' server certificates are then verified against the
	// system's roots, and no client certificate is asked for.
	PeerCA string
}

// Certs is a node's TLS material and the configurations that use it.
//
// Invariant: cur always points at a complete generation that passed
// every check of load; it is replaced whole (Reload) or not at all.
type Certs struct {
	files  Files
	cur    atomic.Pointer[generation]
	server *tls.Config
	client *tls.Config
}

// generation is one reading of the files.
type generation struct {
	cert  *tls.Certificate // Leaf set
	peers *x509.CertPool   // nil without Files.PeerCA
	// server is what the listener hands to a handshake
	// (GetConfigForClient): the certificate and the CA pool of the same
	// generation, never one without the other.
	server *tls.Config
}

// Load reads the files and checks them: the key matches the certificate,
// the certificate has not expired, and with PeerCA it chains to one of
// the CAs for both server and client authentication, since other nodes
// verify it in both roles.
func Load(f Files) (*Certs, error) {
	if f.Cert == "" || f.Key == "" {
		return nil, errors.New("--tls-cert and --tls-key: give both")
	}
	g, err := load(f, time.Now())
	if err != nil {
		return nil, err
	}
	c := &Certs{files: f}
	c.cur.Store(g)
	c.server = &tls.Config{
		MinVersion: tls.VersionTLS12,
		// Every handshake takes the current generation's configuration.
		// Session tickets stay those of this config (crypto/tls uses the
		// parent's keys when the returned config has none), and a
		// resumed session's client certificate is checked against the
		// returned config's ClientCAs, so a CA removed by a reload stops
		// resumptions too.
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return c.cur.Load().server, nil },
	}
	if f.PeerCA == "" {
		// Public CAs, hostname checked: Go's own verification.
		c.client = &tls.Config{MinVersion: tls.VersionTLS12}
	} else {
		c.client = &tls.Config{
			MinVersion: tls.VersionTLS12,
			// Go's verification would use a CA pool fixed in this
			// config (and in fasthttp's clone of it, kept for the
			// process's life); verifyPeer uses the current generation's
			// instead. It is not skipped: VerifyConnection runs on every
			// handshake and fails it.
			InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection
			VerifyConnection:   c.verifyPeer,
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
				return c.cur.Load().cert, nil
			},
		}
	}
	return c, nil
}

// Reload reads the files again and, if they pass Load's checks, makes
// them the ones every new handshake uses. On error nothing changes.
func (c *Certs) Reload() error {
	g, err := load(c.files, time.Now())
	if err != nil {
		return err
	}
	c.cur.Store(g)
	return nil
}

// Mutual reports whether other nodes must present a certificate from
// Files.PeerCA (mutual TLS).
func (c *Certs) Mutual() bool { return c.files.PeerCA != "" }

// Leaf is the certificate served now.
func (c *Certs) Leaf() *x509.Certificate { return c.cur.Load().cert.Leaf }

// ServerConfig is the public listener's configuration. With PeerCA a
// client certificate is verified if one is given
// (tls.VerifyClientCertIfGiven): public clients need none, and whether a
// request may reach the internal endpoints is decided per request from
// the connection's verified chains (PeerVerified).
func (c *Certs) ServerConfig() *tls.Config { return c.server }

// ClientConfig is the configuration for calling other nodes. With PeerCA
// it presents this node's certificate and accepts a server certificate
// that chains to one of the CAs with the serverAuth usage, whatever names
// it carries: every certificate of the cluster's CA is a member (see
// docs/security.md). Without PeerCA it is Go's default verification
// against the system's roots, hostname included.
func (c *Certs) ClientConfig() *tls.Config { return c.client }

// PeerVerified reports whether a server-side connection state carries a
// client certificate verified against the CA pool: crypto/tls verified
// it in the handshake (or, for a resumed session, checked that its chain
// still ends at a CA of the current pool).
func PeerVerified(cs *tls.ConnectionState) bool { return cs != nil && len(cs.VerifiedChains) > 0 }

// LoadPool reads a PEM bundle of CA certificates into a pool. A file
// without a certificate is an error.
func LoadPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no PEM certificate in it", path)
	}
	return pool, nil
}

// verifyPeer verifies, on the client side, the other node's certificate
// chain against the current CA pool.
func (c *Certs) verifyPeer(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("tls: the other node sent no certificate")
	}
	opts := x509.VerifyOptions{
		Roots:         c.cur.Load().peers,
		Intermediates: x509.NewCertPool(),
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, ic := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(ic)
	}
	if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
		return fmt.Errorf("tls: the other node's certificate (%s) is not from --peer-tls-ca: %w", cs.PeerCertificates[0].Subject, err)
	}
	return nil
}

// load reads and checks one generation; now is the time its certificate
// must be valid at.
func load(f Files, now time.Time) (*generation, error) {
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert %s, --tls-key %s: %w", f.Cert, f.Key, err)
	}
	if cert.Leaf == nil { // LoadX509KeyPair sets it unless GODEBUG x509keypairleaf=0
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("--tls-cert %s: %w", f.Cert, err)
		}
	}
	leaf := cert.Leaf
	if now.After(leaf.NotAfter) {
		return nil, fmt.Errorf("--tls-cert %s: expired at %s", f.Cert, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	g := &generation{cert: &cert, server: &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		// fasthttp speaks HTTP/1.1 only: a client must not pick h2.
		NextProtos: []string{"http/1.1"},
	}}
	if f.PeerCA == "" {
		return g, nil
	}
	if g.peers, err = LoadPool(f.PeerCA); err != nil {
		return nil, fmt.Errorf("--peer-tls-ca: %w", err)
	}
	// Other nodes verify this certificate as a server and, under mutual
	// TLS, as a client: refuse one they would refuse.
	inter := x509.NewCertPool()
	for _, der := range cert.Certificate[1:] {
		ic, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert %s: intermediate: %w", f.Cert, err)
		}
		inter.AddCert(ic)
	}
	for _, u := range []struct {
		eku  x509.ExtKeyUsage
		name string
	}{{x509.ExtKeyUsageServerAuth, "serverAuth"}, {x509.ExtKeyUsageClientAuth, "clientAuth"}} {
		opts := x509.VerifyOptions{Roots: g.peers, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{u.eku}}
		if _, err := leaf.Verify(opts); err != nil {
			return nil, fmt.Errorf("--tls-cert %s: other nodes would refuse it as %s under --peer-tls-ca %s "+
				"(a node's certificate must chain to it and allow both serverAuth and clientAuth): %w", f.Cert, u.name, f.PeerCA, err)
		}
	}
	g.server.ClientAuth = tls.VerifyClientCertIfGiven
	g.server.ClientCAs = g.peers
	return g, nil
}

// Package testpki makes certificate authorities and certificates in memory
// for tests (crypto/x509, ECDSA P-256: fast to generate under -race), and
// writes them as the PEM files dhtkv's --tls-cert, --tls-key and
// --peer-tls-ca name. Nothing here is fit for production: keys live in
// the test's temporary directory.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// CA is a certificate authority of one test. Its files are under the
// test's temporary directory.
type CA struct {
	t    testing.TB
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// File is the CA certificate's PEM file (what --peer-tls-ca names).
	File string
	// Pool holds the CA certificate, for a test client's RootCAs.
	Pool *x509.CertPool
}

// NewCA makes a self-signed CA named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := template(t, name)
	tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	cert, der := create(t, tmpl, tmpl, key, key)
	ca := &CA{t: t, dir: t.TempDir(), cert: cert, key: key, Pool: x509.NewCertPool()}
	ca.Pool.AddCert(cert)
	ca.File = filepath.Join(ca.dir, "ca.pem")
	writePEM(t, ca.File, "CERTIFICATE", der)
	return ca
}

// Node is the extended key usages of a node's certificate: it serves
// (serverAuth) and, under mutual TLS, calls other nodes (clientAuth).
var Node = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}

// Issue makes a certificate for 127.0.0.1, ::1 and localhost with the
// given extended key usages (none given: Node), writes it and its key as
// PEM files named after name, and returns their paths and the
// certificate.
func (ca *CA) Issue(name string, eku ...x509.ExtKeyUsage) (certFile, keyFile string, cert *x509.Certificate) {
	ca.t.Helper()
	certFile = filepath.Join(ca.dir, name+".pem")
	keyFile = filepath.Join(ca.dir, name+"-key.pem")
	return certFile, keyFile, ca.IssueTo(certFile, keyFile, name, eku...)
}

// IssueTo is Issue writing to the given files, replacing what they hold
// (a certificate renewal).
func (ca *CA) IssueTo(certFile, keyFile, name string, eku ...x509.ExtKeyUsage) *x509.Certificate {
	t := ca.t
	t.Helper()
	if len(eku) == 0 {
		eku = Node
	}
	key := newKey(t)
	tmpl := template(t, name)
	tmpl.KeyUsage, tmpl.ExtKeyUsage = x509.KeyUsageDigitalSignature, eku
	tmpl.DNSNames = []string{"localhost"}
	tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	cert, der := create(t, tmpl, ca.cert, key, ca.key)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	// The key first: a reader that sees the new certificate then finds
	// its key (a reload between the two writes fails and is retried).
	writePEM(t, keyFile, "PRIVATE KEY", keyDER)
	writePEM(t, certFile, "CERTIFICATE", der)
	return cert
}

// KeyPair loads certFile and keyFile as a test client's certificate.
func KeyPair(t testing.TB, certFile, keyFile string) tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	require.NoError(t, err)
	return c
}

// ClientConfig is a test client's TLS configuration: it trusts ca and
// presents certs (none: no client certificate).
func (ca *CA) ClientConfig(certs ...tls.Certificate) *tls.Config {
	return &tls.Config{RootCAs: ca.Pool, Certificates: certs, MinVersion: tls.VersionTLS12}
}

// Served is the certificate a new TLS connection to addr (host:port)
// is served, verified with cfg.
func Served(addr string, cfg *tls.Config) (*x509.Certificate, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0], nil
}

// Pool holds the certificates of cas: a client that trusts them all.
func Pool(cas ...*CA) *x509.CertPool {
	p := x509.NewCertPool()
	for _, ca := range cas {
		p.AddCert(ca.cert)
	}
	return p
}

// template is a certificate named name with a fresh serial, valid from
// an hour ago (clock differences) for a day.
func template(t testing.TB, name string) *x509.Certificate {
	return &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
	}
}

// create signs tmpl, for key, with parent's key signer.
func create(t testing.TB, tmpl, parent *x509.Certificate, key, signer *ecdsa.PrivateKey) (*x509.Certificate, []byte) {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return cert, der
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	return key
}

// serial is a random 128-bit serial number, as CAs issue them.
func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	require.NoError(t, err)
	return n
}

// writePEM replaces path with one PEM block, mode 600 (a key's mode).
func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
	require.NoError(t, os.Rename(tmp, path))
}

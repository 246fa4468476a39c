package node_test

import (
	"crypto/tls"
	"math/big"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
	"github.com/dhtkv/dhtkv/internal/testpki"
)

// withTLS serves a node's listener with a certificate from ca and mutual
// TLS; it returns the certificate's files.
func withTLS(ca *testpki.CA, files *[2]string) testcluster.Option {
	return func(_ int, cfg *node.Config) {
		cfg.TLSCert, cfg.TLSKey, _ = ca.Issue("node")
		cfg.PeerTLSCA = ca.File
		*files = [2]string{cfg.TLSCert, cfg.TLSKey}
	}
}

// servedSerial is the serial number of the certificate a new TLS
// connection to addr is served.
func servedSerial(t *testing.T, ca *testpki.CA, addr string) *big.Int {
	t.Helper()
	c, err := testpki.Served(addr, ca.ClientConfig())
	require.NoError(t, err)
	return c.SerialNumber
}

// TestReloadServesRenewedCertificate: Reload makes the next connection get
// the renewed certificate (same CA, new serial) without a restart, and a
// reload of broken files keeps the one in use.
func TestReloadServesRenewedCertificate(t *testing.T) {
	ca := testpki.NewCA(t, "cluster")
	var files [2]string
	c, _ := testcluster.Single(t, withTLS(ca, &files))
	n := c.Node(0)
	first := servedSerial(t, ca, n.Addr())

	renewed := ca.IssueTo(files[0], files[1], "node")
	require.NotEqual(t, first, renewed.SerialNumber)
	require.NoError(t, n.Reload())
	require.Equal(t, renewed.SerialNumber, servedSerial(t, ca, n.Addr()))

	require.NoError(t, os.WriteFile(files[0], []byte("-----BEGIN CERTIFICATE-----\ntruncated"), 0o600))
	require.Error(t, n.Reload())
	require.Equal(t, renewed.SerialNumber, servedSerial(t, ca, n.Addr()), "a failed reload keeps the certificate in use")

	plain, _ := testcluster.Single(t)
	require.NoError(t, plain.Node(0).Reload(), "without TLS there is nothing to reload")
}

// TestMaxConnectionsWithTLS: the connection cap counts TLS connections
// (the limit listener is under the TLS listener): beyond it a connection
// is closed before its handshake, and once connections close the node
// takes new ones.
func TestMaxConnectionsWithTLS(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	const capacity = 4
	ca := testpki.NewCA(t, "cluster")
	var files [2]string
	c, _ := testcluster.Single(t, withTLS(ca, &files), func(_ int, cfg *node.Config) { cfg.MaxConnections = capacity })
	n := c.Node(0)
	cl := testcluster.NewTLSClient(t, ca.ClientConfig())
	defer cl.HTTP.CloseIdleConnections()
	base := "https://" + n.Addr()
	held := make([]*tls.Conn, capacity)
	for i := range held {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", n.Addr(), ca.ClientConfig())
		require.NoError(t, err, "connection %d of %d", i+1, capacity)
		held[i] = c
	}
	_, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", n.Addr(), ca.ClientConfig())
	require.Error(t, err, "a connection beyond the cap is closed before its handshake")
	require.Equal(t, 1.0, testcluster.Metric(t, n.Registry(), "dhtkv_connections_refused_total", "reason", "max_connections"))
	for _, c := range held {
		require.NoError(t, c.Close())
	}
	require.Eventually(t, func() bool {
		resp, err := cl.HTTP.Get(base + "/v0/status")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}, 10*time.Second, 10*time.Millisecond, "the node serves again once the connections closed")
}

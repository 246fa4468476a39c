package node_test

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dhtkv/dhtkv/internal/logbuf"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/leakcheck"
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
	leakcheck.Register(t)
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

// TestPlainHTTPToTLSPort: a plain HTTP request to a node that speaks TLS
// gets a 400 saying so (not an empty reply), whatever its method; the node
// logs it at warn level once for the client's address however often it
// comes; and the port still serves TLS.
func TestPlainHTTPToTLSPort(t *testing.T) {
	leakcheck.Register(t)
	ca := testpki.NewCA(t, "cluster")
	var files [2]string
	var logs logbuf.Buffer
	c, _ := testcluster.Single(t, withTLS(ca, &files), func(_ int, cfg *node.Config) {
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	n := c.Node(0)
	for _, req := range []string{
		"GET /v0/status HTTP/1.1\r\nHost: x\r\n\r\n",
		"PUT /v0/entity?id=k HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nv",
		"DELETE /v0/entity?id=k HTTP/1.1\r\nHost: x\r\n\r\n",
		"HEAD /v0/status HTTP/1.0\r\n\r\n",
		"POST /v0/entities HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
	} {
		method, _, _ := strings.Cut(req, " ")
		t.Run(method, func(t *testing.T) {
			conn, err := net.DialTimeout("tcp", n.Addr(), 5*time.Second)
			require.NoError(t, err)
			defer conn.Close()
			require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
			_, err = io.WriteString(conn, req)
			require.NoError(t, err)
			answer, err := io.ReadAll(conn)
			require.NoError(t, err, "the node closes the connection after its answer")
			resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(answer)), nil)
			require.NoError(t, err, "an HTTP answer, not an empty reply: %q", answer)
			defer resp.Body.Close()
			assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			assert.Contains(t, string(body), "HTTP request to an HTTPS server")
			assert.Contains(t, string(body), "TLS")
		})
	}
	warned := regexp.MustCompile(`(?m)^.*level=WARN.*HTTPS? .*client=127\.0\.0\.1.*$`).FindAllString(logs.String(), -1)
	assert.Len(t, warned, 1, "one warning for the address within a minute; the log:\n%s", logs.String())

	cl := testcluster.NewTLSClient(t, ca.ClientConfig())
	defer cl.HTTP.CloseIdleConnections()
	resp, err := cl.HTTP.Get("https://" + n.Addr() + "/v0/status")
	require.NoError(t, err, "the port still speaks TLS")
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

package e2e_test

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/testcluster"
	"github.com/dhtkv/dhtkv/internal/testpki"
)

// TestRevokeNodeCertificateByCARotation follows docs/security.md's
// procedure to revoke a node certificate (dhtkv checks no CRL or OCSP):
// a new CA, both CAs trusted, every node's certificate reissued by the
// new one, the old CA dropped, each step a SIGHUP reload (Node.Reload),
// then a rolling restart. The cluster takes ack=3 writes at every step,
// and at the end a certificate of the old CA (the one revoked) reaches no
// internal endpoint.
func TestRevokeNodeCertificateByCARotation(t *testing.T) {
	t.Parallel()
	oldCA, newCA := testpki.NewCA(t, "cluster"), testpki.NewCA(t, "cluster-2")
	c := testcluster.Start(t, 3, testcluster.MutualTLS(oldCA))
	// Every node's --peer-tls-ca is oldCA.File: the steps rewrite it.
	caFile := c.Config(0).PeerTLSCA
	oldPEM, err := os.ReadFile(oldCA.File)
	require.NoError(t, err)
	newPEM, err := os.ReadFile(newCA.File)
	require.NoError(t, err)
	public := testcluster.NewTLSClient(t, &tls.Config{RootCAs: testpki.Pool(oldCA, newCA), MinVersion: tls.VersionTLS12})
	t.Cleanup(public.HTTP.CloseIdleConnections)

	// The certificate to revoke: a node's key that leaked.
	leakedCert, leakedKey, _ := oldCA.Issue("leaked")
	leaked := testpki.KeyPair(t, leakedCert, leakedKey)
	asLeaked := func() (int, []byte) {
		cl := testcluster.NewTLSClient(t, &tls.Config{
			RootCAs: testpki.Pool(oldCA, newCA), Certificates: []tls.Certificate{leaked}, MinVersion: tls.VersionTLS12,
		})
		defer cl.HTTP.CloseIdleConnections()
		return internalBatch(t, cl, c.Endpoint(0), nil, "")
	}
	code, _ := asLeaked()
	require.Equal(t, http.StatusOK, code, "before: the leaked certificate is a node's")

	writes := 0
	write := func(step string) {
		t.Helper()
		for i := range 3 {
			writes++
			key := fmt.Sprintf("rotate-%02d", writes)
			require.Equal(t, http.StatusCreated, public.Put(t, c.Endpoint(i), key, []byte(step), 3, 3), "%s: write through node %d", step, i)
		}
	}
	reloadAll := func(step string) {
		t.Helper()
		for i := range 3 {
			require.NoError(t, c.Node(i).Reload(), "%s: node %d", step, i)
		}
		write(step)
	}
	// Whether node i's current certificate is accepted by every node, on
	// new connections.
	acceptedEverywhere := func(step string, i int) {
		t.Helper()
		cfg := c.Config(i)
		asNode := testcluster.NewTLSClient(t, &tls.Config{
			RootCAs: testpki.Pool(oldCA, newCA), MinVersion: tls.VersionTLS12,
			Certificates: []tls.Certificate{testpki.KeyPair(t, cfg.TLSCert, cfg.TLSKey)},
		})
		defer asNode.HTTP.CloseIdleConnections()
		for j := range 3 {
			code, body := internalBatch(t, asNode, c.Endpoint(j), nil, "")
			require.Equal(t, http.StatusOK, code, "%s: node %d's certificate at node %d: %s", step, i, j, body)
		}
	}

	// 1. Every node trusts both CAs.
	require.NoError(t, os.WriteFile(caFile, append(append([]byte{}, oldPEM...), newPEM...), 0o644))
	reloadAll("both CAs")
	// 2. Every node gets a certificate of the new CA (key first).
	for i := range 3 {
		cfg := c.Config(i)
		newCA.IssueTo(cfg.TLSCert, cfg.TLSKey, fmt.Sprintf("node%d", i+1))
	}
	reloadAll("new certificates")
	for i := range 3 {
		acceptedEverywhere("new certificates", i)
	}
	// 3. Every node trusts the new CA only.
	require.NoError(t, os.WriteFile(caFile, newPEM, 0o644))
	reloadAll("new CA only")
	for i := range 3 {
		acceptedEverywhere("new CA only", i)
	}
	// 4. A rolling restart closes the connections opened before.
	for i := range 3 {
		c.StopNode(i)
		c.StartNode(i)
		write(fmt.Sprintf("restarted node %d", i))
	}

	// The leaked certificate is refused: Go's client does not even send
	// it (the nodes ask for certificates of the new CA), so it counts as
	// a public client; sent anyway, it fails the handshake.
	code, body := asLeaked()
	require.Equal(t, http.StatusForbidden, code)
	require.Contains(t, string(body), "require a client certificate from --peer-tls-ca")
	forced := newCA.ClientConfig()
	forced.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &leaked, nil }
	forcedClient := testcluster.NewTLSClient(t, forced)
	defer forcedClient.HTTP.CloseIdleConnections()
	_, err = forcedClient.HTTP.Post(c.Endpoint(0)+rpc.BatchPath, "", nil)
	require.ErrorContains(t, err, "tls: ", "the leaked certificate, sent anyway, fails the handshake")
	// The old CA's certificates are no longer served: a client trusting
	// only the old CA cannot connect.
	_, err = testpki.Served(c.Config(1).Listen, oldCA.ClientConfig())
	require.Error(t, err)
}

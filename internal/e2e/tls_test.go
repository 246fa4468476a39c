package e2e_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/leakcheck"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/testcluster"
	"github.com/dhtkv/dhtkv/internal/testpki"
)

// TestMutualTLSCluster: three nodes with TLS on their listeners and mutual
// TLS between them replicate writes (batches), serve quorum reads, merge a
// cluster-wide scan (the stream client), probe each other (pings) and
// compare replicas by anti-entropy (the summary client), every one of
// them over TLS with the nodes' certificates; a public client needs only
// to trust the CA.
func TestMutualTLSCluster(t *testing.T) {
	leakcheck.Register(t)
	ca := testpki.NewCA(t, "cluster")
	c := testcluster.Start(t, 3, testcluster.MutualTLS(ca))
	public := testcluster.NewTLSClient(t, ca.ClientConfig())
	t.Cleanup(public.HTTP.CloseIdleConnections)
	cfg := c.Config(0)
	asNode := testcluster.NewTLSClient(t, ca.ClientConfig(testpki.KeyPair(t, cfg.TLSCert, cfg.TLSKey)))
	t.Cleanup(asNode.HTTP.CloseIdleConnections)

	const keys = 12
	for i := range keys {
		key := fmt.Sprintf("tls-%02d", i)
		require.Equal(t, http.StatusCreated, public.Put(t, c.Endpoint(i%3), key, []byte("v"+key), 3, 3))
		expectValue(t, public, c.Endpoint((i+1)%3), key, 3, 3, "v"+key)
	}
	// Every replica holds every key: the batches went over mutual TLS.
	for i := range 3 {
		for k := range keys {
			code, rec := internalGet(t, asNode, c.Endpoint(i), fmt.Sprintf("tls-%02d", k), "")
			require.Equal(t, http.StatusOK, code, "node %d, key %d", i, k)
			require.Equal(t, fmt.Sprintf("vtls-%02d", k), string(rec.Value))
		}
	}

	// A cluster-wide scan through the public Go client: node 1 merges the
	// streams of all three.
	cc, err := client.New(client.Config{
		Endpoints: []string{c.Endpoint(1)},
		Transport: &http.Transport{TLSClientConfig: ca.ClientConfig()},
	})
	require.NoError(t, err)
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got []string
	for rec, err := range cc.Scan(ctx, "tls-", "tls-~") {
		require.NoError(t, err)
		got = append(got, string(rec.Key)+"="+string(rec.Value))
	}
	require.Len(t, got, keys)
	require.Equal(t, "tls-00=vtls-00", got[0])

	// Each node's prober reaches the others.
	for i := range 3 {
		testcluster.Eventually(t, testcluster.WaitFor, "node reaches its peers", func() bool {
			st, err := cc.Status(ctx, c.Endpoint(i))
			require.NoError(t, err)
			for _, m := range st.Members {
				if m.Reachable == nil || !*m.Reachable {
					return false
				}
			}
			return true
		})
	}

	// A record only node 0 has is pushed by anti-entropy, whose summary
	// exchange has its own client.
	lone := record.Record{Version: versionAt(time.Now(), 0, 0), Value: []byte("lone")}
	require.Equal(t, http.StatusCreated, internalPut(t, asNode, c.Endpoint(0), "tls-lone", lone, ""))
	for _, ex := range c.Repair(t, 0) {
		require.Empty(t, ex.Error, "exchange with %s", ex.Peer)
		require.Equal(t, 1, ex.Pushed, "exchange with %s", ex.Peer)
	}
	for i := range 3 {
		code, rec := internalGet(t, asNode, c.Endpoint(i), "tls-lone", "")
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, lone, rec)
	}
}

// TestMutualTLSRefusesOtherCA: a node whose certificate is from another CA
// (it trusts that CA only, as another cluster's node would) is refused by
// the cluster's nodes and refuses them: writes needing it fail with 504
// from either side. The internal endpoints answer 403 to a client without
// a node certificate, a certificate of another CA sent anyway fails the
// handshake, and a plain-HTTP request gets no answer from the TLS
// listener.
func TestMutualTLSRefusesOtherCA(t *testing.T) {
	ca, other := testpki.NewCA(t, "cluster"), testpki.NewCA(t, "other")
	join := testcluster.MutualTLS(ca)
	c := testcluster.Start(t, 3, func(i int, cfg *node.Config) {
		if i < 2 {
			join(i, cfg)
			return
		}
		cfg.TLSCert, cfg.TLSKey, _ = other.Issue("rogue")
		cfg.PeerTLSCA = other.File
	})
	cl := testcluster.NewTLSClient(t, &tls.Config{RootCAs: testpki.Pool(ca, other), MinVersion: tls.VersionTLS12})
	t.Cleanup(cl.HTTP.CloseIdleConnections)

	p := placementOf(t, c)
	key := findKey(t, p, "rogue", 0, 1, 2)
	require.Equal(t, http.StatusGatewayTimeout, cl.Put(t, c.Endpoint(0), key, []byte("v"), 3, 3), "node 0 cannot reach node 2")
	require.Equal(t, http.StatusCreated, cl.Put(t, c.Endpoint(0), key, []byte("v"), 2, 3), "nodes 0 and 1 reach each other")
	require.Equal(t, http.StatusGatewayTimeout, cl.Put(t, c.Endpoint(2), key, []byte("w"), 2, 3), "node 2 reaches no one")

	rogue := testpki.KeyPair(t, c.Config(2).TLSCert, c.Config(2).TLSKey)
	for _, tc := range []struct {
		name   string
		client *tls.Config
	}{
		{"no client certificate", ca.ClientConfig()},
		// Go's client does not send a certificate the server's request
		// does not name the issuer of: the node sees a public client.
		{"certificate of another CA", ca.ClientConfig(rogue)},
	} {
		hc := testcluster.NewTLSClient(t, tc.client)
		code, body := internalBatch(t, hc, c.Endpoint(0), nil, "")
		require.Equal(t, http.StatusForbidden, code, tc.name)
		require.Equal(t, "forbidden: the internal endpoints require a client certificate from --peer-tls-ca\n", string(body), tc.name)
		hc.HTTP.CloseIdleConnections()
	}
	forced := ca.ClientConfig()
	forced.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &rogue, nil }
	_, err := testcluster.NewTLSClient(t, forced).HTTP.Post(c.Endpoint(0)+rpc.BatchPath, "", nil)
	require.ErrorContains(t, err, "tls: ", "a certificate of another CA, sent anyway, fails the handshake")

	// Plain HTTP to a TLS listener is not served: it is told so.
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Post(c.URL(0)+rpc.BatchPath, "", nil)
	require.NoError(t, err, "plain HTTP to a TLS listener gets an answer")
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "plain HTTP to a TLS listener: %s", body)
	require.Contains(t, string(body), "this port speaks TLS")
	require.True(t, strings.HasPrefix(c.Endpoint(0), "https://"))
}

package client_test

import (
	"crypto/tls"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/testcluster"
	"github.com/dhtkv/dhtkv/internal/testpki"
)

// Config.TLSConfig makes host:port endpoints https and refuses http://
// ones; it does not go with Transport.
func TestNewTLSConfig(t *testing.T) {
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	for _, tc := range []struct {
		endpoints []string
		transport http.RoundTripper
		want      string // normalized endpoints, or the error
	}{
		{[]string{"127.0.0.1:8443"}, nil, "https://127.0.0.1:8443"},
		{[]string{"https://127.0.0.1:8443/", "localhost:8444"}, nil, "https://127.0.0.1:8443 https://localhost:8444"},
		{[]string{"https://127.0.0.1:8443", "http://127.0.0.1:8080"}, nil, `endpoint "http://127.0.0.1:8080" is http:// but a TLS configuration is given`},
		{[]string{"127.0.0.1:8443"}, http.DefaultTransport, "Config.TLSConfig with Config.Transport"},
	} {
		c, err := client.New(client.Config{Endpoints: tc.endpoints, Transport: tc.transport, TLSConfig: conf})
		if err != nil {
			assert.ErrorContains(t, err, tc.want, "%q", tc.endpoints)
			continue
		}
		assert.Equal(t, tc.want, strings.Join(c.Endpoints(), " "), "%q", tc.endpoints)
	}
}

// Against a real cluster serving mutual TLS, a client with
// Config.TLSConfig trusting the CA reads, writes, scans and asks for
// status through host:port endpoints, and reaches the plain-HTTP admin
// listener through host:port too; one trusting another CA is refused.
func TestClientTLS(t *testing.T) {
	ca := testpki.NewCA(t, "cluster")
	c := testcluster.Start(t, 3, testcluster.MutualTLS(ca))
	ctx := ctxFor(t)
	cl, err := client.New(client.Config{
		Endpoints: []string{c.Config(0).Listen, c.Config(1).Listen},
		TLSConfig: ca.ClientConfig(),
	})
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	assert.Equal(t, []string{c.Endpoint(0), c.Endpoint(1)}, cl.Endpoints())

	require.NoError(t, cl.Put(ctx, "k", []byte("v"), client.WithAck(3)))
	v, err := cl.Get(ctx, "k", client.WithAck(3))
	require.NoError(t, err)
	assert.Equal(t, "v", string(v))
	n := 0
	for rec, err := range cl.Scan(ctx, "", "") {
		require.NoError(t, err)
		assert.Equal(t, "k", string(rec.Key))
		n++
	}
	assert.Equal(t, 1, n)
	st, err := cl.Status(ctx, c.Config(2).Listen)
	require.NoError(t, err, "host:port is https for Status too")
	assert.Equal(t, c.URL(2), st.Node, "the node's name stays http://")
	xs, err := cl.Repair(ctx, c.Node(0).AdminAddr())
	require.NoError(t, err, "the admin listener is plain HTTP")
	assert.Len(t, xs, 2)

	other := testpki.NewCA(t, "other")
	stranger, err := client.New(client.Config{Endpoints: []string{c.Config(0).Listen}, TLSConfig: other.ClientConfig()})
	require.NoError(t, err)
	t.Cleanup(stranger.Close)
	_, err = stranger.Get(ctx, "k")
	require.ErrorIs(t, err, client.ErrUnavailable)
	assert.ErrorContains(t, err, "certificate signed by unknown authority")
}

package membership_test

import (
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/membership"
	"github.com/dhtkv/dhtkv/internal/rpc"
)

// A map offered on rpc.MapPath that cannot be installed is refused by the
// node's real handler with a 4xx and a one-line reason, never answered as
// the node's own failure (500, logged as an error), and the node keeps its
// map: one that does not parse or is invalid (400), one not from a member
// (403), and a newer map of another cluster sent as from a member (409).
func TestOfferRefusals(t *testing.T) {
	urls := []string{"http://n1:1", "http://n2:1", "http://n3:1"}
	c, logs := loggedCluster(t, urls)
	before := c.settled(logs[urls[0]], 3)
	c.mu.Lock()
	srv := c.servers[urls[0]]
	c.mu.Unlock()

	// offer encodes the state of node `from` holding before's map changed
	// by edit (on a copy).
	offer := func(from int, edit func(m *clustermap.Map)) []byte {
		m, err := clustermap.Decode(before.Encode())
		require.NoError(t, err)
		edit(m)
		return membership.State{Node: from, Map: m}.Encode()
	}
	for _, tc := range []struct {
		name string
		body []byte
		code int
		want string
	}{
		{"another cluster, newer", offer(1, func(m *clustermap.Map) { m.Cluster++; m.Epoch++ }),
			http.StatusConflict, "cluster map from node 1: cluster map of another cluster"},
		{"another cluster, much newer", offer(2, func(m *clustermap.Map) { m.Cluster ^= 1 << 63; m.Epoch += 1000 }),
			http.StatusConflict, "another cluster"},
		{"not JSON", []byte("{"), http.StatusBadRequest, "cluster map state"},
		{"empty", []byte{}, http.StatusBadRequest, "cluster map state"},
		{"no map", []byte(`{"node":1}`), http.StatusBadRequest, "without a map"},
		{"invalid map", offer(1, func(m *clustermap.Map) { m.Epoch = 0 }), http.StatusBadRequest, "epoch 0"},
		{"not a member", offer(7, func(m *clustermap.Map) { m.Epoch++ }), http.StatusForbidden, "not a member"},
		{"a member at another URL", offer(1, func(m *clustermap.Map) { m.Epoch++; m.Nodes[1].URL = "http://n9:1" }),
			http.StatusForbidden, "not a member"},
	} {
		var req fasthttp.Request
		req.Header.SetMethod(fasthttp.MethodPost)
		req.SetRequestURI(rpc.MapPath)
		req.SetBody(tc.body)
		var ctx fasthttp.RequestCtx
		ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}, nil) // a peer on this machine
		require.True(t, srv.Accept(&ctx, rpc.MapPath), tc.name)
		srv.HandleMap(&ctx, ctx.Request.Body())
		body := strings.TrimSuffix(string(ctx.Response.Body()), "\n")
		require.Equal(t, tc.code, ctx.Response.StatusCode(), "%s: %s", tc.name, body)
		require.Contains(t, body, tc.want, tc.name)
		require.NotContains(t, body, "\n", "%s: one line", tc.name)
	}
	m, self := c.member(urls[0]).Map()
	require.Equal(t, 0, self)
	require.Equal(t, before.Encode(), m.Encode(), "no offer changed the map")
}

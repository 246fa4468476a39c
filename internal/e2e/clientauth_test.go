package e2e_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/clientauth"
	"github.com/dhtkv/dhtkv/internal/httpapi"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// TestClientTokens: a 2-node cluster with --client-tokens, over real
// sockets. Every public and admin endpoint, with every kind of token:
// refused without one (401 and the challenge) and with one of a lower
// role (403), each with a one-line reason, served with one of its role;
// the open ones served without. Node-to-node traffic carries no client
// token and is not held up: a write with ack=2 reaches both nodes.
// (TestAccessEveryPath, in httpapi, and TestAccessEveryEndpoint, in
// admin, walk the routers' own lists of paths.)
func TestClientTokens(t *testing.T) {
	t.Parallel()
	tok := testcluster.NewTokens(t)
	c := testcluster.Start(t, 2, testcluster.ClientTokens(tok))
	pub, adm := c.URL(0), "http://"+c.Node(0).AdminAddr()
	const (
		none  = clientauth.None
		read  = clientauth.Read
		write = clientauth.Write
		admin = clientauth.Admin
	)
	endpoints := []struct {
		method, url string
		need        clientauth.Role
	}{
		{http.MethodPut, pub + "/v0/entity?id=k&ack=2", write},
		{http.MethodGet, pub + "/v0/entity?id=k&ack=2", read},
		{http.MethodHead, pub + "/v0/entity?id=k&ack=2", read},
		{http.MethodDelete, pub + "/v0/entity?id=gone&ack=2", write},
		{http.MethodPost, pub + "/v0/entity?id=k", read}, // then 405
		{http.MethodGet, pub + "/v0/entities?start=a", read},
		{http.MethodGet, pub + "/v0/status", none},
		{http.MethodGet, pub + "/v0/status?verbose", none},
		{http.MethodGet, adm + "/livez", none},
		{http.MethodGet, adm + "/readyz", none},
		{http.MethodGet, adm + "/metrics", none},
		{http.MethodGet, adm + "/cluster", read},
		{http.MethodGet, adm + "/repair", read},
		{http.MethodPost, adm + "/repair", admin},
		{http.MethodPost, adm + "/snapshot?dir=snap", admin},
		{http.MethodGet, adm + "/log-level", read},
		{http.MethodPut, adm + "/log-level?level=info", admin},
		{http.MethodPost, adm + "/cluster/join", admin},         // no node=: 400 once let in
		{http.MethodPost, adm + "/cluster/decommission", admin}, // likewise
		{http.MethodPost, adm + "/cluster/remove", admin},       // likewise
		{http.MethodPost, adm + "/cluster/replace", admin},      // likewise
		{http.MethodGet, adm + "/debug/pprof/", admin},
		{http.MethodGet, adm + "/debug/pprof/cmdline", admin},
		{http.MethodGet, adm + "/debug/pprof/heap", admin},
		{http.MethodGet, adm + "/debug/pprof/rates", admin},
		{http.MethodPost, adm + "/debug/pprof/rates?mutex=0", admin},
		{http.MethodGet, adm + "/nope", admin},
	}
	tokens := []struct {
		name, token string
		role        clientauth.Role
	}{
		{"no token", "", none},
		{"unknown token", "unknown-token-0123456789", none},
		{"read", tok.Read, read},
		{"write", tok.Write, write},
		{"admin", tok.Admin, admin},
	}
	do := func(method, url, token string) (*http.Response, string) {
		req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader("v"))
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		if method == http.MethodHead && resp.StatusCode >= 400 {
			// A HEAD's reason travels in a header (docs/http.md).
			return resp, resp.Header.Get(httpapi.ErrorHeader) + "\n"
		}
		return resp, string(body)
	}
	for _, e := range endpoints {
		for _, k := range tokens {
			name := e.method + " " + e.url + " with " + k.name
			resp, body := do(e.method, e.url, k.token)
			switch {
			case e.need == none || (k.role != none && k.role >= e.need):
				assert.NotContains(t, []int{401, 403}, resp.StatusCode, "%s: %s", name, body)
			case k.role == none:
				assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "%s: %s", name, body)
				assert.True(t, strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), `Bearer realm="dhtkv"`), name)
				assert.True(t, strings.HasPrefix(body, "unauthorized: "), "%s: %q", name, body)
				assert.Equal(t, 1, strings.Count(body, "\n"), "%s: one line: %q", name, body)
			default:
				assert.Equal(t, http.StatusForbidden, resp.StatusCode, "%s: %s", name, body)
				assert.Equal(t, "forbidden: this request needs the "+e.need.String()+" role; the token's is "+k.role.String()+"\n", body, name)
			}
		}
	}

	// The ack=2 writes above reached node 1 through the internal
	// endpoints, which take no client token: read it there alone.
	resp, body := do(http.MethodGet, c.URL(1)+"/v0/entity?id=k&ack=1&from=1", tok.Read)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, "v", body)
}

// TestClientToken: the Go client sends Config.Token to the public and the
// admin ports; a call its role does not allow is a *BadRequestError with
// the node's status and reason.
func TestClientToken(t *testing.T) {
	t.Parallel()
	tok := testcluster.NewTokens(t)
	c := testcluster.Start(t, 2, testcluster.ClientTokens(tok))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	cl := func(token string) *client.Client {
		cl, err := client.New(client.Config{Endpoints: []string{c.URL(0), c.URL(1)}, Token: token})
		require.NoError(t, err)
		t.Cleanup(cl.Close)
		return cl
	}
	refused := func(err error, code int, reason string) {
		t.Helper()
		var bad *client.BadRequestError
		require.True(t, errors.As(err, &bad), "%v", err)
		assert.Equal(t, code, bad.StatusCode)
		assert.Equal(t, reason, bad.Reason)
	}
	writer, reader, anon, operator := cl(tok.Write), cl(tok.Read), cl(""), cl(tok.Admin)
	admin := c.Node(0).AdminAddr()

	require.NoError(t, writer.Put(ctx, "k", []byte("v")))
	v, err := reader.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, "v", string(v))
	for rec, err := range reader.Scan(ctx, "", "") {
		require.NoError(t, err)
		assert.Equal(t, "k", string(rec.Key))
	}
	_, err = anon.Get(ctx, "k")
	refused(err, 401, "unauthorized: this request needs a client token (Authorization: Bearer TOKEN)")
	refused(reader.Put(ctx, "k", []byte("x")), 403, "forbidden: this request needs the write role; the token's is read")
	refused(reader.Delete(ctx, "k"), 403, "forbidden: this request needs the write role; the token's is read")
	for _, err := range anon.Scan(ctx, "", "") {
		refused(err, 401, "unauthorized: this request needs a client token (Authorization: Bearer TOKEN)")
	}
	_, err = anon.Status(ctx, c.URL(0))
	require.NoError(t, err, "status is open")

	_, err = reader.Cluster(ctx, admin)
	require.NoError(t, err)
	_, err = anon.Cluster(ctx, admin)
	refused(err, 401, "unauthorized: this request needs a client token (Authorization: Bearer TOKEN)")
	_, err = writer.Repair(ctx, admin)
	refused(err, 403, "forbidden: this request needs the admin role; the token's is write")
	_, err = operator.Repair(ctx, admin)
	require.NoError(t, err)
	_, err = writer.Snapshot(ctx, admin, "snap")
	refused(err, 403, "forbidden: this request needs the admin role; the token's is write")
	_, err = reader.Decommission(ctx, admin, c.URL(1))
	refused(err, 403, "forbidden: this request needs the admin role; the token's is read")
	_, err = anon.Join(ctx, admin, "http://127.0.0.1:1")
	refused(err, 401, "unauthorized: this request needs a client token (Authorization: Bearer TOKEN)")
	_, err = reader.Replace(ctx, admin, c.URL(1), "http://127.0.0.1:1")
	refused(err, 403, "forbidden: this request needs the admin role; the token's is read")

	_, err = client.New(client.Config{Endpoints: []string{c.URL(0)}, Token: "tok\r\nX-Injected: 1"})
	require.ErrorContains(t, err, `Config.Token has '\r' at byte 3`)
}

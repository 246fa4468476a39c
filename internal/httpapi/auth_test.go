package httpapi

import (
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/clientauth"
	"github.com/dhtkv/dhtkv/internal/rpc"
)

const (
	readTok  = "read-token-0123456789"
	writeTok = "write-token-0123456789"
	adminTok = "admin-token-0123456789"
)

// TestAccessEveryPath walks every path the public port serves (the
// router's own list: a path added to it without a row here fails), with
// every method and every kind of token: with client tokens on, a request
// that needs a role is refused without a token (401 and the challenge)
// and with a token of a lower role (403), each with a one-line reason,
// and let through with one of the role or above; the open paths are let
// through without a token.
func TestAccessEveryPath(t *testing.T) {
	const (
		none  = clientauth.None
		read  = clientauth.Read
		write = clientauth.Write
	)
	// path → the role GET/HEAD, PUT/DELETE and other methods need.
	want := map[string][3]clientauth.Role{
		pathEntity:      {read, write, read},
		pathEntities:    {read, read, read},
		pathStatus:      {none, none, none},
		rpc.BatchPath:   {none, none, none}, // nodes: rpc.Server.Accept's rules
		rpc.StreamPath:  {none, none, none},
		rpc.SummaryPath: {none, none, none},
		rpc.MapPath:     {none, none, none},
		rpc.ReachPath:   {none, none, none},
		rpc.LogPath:     {none, none, none},
	}
	require.Equal(t, slices.Sorted(maps.Keys(want)), slices.Sorted(maps.Keys(access)),
		"the public paths: give each new one its rule in access (auth.go) and a row here")

	p := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(p, []byte("read "+readTok+"\nwrite "+writeTok+"\nadmin "+adminTok+"\n"), 0o600))
	tokens, err := clientauth.Load(p)
	require.NoError(t, err)
	s := &Server{Tokens: tokens, Metrics: NewMetrics(prometheus.NewRegistry()), Log: slog.New(slog.DiscardHandler)}

	kinds := []struct {
		name, header string
		role         clientauth.Role // None: no token known
	}{
		{"no token", "", none},
		{"not bearer", "Basic cmVhZDpyZWFk", none},
		{"unknown token", "Bearer unknown-token-0123456789", none},
		{"read token", "Bearer " + readTok, read},
		{"write token", "Bearer " + writeTok, write},
		{"admin token", "Bearer " + adminTok, clientauth.Admin},
	}
	methods := map[string]int{ // method → its column in want
		fasthttp.MethodGet: 0, fasthttp.MethodHead: 0, fasthttp.MethodPut: 1, fasthttp.MethodDelete: 1,
		fasthttp.MethodPost: 2, fasthttp.MethodPatch: 2, fasthttp.MethodOptions: 2,
	}
	for path, roles := range want {
		for method, col := range methods {
			need := roles[col]
			for _, k := range kinds {
				name := method + " " + path + " " + k.name
				ctx := request(method, path+"?id=k", k.header)
				if need == none || (k.role != none && k.role >= need) {
					assert.True(t, s.authorized(ctx, access[path]), name)
					continue
				}
				s.Handler(ctx)                      // refused before any handler runs
				body := string(ctx.Response.Body()) // a HEAD's too: fasthttp leaves it off the wire only
				assert.Equal(t, 1, strings.Count(body, "\n"), "%s: one line: %q", name, body)
				if k.role == none {
					assert.Equal(t, fasthttp.StatusUnauthorized, ctx.Response.StatusCode(), name)
					assert.True(t, strings.HasPrefix(string(ctx.Response.Header.Peek(fasthttp.HeaderWWWAuthenticate)), `Bearer realm="dhtkv"`), name)
					assert.True(t, strings.HasPrefix(body, "unauthorized: "), "%s: %q", name, body)
				} else {
					assert.Equal(t, fasthttp.StatusForbidden, ctx.Response.StatusCode(), name)
					assert.Equal(t, `Bearer realm="dhtkv", error="insufficient_scope"`, string(ctx.Response.Header.Peek(fasthttp.HeaderWWWAuthenticate)), name)
					assert.Equal(t, "forbidden: this request needs the "+need.String()+" role; the token's is "+k.role.String()+"\n", body, name)
				}
			}
		}
	}

	// A path the router does not serve is a 400, with or without a token.
	for _, h := range []string{"", "Bearer " + readTok} {
		ctx := request(fasthttp.MethodGet, "/v0/nope", h)
		s.Handler(ctx)
		assert.Equal(t, fasthttp.StatusBadRequest, ctx.Response.StatusCode())
		assert.Contains(t, string(ctx.Response.Body()), `unknown path "/v0/nope"`)
	}
	// Client authentication off: every request goes on.
	off := &Server{}
	for path := range access {
		assert.True(t, off.authorized(request(fasthttp.MethodPut, path, ""), access[path]), path)
	}
}

func request(method, uri, authorization string) *fasthttp.RequestCtx {
	var ctx fasthttp.RequestCtx
	var req fasthttp.Request
	req.Header.SetMethod(method)
	req.SetRequestURI(uri)
	if authorization != "" {
		req.Header.Set(fasthttp.HeaderAuthorization, authorization)
	}
	ctx.Init(&req, nil, nil)
	return &ctx
}

// TestRepeatedAuthorizationRefused: Authorization is a singleton field.
// With client tokens on, a request carrying two is refused (400, one
// line) whatever they hold, where the first was taken: a proxy in front
// that read the other would have checked another token than this node.
func TestRepeatedAuthorizationRefused(t *testing.T) {
	p := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(p, []byte("read "+readTok+"\nwrite "+writeTok+"\n"), 0o600))
	tokens, err := clientauth.Load(p)
	require.NoError(t, err)
	s := &Server{Tokens: tokens, Metrics: NewMetrics(prometheus.NewRegistry()), Log: slog.New(slog.DiscardHandler)}
	for _, pair := range [][2]string{
		{"Bearer " + writeTok, "Bearer unknown-token-0123456789"},
		{"Bearer unknown-token-0123456789", "Bearer " + writeTok},
		{"Bearer " + writeTok, "Bearer " + writeTok},
	} {
		ctx := request(fasthttp.MethodPut, pathEntity+"?id=k", pair[0])
		ctx.Request.Header.Add(fasthttp.HeaderAuthorization, pair[1])
		s.Handler(ctx)
		assert.Equal(t, fasthttp.StatusBadRequest, ctx.Response.StatusCode(), "%q", pair)
		assert.Equal(t, errRepeatedAuthorization+"\n", string(ctx.Response.Body()))
	}
	ctx := request(fasthttp.MethodPut, pathEntity+"?id=k", "Bearer "+writeTok)
	assert.True(t, s.authorized(ctx, access[pathEntity]), "one header goes on")
}

package admin

import (
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clientauth"
)

const (
	readTok  = "read-token-0123456789"
	writeTok = "write-token-0123456789"
	adminTok = "admin-token-0123456789"
)

func loadTokens(t *testing.T) *clientauth.Tokens {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(p, []byte("read "+readTok+"\nwrite "+writeTok+"\nadmin "+adminTok+"\n"), 0o600))
	tok, err := clientauth.Load(p)
	require.NoError(t, err)
	return tok
}

// TestAccessEveryEndpoint walks every pattern registered on the admin
// mux, as registered (a new endpoint without a row here fails), with
// every method and every kind of token: refused without a token (401,
// with the challenge) and with a token of a lower role (403), let through
// with one of the role or above, and the open probes and metrics let
// through without one.
func TestAccessEveryEndpoint(t *testing.T) {
	const (
		none  = clientauth.None
		read  = clientauth.Read
		admin = clientauth.Admin
	)
	// pattern → the role GET and HEAD need, the role other methods need,
	// and the paths to try (the pattern's own, and one below a subtree).
	want := map[string]struct {
		get, other clientauth.Role
		paths      []string
	}{
		"GET /livez":           {none, none, []string{"/livez"}},
		"GET /readyz":          {none, none, []string{"/readyz"}},
		"/metrics":             {none, none, []string{"/metrics"}},
		"/debug/pprof/":        {admin, admin, []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/goroutine"}},
		"/debug/pprof/cmdline": {admin, admin, []string{"/debug/pprof/cmdline"}},
		"/debug/pprof/profile": {admin, admin, []string{"/debug/pprof/profile"}},
		"/debug/pprof/symbol":  {admin, admin, []string{"/debug/pprof/symbol"}},
		"/debug/pprof/trace":   {admin, admin, []string{"/debug/pprof/trace"}},
		"/debug/pprof/rates":   {admin, admin, []string{"/debug/pprof/rates"}},
		"/repair":              {read, admin, []string{"/repair"}},
		"/snapshot":            {admin, admin, []string{"/snapshot"}},
		"/log-level":           {read, admin, []string{"/log-level"}},
		"/cluster":             {read, admin, []string{"/cluster"}},
		"/cluster/":            {admin, admin, []string{"/cluster/join", "/cluster/decommission", "/cluster/remove", "/cluster/replace", "/cluster/abort", "/cluster/other"}},
	}
	stub := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	m := mux(Parts{Registry: prometheus.NewRegistry(), Ready: func() error { return nil }, Cluster: stub, SnapshotDir: t.TempDir()})
	require.Equal(t, slices.Sorted(maps.Keys(want)), m.patterns(),
		"the admin endpoints: give each new one its rule in need (auth.go) and a row here")
	// Paths no pattern has: refused below admin, like any path without a rule.
	want["(unregistered)"] = struct {
		get, other clientauth.Role
		paths      []string
	}{admin, admin, []string{"/", "/nope", "/livez/", "/cluster/../snapshot", "/metrics/x"}}

	tokens := loadTokens(t)
	var reached bool
	h := authorize(tokens, slog.New(slog.DiscardHandler), http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached = true }))
	kinds := []struct {
		name   string
		header string
		role   clientauth.Role // None: no token known
	}{
		{"no token", "", none},
		{"unknown token", "Bearer unknown-token-0123456789", none},
		{"read token", "Bearer " + readTok, read},
		{"write token", "Bearer " + writeTok, clientauth.Write},
		{"admin token", "Bearer " + adminTok, admin},
	}
	for pattern, w := range want {
		for _, path := range w.paths {
			for _, method := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodDelete} {
				need := w.other
				if method == http.MethodGet || method == http.MethodHead {
					need = w.get
				}
				for _, k := range kinds {
					name := pattern + " " + method + " " + path + " " + k.name
					req := httptest.NewRequest(method, path, nil)
					if k.header != "" {
						req.Header.Set("Authorization", k.header)
					}
					rec := httptest.NewRecorder()
					reached = false
					h.ServeHTTP(rec, req)
					switch {
					case need == none || (k.role != none && k.role >= need):
						assert.True(t, reached, name)
					case k.role == none:
						assert.False(t, reached, name)
						assert.Equal(t, http.StatusUnauthorized, rec.Code, name)
						assert.True(t, strings.HasPrefix(rec.Header().Get("WWW-Authenticate"), "Bearer "), name)
						assert.True(t, strings.HasPrefix(rec.Body.String(), "unauthorized: "), name)
					default:
						assert.False(t, reached, name)
						assert.Equal(t, http.StatusForbidden, rec.Code, name)
						assert.Equal(t, "forbidden: this request needs the "+need.String()+" role; the token's is "+k.role.String()+"\n", rec.Body.String(), name)
					}
				}
			}
		}
	}
	assert.Equal(t, read, need(http.MethodGet, "/cluster"))
}

// TestAuthorizeOff: without tokens, the mux itself.
func TestAuthorizeOff(t *testing.T) {
	next := http.NewServeMux()
	assert.Same(t, next, authorize(nil, nil, next))
}

// TestRepeatedAuthorizationRefused: a request that needs a role and
// carries two Authorization headers is refused (400), as on the public
// port, where the first was taken; an open endpoint does not look.
func TestRepeatedAuthorizationRefused(t *testing.T) {
	p := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(p, []byte("admin "+adminTok+"\n"), 0o600))
	tokens, err := clientauth.Load(p)
	require.NoError(t, err)
	var reached bool
	h := authorize(tokens, slog.New(slog.DiscardHandler), http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached = true }))
	for _, path := range []string{"/cluster", "/livez"} {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Header.Add("Authorization", "Bearer "+adminTok)
		req.Header.Add("Authorization", "Bearer unknown-token-0123456789")
		rec := httptest.NewRecorder()
		reached = false
		h.ServeHTTP(rec, req)
		if path == "/livez" {
			assert.True(t, reached, "an open endpoint")
			continue
		}
		assert.False(t, reached, path)
		assert.Equal(t, http.StatusBadRequest, rec.Code, path)
		assert.Equal(t, "bad request: the Authorization header is repeated\n", rec.Body.String())
	}
}

package admin

import (
	"log/slog"
	"net/http"
	"slices"

	"github.com/dhtkv/dhtkv/internal/clientauth"
)

// Access to the admin port with client tokens on (docs/security.md):
//
//   - open: /livez, /readyz and /metrics, which load balancers,
//     orchestrators and Prometheus poll; they hold no key or value and
//     change nothing;
//   - read: GET and HEAD of /cluster, /repair and /log-level, the cluster
//     map, the anti-entropy state and the log level;
//   - admin: everything else: membership changes (POST /cluster/join,
//     /cluster/decommission, /cluster/remove, /cluster/replace, /cluster/replicas,
//     /cluster/abort), POST /snapshot, POST
//     /repair, PUT /log-level, and all of /debug/pprof/ (a profile costs CPU, rates
//     switches the profiles, cmdline shows the node's flags), and any path
//     added without a rule here.
func need(method, path string) clientauth.Role {
	switch path {
	case "/livez", "/readyz", "/metrics":
		return clientauth.None
	case "/cluster", "/repair", "/log-level":
		if method == http.MethodGet || method == http.MethodHead {
			return clientauth.Read
		}
	}
	return clientauth.Admin
}

// authorize serves next the requests whose token has the role need says,
// and answers the others itself: 401 with a WWW-Authenticate challenge, or
// 403, with a one-line reason. A request that changes something (not GET
// or HEAD, and needing admin) is logged with the fingerprint of its token.
// A nil tokens lets every request through: client authentication is off.
func authorize(tokens *clientauth.Tokens, log *slog.Logger, next http.Handler) http.Handler {
	if tokens == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := need(r.Method, r.URL.Path)
		if n != clientauth.None && len(r.Header.Values("Authorization")) > 1 {
			// A singleton field, refused repeated as the public port does.
			plain(w, http.StatusBadRequest, "bad request: the Authorization header is repeated")
			return
		}
		h := []byte(r.Header.Get("Authorization"))
		d := tokens.Authorize(h, n)
		if d.Outcome != clientauth.Allowed {
			w.Header().Set("WWW-Authenticate", d.Challenge())
			plain(w, d.StatusCode(), d.Reason())
			return
		}
		if n == clientauth.Admin && r.Method != http.MethodGet && r.Method != http.MethodHead {
			log.Info("admin request", "method", r.Method, "path", r.URL.Path, "query", r.URL.RawQuery,
				"token", clientauth.Fingerprint(h), "remote", r.RemoteAddr)
		}
		next.ServeHTTP(w, r)
	})
}

// recordingMux is an http.ServeMux that keeps the patterns registered on
// it, so that the tests can walk every admin endpoint (patterns) and find
// any without a rule in need.
type recordingMux struct {
	*http.ServeMux
	registered []registration
}

type registration struct {
	pattern string
	handler http.Handler
}

func newMux() *recordingMux { return &recordingMux{ServeMux: http.NewServeMux()} }

func (m *recordingMux) Handle(pattern string, h http.Handler) {
	m.ServeMux.Handle(pattern, h)
	m.registered = append(m.registered, registration{pattern, h})
}

func (m *recordingMux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.Handle(pattern, http.HandlerFunc(h))
}

// patterns are the patterns registered, those of a recordingMux mounted
// at "/" in its place, sorted.
func (m *recordingMux) patterns() []string {
	var out []string
	for _, r := range m.registered {
		if inner, ok := r.handler.(*recordingMux); ok && r.pattern == "/" {
			out = append(out, inner.patterns()...)
			continue
		}
		out = append(out, r.pattern)
	}
	slices.Sort(out)
	return out
}

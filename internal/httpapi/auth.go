package httpapi

import (
	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/clientauth"
	"github.com/dhtkv/dhtkv/internal/rpc"
)

// access is the public port's paths, each with the role its requests need
// when client tokens are on (Server.Tokens; docs/security.md). It is also
// the router's list of paths: route answers 400 "unknown path" to any
// other before it looks further, so a path served without a rule here is
// served to nobody, and TestAccessEveryPath walks every path it lists.
var access = map[string]rule{
	// Keys: GET and HEAD read; PUT and DELETE write. Another method needs
	// a token of any role, then gets 405.
	pathEntity: {read: clientauth.Read, write: clientauth.Write, other: clientauth.Read},
	// Ranges only read; another method gets 405.
	pathEntities: {read: clientauth.Read, write: clientauth.Read, other: clientauth.Read},
	// Open: load balancers' and monitors' health check (plain), and
	// dhtkvctl status (verbose). It holds no key or value and changes
	// nothing; docs/security.md says what it shows.
	pathStatus: {},
	// Node to node: not client tokens but the cluster secret, mutual TLS
	// or loopback, which rpc.Server.Accept checks on every request.
	rpc.BatchPath:   {},
	rpc.StreamPath:  {},
	rpc.SummaryPath: {},
	rpc.MapPath:     {},
	rpc.ReachPath:   {},
	rpc.LogPath:     {},
}

// rule is the role a path's requests need, by method.
type rule struct {
	read  clientauth.Role // GET and HEAD
	write clientauth.Role // PUT and DELETE
	other clientauth.Role // any other method
}

// need is the role of a request with method to the rule's path.
func (r rule) need(method []byte) clientauth.Role {
	switch string(method) {
	case fasthttp.MethodGet, fasthttp.MethodHead:
		return r.read
	case fasthttp.MethodPut, fasthttp.MethodDelete:
		return r.write
	}
	return r.other
}

// authorized reports whether the request may go on to its path's handler:
// with client tokens on, its token must have the role r needs for its
// method. Otherwise it answers the request, 401 with a WWW-Authenticate
// challenge or 403, and a one-line reason. A request let through costs
// no allocation.
func (s *Server) authorized(ctx *fasthttp.RequestCtx, r rule) bool {
	if s.Tokens == nil {
		return true
	}
	need := r.need(ctx.Method())
	if need == clientauth.None {
		return true
	}
	// Authorization is a singleton field: two could be read differently
	// by a proxy in front and by this node (the cluster secret's header
	// is refused repeated too, rpc.Server). PeekAll reuses the header's
	// own slice: no allocation.
	var authz []byte
	switch all := ctx.Request.Header.PeekAll(fasthttp.HeaderAuthorization); len(all) {
	case 0:
	case 1:
		authz = all[0]
	default:
		ctx.Error(errRepeatedAuthorization+"\n", fasthttp.StatusBadRequest)
		return false
	}
	d := s.Tokens.Authorize(authz, need)
	if d.Outcome == clientauth.Allowed {
		return true
	}
	ctx.Error(d.Reason()+"\n", d.StatusCode()) // resets the headers: the challenge after
	ctx.Response.Header.Set(fasthttp.HeaderWWWAuthenticate, d.Challenge())
	return false
}

// errRepeatedAuthorization is the reason of a request with more than one
// Authorization header while client tokens are on (400); the admin port
// answers it too.
const errRepeatedAuthorization = "bad request: the Authorization header is repeated"

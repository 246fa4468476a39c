package httpapi

import (
	"bytes"

	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/rpc"
)

// Checks on a request's headers, before any byte of its body is read.
//
// A request line of another HTTP version than 1.1 or 1.0 is refused
// (505): fasthttp would serve it as HTTP/1.1. An HTTP/1.0 PUT or POST
// without Content-Length is refused (411): its body, ended by the
// connection's close, fasthttp drops, and an empty value was stored.
//
// fasthttp v1.74.0 takes a request with both Transfer-Encoding: chunked and
// Content-Length (chunked wins) and one with Transfer-Encoding: identity
// (dropped; without Content-Length the body is then read as the next
// request): both are ambiguous framing that a proxy in front may resolve
// the other way (request smuggling, RFC 9112 §6.1, §6.3). And it reads a
// body before the handler runs (all of it, or with StreamRequestBody up to
// 8 KiB), waiting for it, even when the announced length is over the
// handler's limit, after sending 100 Continue to a client that asked for
// it. Its Server.HeaderReceived hook runs after the
// headers are parsed and before the body is touched; it cannot refuse a
// request, but it may change the header. HeaderReceived uses that: for a
// request to refuse it sets the length to 0 (fasthttp reads nothing of
// the body), removes Expect (no 100 Continue), asks for the connection to
// be closed (what was sent as a body is never read as a request), and
// marks the request; Handler answers a marked request with the refusal
// and nothing else. docs/http.md lists each case.

// refusalKey is the header that marks a refused request. A key read from
// the wire never contains ':' (the first one ends the key), so a client
// cannot send it.
const refusalKey = "Dhtkv:Refusal"

// refusals, indexed by the marker's byte.
var refusals = [...]struct {
	code   int
	reason string // "" for the body limit: worked out by refuse
}{
	'L': {fasthttp.StatusRequestEntityTooLarge, ""},
	'B': {fasthttp.StatusBadRequest, "both Transfer-Encoding and Content-Length: ambiguous message framing (RFC 9112 §6.1)"},
	'T': {fasthttp.StatusBadRequest, "Transfer-Encoding other than chunked (RFC 9112 §6.1)"},
	'V': {fasthttp.StatusHTTPVersionNotSupported, "HTTP version not supported: dhtkv speaks HTTP/1.1 (and HTTP/1.0)"},
	'N': {fasthttp.StatusLengthRequired, "length required: an HTTP/1.0 PUT or POST needs a Content-Length (0 for an empty value)"},
}

// HeaderReceived is the node's fasthttp Server.HeaderReceived: it marks
// the requests to refuse from their headers alone (see above). It never
// changes fasthttp's limits.
func (s *Server) HeaderReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	var mark byte
	te, cl := framingHeaders(h.RawHeaders())
	switch {
	case !h.IsHTTP11() && !bytes.Equal(h.Protocol(), http10):
		// fasthttp serves any version as HTTP/1.1: "HTTP/2.0" from a
		// client that believes it speaks HTTP/2 would get answers in a
		// protocol it does not read.
		mark = 'V'
	case te && cl:
		mark = 'B'
	case h.ContentLength() == -2 && !h.IsHTTP11() && (h.IsPut() || h.IsPost()):
		// Neither Content-Length nor Transfer-Encoding: an HTTP/1.0
		// body then runs to the connection's end, which fasthttp
		// drops (the body is zero bytes long): the value stored
		// would be empty, whatever the client sent.
		mark = 'N'
	case te && h.ContentLength() != -1: // identity: fasthttp dropped it
		mark = 'T'
	case h.ContentLength() > s.bodyLimit(h.RequestURI()):
		mark = 'L'
	default:
		return fasthttp.RequestConfig{}
	}
	h.SetContentLength(0)
	h.Del(fasthttp.HeaderExpect)
	h.SetConnectionClose()
	h.SetBytesV(refusalKey, []byte{mark})
	return fasthttp.RequestConfig{}
}

// refused answers a request HeaderReceived marked, and reports whether it
// was one. A marked request has a zero length and asks to close; others
// are rarely both, so most requests cost two field reads here.
func (s *Server) refused(ctx *fasthttp.RequestCtx) bool {
	h := &ctx.Request.Header
	if h.ContentLength() != 0 || !h.ConnectionClose() {
		return false
	}
	m := h.Peek(refusalKey)
	if len(m) != 1 || int(m[0]) >= len(refusals) || refusals[m[0]].code == 0 {
		return false
	}
	r := refusals[m[0]]
	reason := r.reason
	if reason == "" {
		reason = tooLarge(s.bodyLimit(h.RequestURI())).reason
	}
	ctx.Error(reason+"\n", r.code)
	ctx.SetConnectionClose()
	lingerOnClose(ctx) // the client may be sending the body: let it read the answer
	return true
}

// bodyLimit is the largest body a request to uri may carry: an internal
// batch's, or a value's for everything else.
func (s *Server) bodyLimit(uri []byte) int {
	if s.Limits.MaxBatchBytes > 0 && isPath(uri, batchPath) {
		return s.Limits.MaxBatchBytes
	}
	if isPath(uri, summaryPath) {
		return rpc.MaxSummaryRequestBytes // whatever --max-value-bytes is
	}
	if isPath(uri, mapPath) {
		return rpc.MaxMapBytes
	}
	return s.Limits.MaxValueBytes
}

// isPath reports whether uri is path, with or without a query.
func isPath(uri, path []byte) bool {
	return bytes.HasPrefix(uri, path) && (len(uri) == len(path) || uri[len(path)] == '?')
}

var (
	http10      = []byte("HTTP/1.0")
	batchPath   = []byte(rpc.BatchPath)
	summaryPath = []byte(rpc.SummaryPath)
	mapPath     = []byte(rpc.MapPath)
)

// framingHeaders reports whether the raw header block holds a
// Transfer-Encoding and a Content-Length field. fasthttp has parsed the
// block already, so every line is "name:value" with a valid name.
func framingHeaders(raw []byte) (te, cl bool) {
	const (
		teName = "transfer-encoding"
		clName = "content-length"
	)
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		switch {
		case len(line) > len(teName) && line[len(teName)] == ':' && line[0]|0x20 == 't':
			te = te || bytes.EqualFold(line[:len(teName)], []byte(teName))
		case len(line) > len(clName) && line[len(clName)] == ':' && line[0]|0x20 == 'c':
			cl = cl || bytes.EqualFold(line[:len(clName)], []byte(clName))
		}
	}
	return te, cl
}

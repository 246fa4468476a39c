package httpapi

import (
	"bytes"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/record"
)

// The metadata headers of a GET's and a HEAD's 200 (and 304) answer. HEAD
// answers exactly GET's headers, Content-Length included, without the
// body (RFC 9110 §9.3.2), so that a client learns a key's version, size
// and expiry without its value.
const (
	// ExpiresAtHeader is when a value written with a ttl expires, RFC 3339
	// in UTC with milliseconds; absent for a value that never expires.
	// TTLHeader (params.go), on such an answer, is the whole seconds left
	// until then, rounded up: at least 1 while the value is live.
	ExpiresAtHeader = "X-Dhtkv-Expires-At"
	// ErrorHeader carries a HEAD's one-line reason for a 4xx or 5xx:
	// fasthttp sends no body in answer to HEAD, so the reason a GET would
	// have in its body goes here (sanitized to printable ASCII).
	ErrorHeader = "X-Dhtkv-Error"
)

var (
	headerETag         = []byte(fasthttp.HeaderETag)
	headerCacheControl = []byte(fasthttp.HeaderCacheControl)
	headerExpiresAt    = []byte(ExpiresAtHeader)
	headerTTL          = []byte(TTLHeader)
	headerIfNoneMatch  = []byte(fasthttp.HeaderIfNoneMatch)
	noCache            = []byte("no-cache")
)

// preconditions are the request headers that ask for a conditional
// request (RFC 9110 §13.1).
var preconditions = []string{fasthttp.HeaderIfMatch, fasthttp.HeaderIfNoneMatch, fasthttp.HeaderIfUnmodifiedSince}

// checkPreconditions refuses what the entity endpoint cannot honour.
// A read (GET, HEAD) honours If-None-Match (answered 304 when it names the
// current version, notModified) and ignores the rest, as RFC 9110 lets a
// server that has no modification date do: ignoring a precondition on a
// read still gives the current value. A write refuses every one, 400:
// last-write-wins replicas cannot compare a version and write as one step,
// and a write whose client meant "only if unchanged" or "only if absent"
// that went through anyway would be the lost update the client guarded
// against. A malformed If-None-Match is refused on a read too.
//
// ifNoneMatch is the request's If-None-Match (nil: none), which the caller
// reads once for this check and notModified.
func checkPreconditions(h *fasthttp.RequestHeader, op Op, ifNoneMatch []byte) *apiError {
	if op == OpGet || op == OpHead {
		if ifNoneMatch != nil && !validETagList(ifNoneMatch) {
			return badRequest(`If-None-Match %q: want *, or "etag" values (W/ allowed) separated by commas`, ifNoneMatch)
		}
		return nil
	}
	for _, name := range preconditions {
		if h.Peek(name) != nil {
			return badRequest("%s: conditional writes are not supported (the replicas cannot compare a version and write as one step)", name)
		}
	}
	return nil
}

// setMeta adds rec's metadata to a 200 or 304 answer: the version as a
// strong ETag (a version names one write of one key, so its bytes: a
// strong validator), the expiry of a value written with a ttl, and
// Cache-Control: no-cache, so that an HTTP cache that stores the value
// asks again, with If-None-Match, before using it (without it a cache may
// serve the value heuristically fresh after it changed). It allocates
// nothing: the values are formatted on the stack and copied into the
// response's header buffer. h must not have these headers yet: they are
// added, not set (no search for an existing one on the GET path).
func setMeta(h *fasthttp.ResponseHeader, rec *record.Record) {
	var buf [32]byte
	h.AddBytesKV(headerETag, appendETag(buf[:0], rec.Version))
	h.AddBytesKV(headerCacheControl, noCache)
	if rec.ExpiresAt == 0 {
		return
	}
	// record.Decode refuses an expiry beyond an int64's; the min keeps a
	// record made otherwise from reading as a time before 1970.
	exp := time.UnixMilli(int64(min(rec.ExpiresAt, record.MaxExpiresAt))).UTC()
	h.AddBytesKV(headerExpiresAt, exp.AppendFormat(buf[:0], "2006-01-02T15:04:05.000Z07:00"))
	h.AddBytesKV(headerTTL, strconv.AppendInt(buf[:0], ttlLeft(time.Until(exp)), 10))
}

// ttlLeft is X-Dhtkv-TTL's value for a live value that expires in d: whole
// seconds rounded up, 1 or more. time.Until saturates at the largest
// Duration, so d is not rounded up by adding to it, which would wrap.
func ttlLeft(d time.Duration) int64 {
	left := d / time.Second
	if d%time.Second > 0 {
		left++
	}
	return int64(max(left, 1))
}

// appendETag appends version's entity tag: the decimal version, quoted.
func appendETag(dst []byte, version uint64) []byte {
	dst = append(dst, '"')
	dst = strconv.AppendUint(dst, version, 10)
	return append(dst, '"')
}

// notModified reports whether an If-None-Match list (validETagList) names
// version, or is "*": the client already has the current value (weak
// comparison, as RFC 9110 §13.1.2 prescribes for If-None-Match).
func notModified(list []byte, version uint64) bool {
	if list == nil {
		return false
	}
	var buf [24]byte
	want := strconv.AppendUint(buf[:0], version, 10)
	match := false
	eachETag(list, func(tag []byte) {
		if tag == nil || bytes.Equal(tag, want) {
			match = true
		}
	})
	return match
}

// validETagList reports whether v is "*" or a comma-separated list of
// entity tags, "opaque" or W/"opaque" (RFC 9110 §8.8.3), empty elements
// allowed.
func validETagList(v []byte) bool { return eachETag(v, func([]byte) {}) }

// eachETag calls f with the opaque part of each tag of an If-None-Match
// value (nil for "*") and reports whether the value was well formed; it
// stops at the first malformed element.
func eachETag(v []byte, f func(tag []byte)) bool {
	v = bytes.TrimSpace(v)
	if string(v) == "*" {
		f(nil)
		return true
	}
	for len(v) > 0 {
		v = bytes.TrimLeft(v, " \t,")
		if len(v) == 0 {
			break
		}
		v, _ = bytes.CutPrefix(v, []byte("W/"))
		if len(v) < 2 || v[0] != '"' {
			return false
		}
		end := bytes.IndexByte(v[1:], '"')
		if end < 0 {
			return false
		}
		f(v[1 : 1+end])
		v = bytes.TrimLeft(v[2+end:], " \t")
		if len(v) > 0 && v[0] != ',' {
			return false
		}
	}
	return true
}

// headReason copies a HEAD's error reason, the first line of the body
// fasthttp will not send, into ErrorHeader, as printable ASCII.
func headReason(resp *fasthttp.Response) {
	if resp.IsBodyStream() {
		return
	}
	line, _, _ := bytes.Cut(resp.Body(), []byte("\n"))
	var buf [256]byte
	out := buf[:0]
	for _, c := range line {
		if len(out) == cap(out) {
			break
		}
		if c < 0x20 || c > 0x7e {
			c = '?'
		}
		out = append(out, c)
	}
	resp.Header.SetBytesV(ErrorHeader, out)
}

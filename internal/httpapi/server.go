// Package httpapi serves dhtkv's HTTP API on fasthttp: it parses and
// validates requests, routes them, and writes the answers. The public
// entity and range endpoints go to the cluster coordinator; the internal
// endpoints, which nodes use to reach each other's replicas, are mounted
// from package rpc, which serves them.
//
// A request's path, top to bottom: Server.Handler routes by path; the entity
// handler parses and validates the query (params.go), then hands the key to
// the cluster coordinator, which serves the local replica (package replica:
// read cache, then Pebble) in-process and the remote ones through package
// rpc (a batch to the other node's rpc.Server, mounted here).
//
// fasthttp reuses the request's and response's buffers once a handler
// returns: nothing here keeps a slice of them; the coordinator copies what
// its goroutines need.
package httpapi

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/clientauth"
	"github.com/dhtkv/dhtkv/internal/cluster"
	"github.com/dhtkv/dhtkv/internal/probe"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/store"
)

// Limits bounds what a request may carry.
type Limits struct {
	// MaxKeyBytes is the longest key (400 beyond).
	MaxKeyBytes int
	// MaxValueBytes is the largest value, and the largest body of any
	// request but an internal batch (413 beyond).
	MaxValueBytes int
	// MaxBatchBytes is the largest body of an internal batch (rpc.BatchPath;
	// 413 beyond). 0 means MaxValueBytes.
	MaxBatchBytes int
	// MaxInflightBodyBytes is the budget, in bytes, of the buffers that
	// hold the bodies of the requests in flight (body.go); a body that
	// would take them past it is refused with 503. 0: no budget.
	MaxInflightBodyBytes int64
	// MaxInflightResponseBytes is the budget, in bytes, of the values
	// answered by reference and not yet written to their clients
	// (held.go); a GET whose value would take them past it is refused
	// with 503. 0: no budget.
	MaxInflightResponseBytes int64
}

// Server holds what the handlers need.
type Server struct {
	Coord *cluster.Coordinator
	// Status is what /v0/status reports of the cluster parts.
	Status Status
	// RPC serves the internal endpoints (BatchPath, StreamPath).
	RPC     *rpc.Server
	Limits  Limits
	Metrics *Metrics
	Log     *slog.Logger
	// Started is when the node started, for the uptime that
	// /v0/status?verbose reports.
	Started time.Time
	// ScanIdleTimeout bounds how long a range stream may make no progress
	// (client not reading, another node not sending) before it is aborted
	// (default DefaultScanIdleTimeout). It replaces fasthttp's whole-
	// response write deadline for streams, which may run for any time.
	ScanIdleTimeout time.Duration
	// MaxScans bounds the range streams in flight, public and internal
	// together (--max-scans; default DefaultMaxScans): each holds an
	// iterator, and with it the store's memory as of its start. Beyond,
	// 429 with the reason.
	MaxScans int
	// ScanMinRate is the slowest a stream's client may read, in bytes per
	// second (--scan-min-rate, whose default is DefaultScanMinRate; 0: no
	// minimum, only ScanIdleTimeout): a piece of n bytes must be taken
	// within 5 s + n/ScanMinRate, else the stream is aborted.
	ScanMinRate int64
	// ScanReleaseAfter is how long a range stream's write to its client may
	// block before the stream releases its store iterator, and with it the
	// snapshot's memtables and sstables (default DefaultScanReleaseAfter;
	// negative: never). The stream resumes from a new snapshot just after
	// the last key it sent once the client reads again (docs/http.md).
	ScanReleaseAfter time.Duration
	// RawValueMinBytes is the size in bytes from which a GET's value is
	// answered by reference instead of copied (default RawValueMinBytes;
	// negative: always copied; see setValue).
	RawValueMinBytes int
	// Tokens are the client tokens a request must carry one of, with the
	// role its path and method need (auth.go); nil: client authentication
	// off, every request served.
	Tokens *clientauth.Tokens
	// AccessLog configures the access log (accesslog.go; off by default).
	AccessLog AccessLogOptions

	scans     scanRegistry // range streams in flight (entities.go)
	bodyBytes atomic.Int64 // request body buffers held, in bytes (body.go)
	bodyPool  sync.Pool    // of *bodyBuf (body.go)
	heldBytes atomic.Int64 // response values held, in bytes (held.go)
}

// DefaultMaxScans, DefaultScanMinRate and DefaultScanReleaseAfter are
// Server.MaxScans's, Server.ScanMinRate's and Server.ScanReleaseAfter's
// defaults.
const (
	DefaultMaxScans         = 64
	DefaultScanMinRate      = 16 << 10
	DefaultScanReleaseAfter = 100 * time.Millisecond
)

const (
	pathEntity   = "/v0/entity"
	pathEntities = "/v0/entities"
	pathStatus   = "/v0/status"
)

// Handler is the fasthttp request handler.
func (s *Server) Handler(ctx *fasthttp.RequestCtx) {
	start := ctx.Time() // fasthttp's time.Now() of this request, taken just before the handler
	var info reqInfo    // for the access log; on the stack
	defer s.recoverPanic(ctx, start)
	op := s.route(ctx, &info)
	if ctx.RequestBodyStream() != nil && ctx.Request.Header.ContentLength() != 0 {
		s.unreadBody(ctx)
	}
	if ctx.Request.Header.ConnectionClose() {
		// The client's wish, or a body left unread (abandonBody).
		ctx.SetConnectionClose()
	}
	code := ctx.Response.StatusCode()
	if code >= 400 && ctx.IsHead() {
		headReason(&ctx.Response)
	}
	elapsed := time.Since(start)
	s.Metrics.Request(op, code, elapsed)
	if s.sampled() {
		s.logAccess(ctx, op, &info, elapsed)
	}
}

// recoverPanic answers 500 for a request whose handler panicked, logs
// the panic with its stack, and closes the connection. fasthttp recovers
// nothing: a bug that one request's path meets would end the whole node,
// and a client retrying it through every node would end them all in turn
// (a query of death). A panic is a bug; dhtkv_requests_total counts the
// 500 (as op "other").
func (s *Server) recoverPanic(ctx *fasthttp.RequestCtx, start time.Time) {
	p := recover()
	if p == nil {
		return
	}
	s.Log.Error("request handler panicked (a bug): answered 500", "panic", p, "method", string(ctx.Method()),
		"path", string(ctx.Path()), "stack", string(debug.Stack()))
	ctx.Response.Reset()
	fail(ctx, &apiError{code: fasthttp.StatusInternalServerError, reason: "internal error: this node hit a bug serving the request (logged)"})
	ctx.SetConnectionClose()
	s.Metrics.Request(OpOther, fasthttp.StatusInternalServerError, time.Since(start))
}

// unreadBody deals with a body the handler did not take (a GET's, a
// refused request's; readBody releases the stream once it read the body,
// and abandons it on an error): its rest must never be parsed as the next
// request on the connection. It is read and dropped by its framing, at
// most the path's body limit within the read timeout, and the connection
// then carries on; a body that does not end within the bounds, or ends
// cut short, closes it (lingering, unless the client timed out).
func (s *Server) unreadBody(ctx *fasthttp.RequestCtx) {
	h := &ctx.Request.Header
	if aerr := discardBody(ctx.RequestBodyStream(), h.ContentLength(), s.bodyLimit(h.RequestURI())); aerr != nil {
		abandonBody(ctx, aerr.code != fasthttp.StatusRequestTimeout)
		return
	}
	_ = ctx.Request.CloseBodyStream()
}

// route serves the request by its path and returns its kind.
func (s *Server) route(ctx *fasthttp.RequestCtx, info *reqInfo) Op {
	if s.refused(ctx) {
		return OpOther
	}
	r, known := access[string(ctx.Path())]
	if !known {
		fail(ctx, badRequest("unknown path %q", ctx.Path()))
		return OpOther
	}
	if !s.authorized(ctx, r) {
		return OpOther
	}
	var op Op
	switch string(ctx.Path()) {
	case pathEntity:
		op = s.entity(ctx, info)
	case pathStatus:
		op = OpStatus
		s.status(ctx)
	case pathEntities:
		op = OpScan
		s.entities(ctx)
	case rpc.BatchPath:
		op = OpInternalBatch
		s.internal(ctx, rpc.BatchPath)
	case rpc.StreamPath:
		op = OpInternalScan
		s.internal(ctx, rpc.StreamPath)
	case rpc.SummaryPath:
		op = OpInternalSummary
		s.internal(ctx, rpc.SummaryPath)
	case rpc.MapPath:
		op = OpInternalMap
		s.internal(ctx, rpc.MapPath)
	case rpc.ReachPath:
		op = OpInternalReach
		s.internal(ctx, rpc.ReachPath)
	case rpc.LogPath:
		op = OpInternalLog
		if s.RPC.Accept(ctx, rpc.LogPath) {
			s.RPC.HandleLogUpgrade(ctx)
		}
	default:
		op = OpOther
		fail(ctx, badRequest("unknown path %q", ctx.Path()))
	}
	return op
}

// entity serves /v0/entity. GET and HEAD answer the same headers (HEAD
// without the body; fasthttp drops it and keeps the Content-Length set
// here): the value's metadata (setMeta) and its length.
func (s *Server) entity(ctx *fasthttp.RequestCtx, info *reqInfo) Op {
	var op Op
	switch {
	case ctx.IsGet():
		op = OpGet
	case ctx.IsHead():
		op = OpHead
	case ctx.IsPut():
		op = OpPut
	case ctx.IsDelete():
		op = OpDelete
	default:
		methodNotAllowed(ctx, "GET, HEAD, PUT, DELETE")
		return OpOther
	}
	replicas, readAck := s.Coord.Factors()
	maxAck := replicas
	if op == OpGet || op == OpHead {
		maxAck = readAck // a read asks one set
	}
	p, aerr := parseEntity(ctx.URI().QueryString(), ctx.QueryArgs(), replicas, maxAck, s.Limits.MaxKeyBytes)
	if aerr != nil {
		fail(ctx, aerr)
		return op
	}
	info.key, info.ack, info.from = p.key, p.ack, p.from
	ttl, aerr := parseTTL(ctx.QueryArgs(), ctx.Request.Header.PeekAll(TTLHeader))
	if aerr == nil && ttl > 0 && op != OpPut {
		aerr = badRequest("ttl applies to PUT only")
	}
	ifNoneMatch := ctx.Request.Header.PeekBytes(headerIfNoneMatch)
	if aerr == nil {
		aerr = checkPreconditions(&ctx.Request.Header, op, ifNoneMatch)
	}
	if aerr != nil {
		fail(ctx, aerr)
		return op
	}
	switch op {
	case OpGet, OpHead:
		ack := p.ack
		if !p.ackGiven {
			// The default: Get takes it from the view it routes by, which
			// a route again after a stale epoch may change (a growth's
			// read-new asks a larger set than its stream stage).
			ack = 0
		}
		res, err := s.Coord.Get(p.key, ack, p.from)
		switch {
		case err != nil:
			s.replicaError(ctx, err)
		case res.Live():
			setMeta(&ctx.Response.Header, &res.Rec)
			switch {
			case notModified(ifNoneMatch, res.Rec.Version):
				ctx.SetStatusCode(fasthttp.StatusNotModified)
			case op == OpHead:
				ctx.Response.Header.SetContentLength(len(res.Rec.Value))
			default:
				if aerr := s.setValue(ctx, res.Rec.Value); aerr != nil {
					fail(ctx, aerr)
				}
			}
		default:
			ctx.Error("not found\n", fasthttp.StatusNotFound)
		}
	case OpPut:
		body, aerr := s.readBody(ctx, s.Limits.MaxValueBytes)
		if aerr != nil {
			fail(ctx, aerr)
			return op
		}
		defer body.release()
		// Write copies what it keeps: the body's buffer is reused.
		if err := s.Coord.Write(p.key, body.bytes(), false, ttl, p.ack, p.from); err != nil {
			s.replicaError(ctx, err)
			return op
		}
		ctx.SetStatusCode(fasthttp.StatusCreated)
	case OpDelete:
		if err := s.Coord.Write(p.key, nil, true, 0, p.ack, p.from); err != nil {
			s.replicaError(ctx, err)
			return op
		}
		ctx.SetStatusCode(fasthttp.StatusAccepted)
	}
	return op
}

// RawValueMinBytes is Server.RawValueMinBytes's default: 16 KiB.
const RawValueMinBytes = 16 << 10

// setValue makes value the response body. A value of RawValueMinBytes or
// more is not copied: the response references it (a heldValue, charged to
// MaxInflightResponseBytes: 503 beyond), so that the connections sending
// one cached value share its bytes instead of each holding a copy for as
// long as its client takes to read it. A smaller one is copied into the
// connection's pooled body buffer, which costs less than giving that
// buffer back to the pool and taking it again per request.
//
// A referenced value must not change until the response is written;
// fasthttp drops its reference then (it closes the body stream once it
// wrote it, failed to, or reset the response). Nothing changes a value
// Coordinator.Get returns:
//
//   - a read-cache entry is one buffer, immutable once cached (package
//     cache). ristretto v2.4.2 never writes into a value either: eviction
//     and Del only delete the map's reference (lockedMap.Del: delete of
//     the map entry, the value handed to OnEvict/OnExit, which the cache
//     does not set), a Set of a cached key stores the new slice in place
//     of the old one, and nothing pools or reuses values. An evicted
//     value is only unreachable from the cache: the garbage collector
//     keeps its bytes while a response still references them;
//   - a cache fill, or a read with the cache off, returns a buffer
//     store.AppendEnvelope allocated for that read;
//   - another replica's answer is a clone rpc.Peer made for this call.
func (s *Server) setValue(ctx *fasthttp.RequestCtx, value []byte) *apiError {
	raw := s.RawValueMinBytes
	if raw == 0 {
		raw = RawValueMinBytes
	}
	if raw > 0 && len(value) >= raw {
		return s.holdValue(ctx, value)
	}
	ctx.SetBody(value) // copies into the response's body buffer
	return nil
}

// replicaError answers a coordinator failure (replicaStatus).
func (s *Server) replicaError(ctx *fasthttp.RequestCtx, err error) {
	code, reason := s.replicaStatus(ctx.Path(), err)
	ctx.Error(reason+"\n", code)
}

// replicaStatus maps a coordinator failure to its status and reason: too
// few replicas answered, or too few peers to verify this node's clock,
// is the contract's 504; a write refused for a clock (this node's, off
// or not verified, or the one that made a replica's version) is 503 with
// the reason, and so is any request on a node that is no longer a member
// of the cluster map; a write this node's store cannot take now (its disk below
// --min-free-space, or failed) is 507 with the reason; anything else is
// the server's fault, logged.
func (s *Server) replicaStatus(path []byte, err error) (int, string) {
	switch {
	case errors.Is(err, store.ErrInsufficientStorage):
		return fasthttp.StatusInsufficientStorage, store.Reason(err)
	case errors.Is(err, cluster.ErrNotEnoughReplicas):
		var re *cluster.ReplicasError
		if errors.As(err, &re) {
			return fasthttp.StatusGatewayTimeout, re.Error()
		}
		return fasthttp.StatusGatewayTimeout, "not enough replicas"
	case errors.Is(err, probe.ErrTooFewPeers):
		// Too few peers answered to verify this node's clock: as the
		// write itself would find, not enough nodes answered.
		return fasthttp.StatusGatewayTimeout, err.Error()
	case errors.Is(err, probe.ErrClockSkew), errors.Is(err, probe.ErrClockUnverified), errors.Is(err, cluster.ErrReplicaAhead), errors.Is(err, cluster.ErrVersionAhead),
		errors.Is(err, cluster.ErrNotAMember):
		// A clock this node cannot vouch for, or a replica's version
		// made by one: not the server's fault, and it says why.
		return fasthttp.StatusServiceUnavailable, err.Error()
	}
	s.Log.Error("request failed", "path", string(path), "err", err)
	return fasthttp.StatusInternalServerError, "internal error"
}

func fail(ctx *fasthttp.RequestCtx, e *apiError) {
	ctx.Error(e.reason+"\n", e.code)
}

func methodNotAllowed(ctx *fasthttp.RequestCtx, allow string) {
	ctx.Error("method not allowed\n", fasthttp.StatusMethodNotAllowed) // resets headers
	ctx.Response.Header.Set(fasthttp.HeaderAllow, allow)
}

// ErrorHandler answers requests that fasthttp could not read, before
// Handler runs, with the contract's statuses and a one-line reason:
// fasthttp's default answers a body over the limit with a bare 400.
func (s *Server) ErrorHandler(ctx *fasthttp.RequestCtx, err error) {
	var small *fasthttp.ErrSmallBuffer
	var netErr net.Error
	// fasthttp closes the connection after this answer, with what the
	// client still sends unread: lingering, the client reads the answer
	// rather than a reset (but one that timed out is not sending).
	if !errors.As(err, &netErr) || !netErr.Timeout() {
		lingerOnClose(ctx)
	}
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		ctx.Error(fmt.Sprintf("value too large: limit is %d bytes\n", s.Limits.MaxValueBytes), fasthttp.StatusRequestEntityTooLarge)
	case errors.As(err, &small):
		ctx.Error("request line and headers too large\n", fasthttp.StatusRequestHeaderFieldsTooLarge)
	case errors.As(err, &netErr) && netErr.Timeout():
		ctx.Error("request timeout\n", fasthttp.StatusRequestTimeout)
	default:
		ctx.Error("malformed request: "+parseReason(err)+"\n", fasthttp.StatusBadRequest)
	}
}

// parseReason is fasthttp's reason for a request it could not read, as
// one short line ("missing required host header in request",
// "unsupported transfer-encoding: \"gzip\""): without the dump of the
// read buffer fasthttp appends (": buffer size=N, contents: ..."), any
// control character a snippet of the request let through cut, and the
// length bounded.
func parseReason(err error) string {
	const most = 200
	msg := strings.TrimPrefix(err.Error(), "error when reading request headers: ")
	if i := strings.Index(msg, ": buffer size="); i >= 0 {
		msg = msg[:i]
	}
	r := []rune(msg)
	for i, c := range r {
		if unicode.IsControl(c) {
			r[i] = ' '
		}
	}
	if len(r) > most {
		return string(r[:most]) + "..."
	}
	return string(r)
}

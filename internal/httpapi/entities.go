package httpapi

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/cluster"
	"github.com/dhtkv/dhtkv/internal/scan"
)

// Range scans. The handlers here parse the query, ask the coordinator for
// the records (this node's store, or for scope=cluster every node's stream
// merged) and hand them to a scan.Body, which fasthttp writes to the
// client after the handler returns. The contract, the framings and the
// failure semantics are in docs/range-scans.md.

// DefaultScanIdleTimeout is used when Server.ScanIdleTimeout is zero.
const DefaultScanIdleTimeout = 30 * time.Second

// MaxScanLimit is the largest limit a range scan accepts. A scan streams,
// so its memory does not depend on the limit; the bound keeps the
// parameter a number every client's integers hold (it fits in 32 bits).
const MaxScanLimit = 1_000_000_000

// firstKey is the start of a range whose start is omitted: the smallest
// key there can be, since keys are never empty. It is sent on to the other
// nodes of a cluster scan as an explicit start, which their internal
// stream endpoint requires.
const firstKey = "\x00"

// rangeParams is the parsed query of /v0/entities.
type rangeParams struct {
	start, end []byte // start never empty (firstKey if omitted); end nil: to the last key; both alias the request
	format     scan.Format
	limit      uint64 // at most this many live records; 0: no limit
	cluster    bool
	ack, from  int
}

// parseRange applies the contract (docs/range-scans.md): start, when
// present, must be non-empty, and when omitted the range starts at the
// first key; end, when present, must be non-empty too (an empty bound is
// more likely a client bug than an intent); limit, when present, is a
// whole number from 1 to MaxScanLimit; format and scope are closed sets;
// ack/from follow the entity rules and only mean something with
// scope=cluster.
func parseRange(args *fasthttp.Args, replicas, maxKey int) (rangeParams, *apiError) {
	var p rangeParams
	var aerr *apiError
	p.start = []byte(firstKey)
	if args.Has("start") {
		if p.start, aerr = parseKey(args, "start", maxKey); aerr != nil {
			return p, aerr
		}
	}
	if args.Has("end") {
		if p.end, aerr = parseKey(args, "end", maxKey); aerr != nil {
			return p, aerr
		}
	}
	if args.Has("limit") {
		l := args.Peek("limit")
		n, err := strconv.ParseUint(string(l), 10, 64)
		if err != nil || n < 1 || n > MaxScanLimit {
			return p, badRequest("limit=%q: want a whole number from 1 to %d", l, MaxScanLimit)
		}
		p.limit = n
	}
	switch f := string(args.Peek("format")); f {
	case "", "chunks":
		p.format = scan.FormatChunks
	case "binary":
		p.format = scan.FormatBinary
	case "json":
		p.format = scan.FormatJSON
	default:
		return p, badRequest("format=%q: want chunks, binary or json", f)
	}
	switch sc := string(args.Peek("scope")); sc {
	case "", "local":
	case "cluster":
		p.cluster = true
	default:
		return p, badRequest("scope=%q: want local or cluster", sc)
	}
	if !p.cluster {
		if args.Has("ack") || args.Has("from") {
			return p, badRequest("ack and from apply to scope=cluster only")
		}
		return p, nil
	}
	// Same rules and defaults as /v0/entity: from = cluster size, ack =
	// majority of from.
	if p.ack, p.from, aerr = parseReplication(args, replicas); aerr != nil {
		return p, aerr
	}
	return p, nil
}

// entities serves GET /v0/entities.
func (s *Server) entities(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() {
		methodNotAllowed(ctx, "GET")
		return
	}
	p, aerr := parseRange(ctx.QueryArgs(), s.Coord.Replicas(), s.Limits.MaxKeyBytes)
	if aerr != nil {
		fail(ctx, aerr)
		return
	}
	st, ok := s.scans.register(ctx.Conn())
	if !ok {
		ctx.Error("node shutting down\n", fasthttp.StatusServiceUnavailable)
		return
	}
	var it scan.Iterator
	var err error
	name := "local"
	if p.cluster {
		name = "cluster"
		it, err = s.Coord.Scan(st.ctx, p.start, p.end, p.ack, p.from)
	} else {
		it, err = s.Coord.ScanLocal(p.start, p.end)
	}
	if err != nil {
		s.scans.unregister(st)
		if errors.Is(err, cluster.ErrNotEnoughReplicas) {
			ctx.Error(err.Error()+"\n", fasthttp.StatusGatewayTimeout)
			return
		}
		s.replicaError(ctx, err)
		return
	}
	s.streamLimited(ctx, st, it, p.format, p.limit, name)
}

// stream hands it to fasthttp as a chunked body written after the handler
// returns.
func (s *Server) stream(ctx *fasthttp.RequestCtx, st *scanStream, it scan.Iterator, f scan.Format, name string) {
	s.streamLimited(ctx, st, it, f, 0, name)
}

// streamLimited is stream ending after limit records (0: none; see
// scan.BodyOptions.Limit).
func (s *Server) streamLimited(ctx *fasthttp.RequestCtx, st *scanStream, it scan.Iterator, f scan.Format, limit uint64, name string) {
	idle := s.ScanIdleTimeout
	if idle <= 0 {
		idle = DefaultScanIdleTimeout
	}
	conn := st.conn
	body := scan.NewBody(it, f, scan.BodyOptions{
		Ctx: st.ctx,
		// fasthttp sets the write deadline once per response; a scan
		// may take longer than that, so every write pushes it forward:
		// it then bounds how long a client may stall.
		BeforeWrite: func() error { return conn.SetWriteDeadline(time.Now().Add(idle)) },
		OnClose:     func() { s.scans.unregister(st) },
		Limit:       limit,
		Metrics:     s.Metrics.Scan,
		Log:         s.Log,
		Name:        name + " " + conn.RemoteAddr().String(),
	})
	if f == scan.FormatJSON {
		ctx.SetContentType("application/x-ndjson")
	} else {
		ctx.SetContentType("application/octet-stream")
	}
	// Headers go out at once, before the first record: a coordinator
	// knows the stream is open even if the range starts with a long run of
	// skipped tombstones.
	ctx.Response.ImmediateHeaderFlush = true
	ctx.Response.SetBodyStream(body, -1)
}

// scanRegistry tracks the streams in flight so that a stopping node can
// end them: a range may take any time, and graceful shutdown must not wait
// for it (nor close the store under its iterator).
type scanRegistry struct {
	mu      sync.Mutex
	closing bool
	streams map[*scanStream]struct{}
}

// scanStream is one range request being served.
type scanStream struct {
	conn   net.Conn
	ctx    context.Context
	cancel context.CancelFunc
}

func (r *scanRegistry) register(conn net.Conn) (*scanStream, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing {
		return nil, false
	}
	ctx, cancel := context.WithCancel(context.Background())
	st := &scanStream{conn: conn, ctx: ctx, cancel: cancel}
	if r.streams == nil {
		r.streams = map[*scanStream]struct{}{}
	}
	r.streams[st] = struct{}{}
	return st, true
}

func (r *scanRegistry) unregister(st *scanStream) {
	st.cancel()
	r.mu.Lock()
	delete(r.streams, st)
	r.mu.Unlock()
}

// Close aborts every range stream in flight and refuses new ones (503).
// Each stream's context is cancelled (its reads of other nodes fail) and
// its connection closed (its writes fail), so the streams end at once with
// a truncated body, never a complete-looking one. The node calls it before
// shutting the HTTP server down, whose shutdown then waits for the aborted
// streams to close their iterators.
func (s *Server) Close() {
	r := &s.scans
	r.mu.Lock()
	r.closing = true
	streams := make([]*scanStream, 0, len(r.streams))
	for st := range r.streams {
		streams = append(streams, st)
	}
	r.mu.Unlock()
	for _, st := range streams {
		st.cancel()
		st.conn.Close()
	}
}

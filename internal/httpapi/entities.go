package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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

// rangeParams is the parsed query of /v0/entities.
type rangeParams struct {
	start, end []byte // start never empty; end nil: to the last key; both alias the request
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
// scope=cluster; no other parameter (checkQuery).
func parseRange(raw []byte, args *fasthttp.Args, replicas, maxAck, maxKey int) (rangeParams, *apiError) {
	var p rangeParams
	var aerr *apiError
	// The course's contract: a range has a start (absent or empty: 400).
	// The smallest key there can be is "\x00" (start=%00), keys being
	// never empty: a scan from the first key names it.
	if p.start, aerr = parseKey(args, "start", maxKey); aerr != nil {
		aerr.reason += " (the first key of the range; %00, the smallest key, scans from the beginning)"
		return p, aerr
	}
	if aerr = checkQuery(raw, args, "start", "end", "limit", "format", "scope", "ack", "from"); aerr != nil {
		return p, aerr
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
	// Same rules and defaults as /v0/entity: from = the replication
	// factor, ack = majority of from.
	if p.ack, p.from, aerr = parseReplication(args, replicas, maxAck); aerr != nil {
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
	replicas, maxAck := s.Coord.Factors() // a scan reads
	p, aerr := parseRange(ctx.URI().QueryString(), ctx.QueryArgs(), replicas, maxAck, s.Limits.MaxKeyBytes)
	if aerr != nil {
		fail(ctx, aerr)
		return
	}
	if !ctx.Request.Header.IsHTTP11() {
		s.entitiesHTTP10(ctx, p)
		return
	}
	st, aerr := s.scans.register(ctx.Conn(), false, s.maxScans())
	if aerr != nil {
		fail(ctx, aerr)
		return
	}
	it, name, err := s.openRange(st, p)
	if err != nil {
		s.scans.unregister(st)
		code, reason := s.rangeErrorStatus(ctx.Path(), err)
		ctx.Error(reason+"\n", code)
		return
	}
	s.stream(ctx, st, it, p.format, p.limit, name)
}

// openRange opens the records p asks for: this node's, or every node's
// merged.
func (s *Server) openRange(st *scanStream, p rangeParams) (it scan.Iterator, name string, err error) {
	if p.cluster {
		it, err = s.Coord.Scan(st.ctx, p.start, p.end, p.ack, p.from)
		return it, "cluster", err
	}
	it, err = s.Coord.ScanLocal(p.start, p.end)
	return it, "local", err
}

// rangeErrorStatus is the answer to a range that could not be opened.
func (s *Server) rangeErrorStatus(path []byte, err error) (int, string) {
	if errors.Is(err, cluster.ErrLocalRebuilding) {
		// scope=local on a rebuilding node: its records are not yet all
		// its replica holds, and nothing else can stand in for them.
		return fasthttp.StatusServiceUnavailable, "this node's replica is rebuilding: scan with scope=cluster, or through another node"
	}
	if errors.Is(err, cluster.ErrNotEnoughReplicas) {
		return fasthttp.StatusGatewayTimeout, err.Error()
	}
	return s.replicaStatus(path, err)
}

// stream hands it to fasthttp as a chunked body written after the handler
// returns, ending after limit records (0: none).
func (s *Server) stream(ctx *fasthttp.RequestCtx, st *scanStream, it scan.Iterator, f scan.Format, limit uint64, name string) {
	body := s.newBody(st, it, f, limit, name)
	ctx.SetContentType(contentType(f))
	// Headers go out at once, before the first record: a coordinator
	// knows the stream is open even if the range starts with a long run of
	// skipped tombstones.
	ctx.Response.ImmediateHeaderFlush = true
	ctx.Response.SetBodyStream(body, -1)
}

// contentType is the Content-Type of a range answer in format f.
func contentType(f scan.Format) string {
	if f == scan.FormatJSON {
		return "application/x-ndjson"
	}
	return "application/octet-stream"
}

// newBody is the response body streaming it on st's connection, ending
// after limit records (0: none; see scan.BodyOptions.Limit).
func (s *Server) newBody(st *scanStream, it scan.Iterator, f scan.Format, limit uint64, name string) *scan.Body {
	idle := s.scanIdleTimeout()
	conn := st.conn
	if s.ScanMinRate > 0 {
		// A blocked write returns only once the kernel has freed a third
		// of the socket's send buffer, which Linux grows up to
		// tcp_wmem's 4 MiB: the client would have to read ~1.3 MiB
		// within one piece's allowance (9 s at 16 KiB/s), and one
		// reading at twice the minimum rate is cut off as a trickler.
		capSendBuffer(conn, scanSendBuffer)
	}
	return scan.NewBody(it, f, scan.BodyOptions{
		Ctx: st.ctx,
		// fasthttp sets the write deadline once per response; a scan
		// may take longer than that, so every write pushes it forward:
		// it then bounds how long a client may stall.
		BeforeWrite:  func(n int) error { return conn.SetWriteDeadline(time.Now().Add(s.writeAllowance(n, idle))) },
		OnClose:      func() { s.scans.unregister(st) },
		Limit:        limit,
		ReleaseAfter: s.scanReleaseAfter(),
		Metrics:      s.Metrics.Scan,
		Log:          s.Log,
		Name:         name + " " + conn.RemoteAddr().String(),
	})
}

// maxScans is MaxScans or its default.
func (s *Server) maxScans() int {
	if s.MaxScans <= 0 {
		return DefaultMaxScans
	}
	return s.MaxScans
}

// writeAllowance is how long a stream's client may take to accept a piece
// of n bytes: scanRateGrace plus n at ScanMinRate, and never more than
// idle. A client that trickles (reads a little now and then, below the
// rate) is cut off instead of pinning the stream's iterator for as long
// as it likes.
func (s *Server) writeAllowance(n int, idle time.Duration) time.Duration {
	rate := s.ScanMinRate
	if rate <= 0 {
		return idle
	}
	return min(idle, scanRateGrace+time.Duration(float64(n)/float64(rate)*float64(time.Second)))
}

// scanSendBuffer is the TCP send buffer of a range stream's connection
// while a minimum rate is enforced (Linux doubles it): small enough that
// a write blocked on a full buffer returns after tens of KiB read, not
// megabytes, so the allowance judges the client's rate.
const scanSendBuffer = 128 << 10

// capSendBuffer sets the send buffer of conn's TCP connection, unwrapping
// TLS and the node's listener wrappers (NetConn); nothing if it finds none.
func capSendBuffer(conn net.Conn, n int) {
	for range 4 {
		if t, ok := conn.(interface{ SetWriteBuffer(int) error }); ok {
			_ = t.SetWriteBuffer(n)
			return
		}
		u, ok := conn.(interface{ NetConn() net.Conn })
		if !ok {
			return
		}
		conn = u.NetConn()
	}
}

// scanRateGrace is the time a stream's client has for any piece, on top
// of what its size takes at ScanMinRate.
const scanRateGrace = 5 * time.Second

// scanReleaseAfter is ScanReleaseAfter or its default; 0: never.
func (s *Server) scanReleaseAfter() time.Duration {
	switch {
	case s.ScanReleaseAfter < 0:
		return 0
	case s.ScanReleaseAfter == 0:
		return DefaultScanReleaseAfter
	}
	return s.ScanReleaseAfter
}

func (s *Server) scanIdleTimeout() time.Duration {
	if s.ScanIdleTimeout <= 0 {
		return DefaultScanIdleTimeout
	}
	return s.ScanIdleTimeout
}

// entitiesHTTP10 serves a range to an HTTP/1.0 client, which knows no
// chunked coding (RFC 9112 §7.1): the body ends when the connection
// closes (§6.3). fasthttp v1.74.0 chunks every body stream of unknown
// length, so the handler hijacks the connection instead. With
// HijackSetNoResponse fasthttp writes no response, flushes what it
// buffered for earlier requests, stops reading requests, calls the hijack
// handler on a goroutine of its own and closes the connection when it
// returns. The range is opened in the hijack handler, not here,
// so that nothing is left open should fasthttp not call it (a failed
// flush). The handler keeps no buffer of ctx's: the keys are copied.
func (s *Server) entitiesHTTP10(ctx *fasthttp.RequestCtx, p rangeParams) {
	p.start, p.end = bytes.Clone(p.start), bytes.Clone(p.end)
	// The connection itself: the one fasthttp hands to the hijack handler
	// ignores Close, which Server.Close needs to abort the stream.
	conn := ctx.Conn()
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(net.Conn) { s.serveRangeHTTP10(conn, p) })
}

// serveRangeHTTP10 writes the whole answer to a hijacked HTTP/1.0
// connection: status line and headers, then the records until the end.
func (s *Server) serveRangeHTTP10(conn net.Conn, p rangeParams) {
	var h fasthttp.ResponseHeader
	h.SetServer("dhtkv")
	h.SetConnectionClose()
	_ = conn.SetWriteDeadline(time.Now().Add(s.scanIdleTimeout()))
	st, aerr := s.scans.register(conn, true, s.maxScans())
	if aerr != nil {
		writeResponse(conn, &h, aerr.code, aerr.reason)
		return
	}
	it, name, err := s.openRange(st, p)
	if err != nil {
		s.scans.unregister(st)
		code, reason := s.rangeErrorStatus([]byte(pathEntities), err)
		writeResponse(conn, &h, code, reason)
		return
	}
	body := s.newBody(st, it, p.format, p.limit, name)
	defer body.Close() // unregisters st
	h.SetContentType(contentType(p.format))
	h.SetContentLength(-2) // neither length nor chunks: the body ends with the connection
	if _, err := conn.Write(h.Header()); err != nil {
		return // the body, closed unread, records the client gone
	}
	_, _ = body.WriteTo(conn) // a failure is the body's to record and log
}

// writeResponse writes a whole short answer on a hijacked connection.
func writeResponse(conn net.Conn, h *fasthttp.ResponseHeader, code int, reason string) {
	var resp fasthttp.Response
	h.CopyTo(&resp.Header)
	resp.SetStatusCode(code)
	resp.Header.SetContentType("text/plain; charset=utf-8")
	resp.SetBodyString(reason + "\n")
	_, _ = resp.WriteTo(conn)
}

// scanRegistry tracks the streams in flight so that a stopping node can
// end them: a range may take any time, and graceful shutdown must not wait
// for it (nor close the store under its iterator).
type scanRegistry struct {
	mu       sync.Mutex
	closing  bool
	streams  map[*scanStream]struct{}
	detached sync.WaitGroup // streams on hijacked connections
}

// scanStream is one range request being served.
type scanStream struct {
	conn     net.Conn
	ctx      context.Context
	cancel   context.CancelFunc
	hijacked bool // served on a hijacked connection, outside fasthttp
}

// register adds a stream on conn, unless the node is closing. A stream on
// a hijacked connection is counted in detached until it unregisters:
// fasthttp's shutdown does not wait for it, so Close does.
func (r *scanRegistry) register(conn net.Conn, hijacked bool, max int) (*scanStream, *apiError) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing {
		return nil, &apiError{fasthttp.StatusServiceUnavailable, "node shutting down"}
	}
	if len(r.streams) >= max {
		return nil, &apiError{fasthttp.StatusTooManyRequests, fmt.Sprintf("too many range scans in flight (--max-scans %d): try again later", max)}
	}
	if hijacked {
		// Under mu with closing false: this Add happens before Close's
		// Wait.
		r.detached.Add(1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	st := &scanStream{conn: conn, ctx: ctx, cancel: cancel, hijacked: hijacked}
	if r.streams == nil {
		r.streams = map[*scanStream]struct{}{}
	}
	r.streams[st] = struct{}{}
	return st, nil
}

// open is the number of streams in flight.
func (r *scanRegistry) open() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.streams)
}

// unregister removes a stream; it is called once per registered stream.
func (r *scanRegistry) unregister(st *scanStream) {
	st.cancel()
	r.mu.Lock()
	delete(r.streams, st)
	r.mu.Unlock()
	if st.hijacked {
		r.detached.Done()
	}
}

// Close aborts every range stream in flight and refuses new ones (503).
// Each stream's context is cancelled (its reads of other nodes fail) and
// its connection closed (its writes fail), so the streams end at once with
// a truncated body, never a complete-looking one. The node calls it before
// shutting the HTTP server down, whose shutdown then waits for the aborted
// streams to close their iterators; Close itself waits for the streams on
// hijacked connections (HTTP/1.0), which fasthttp does not count.
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
	r.detached.Wait()
}

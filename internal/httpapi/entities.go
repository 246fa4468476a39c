package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/cluster"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/scan"
)

// Range scans (issue 5). The handlers here parse the query, open the
// record iterators (the local store, or for scope=cluster every node's
// internal stream merged) and hand them to a scan.Body, which fasthttp
// writes to the client after the handler returns. The contract, the
// framings and the failure semantics are in docs/range-scans.md.

// DefaultScanIdleTimeout is used when Server.ScanIdleTimeout is zero.
const DefaultScanIdleTimeout = 30 * time.Second

// rangeParams is the parsed query of /v0/entities.
type rangeParams struct {
	start, end []byte // end nil: to the last key; both alias the request
	format     scan.Format
	cluster    bool
	ack, from  int
}

// parseRange applies the contract: start is required and non-empty; end,
// when present, must be non-empty too (an empty end would be an empty
// range, more likely a client bug than an intent); format and scope are
// closed sets; ack/from follow the entity rules and only mean something
// with scope=cluster.
func parseRange(args *fasthttp.Args, clusterSize, maxKey int) (rangeParams, *apiError) {
	var p rangeParams
	var aerr *apiError
	if p.start, aerr = parseKey(args, "start", maxKey); aerr != nil {
		return p, aerr
	}
	if args.Has("end") {
		if p.end, aerr = parseKey(args, "end", maxKey); aerr != nil {
			return p, aerr
		}
	}
	switch f := string(args.Peek("format")); f {
	case "", "chunks":
		p.format = scan.FormatChunks
	case "binary":
		p.format = scan.FormatBinary
	default:
		return p, badRequest("format=%q: want chunks or binary", f)
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
	if p.ack, p.from, aerr = parseReplication(args, clusterSize); aerr != nil {
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
	p, aerr := parseRange(ctx.QueryArgs(), s.Coord.Topology().Size(), s.Limits.MaxKeyBytes)
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
		it, err = s.openCluster(st.ctx, p)
	} else {
		it, err = scan.NewStoreIterator(s.Local.Store, p.start, p.end)
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
	s.stream(ctx, st, it, p.format, name)
}

// internalEntities serves GET /v0/internal/entities: this node's records,
// tombstones included, for a coordinator's merge.
func (s *Server) internalEntities(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() {
		methodNotAllowed(ctx, "GET")
		return
	}
	if !s.checkSecret(ctx) {
		return
	}
	args := ctx.QueryArgs()
	start, aerr := parseKey(args, "start", s.Limits.MaxKeyBytes)
	if aerr != nil {
		fail(ctx, aerr)
		return
	}
	var end []byte
	if args.Has("end") {
		if end, aerr = parseKey(args, "end", s.Limits.MaxKeyBytes); aerr != nil {
			fail(ctx, aerr)
			return
		}
	}
	st, ok := s.scans.register(ctx.Conn())
	if !ok {
		ctx.Error("node shutting down\n", fasthttp.StatusServiceUnavailable)
		return
	}
	it, err := scan.NewStoreIterator(s.Local.Store, start, end)
	if err != nil {
		s.scans.unregister(st)
		s.replicaError(ctx, err)
		return
	}
	s.stream(ctx, st, it, scan.FormatInternal, "internal")
}

// stream hands it to fasthttp as a chunked body written after the handler
// returns.
func (s *Server) stream(ctx *fasthttp.RequestCtx, st *scanStream, it scan.Iterator, f scan.Format, name string) {
	idle := s.ScanIdleTimeout
	if idle <= 0 {
		idle = DefaultScanIdleTimeout
	}
	conn := st.conn
	body := scan.NewBody(it, f, scan.BodyOptions{
		FlushBytes: s.ScanFlushBytes,
		Ctx:        st.ctx,
		// fasthttp sets the write deadline once per response; a scan
		// may take longer than that, so every write pushes it forward:
		// it then bounds how long a client may stall.
		BeforeWrite: func() error { return conn.SetWriteDeadline(time.Now().Add(idle)) },
		OnClose:     func() { s.scans.unregister(st) },
		Metrics:     s.Metrics,
		Log:         s.Log,
		Name:        name + " " + conn.RemoteAddr().String(),
	})
	ctx.SetContentType("application/octet-stream")
	// Headers go out at once, before the first record: a coordinator
	// knows the stream is open even if the range starts with a long run of
	// skipped tombstones.
	ctx.Response.ImmediateHeaderFlush = true
	ctx.Response.SetBodyStream(body, -1)
}

// openCluster opens every node's stream and merges them. A node whose
// stream does not open within the replica timeout has not answered; the
// scan proceeds only if every key still has ack answering replicas among
// its from (see checkQuorum).
func (s *Server) openCluster(ctx context.Context, p rangeParams) (scan.Iterator, error) {
	topo := s.Coord.Topology()
	client := s.scans.client(s)
	start := bytes.Clone(p.start)
	var end []byte
	if p.end != nil {
		end = bytes.Clone(p.end)
	}
	srcs := make([]scan.Iterator, topo.Size())
	errs := make([]error, topo.Size())
	var wg sync.WaitGroup
	for i, u := range topo.Nodes {
		if i == topo.Self {
			continue
		}
		wg.Go(func() {
			it, err := client.Open(ctx, u, start, end)
			if err == nil {
				srcs[i] = it
			}
			errs[i] = err
		})
	}
	// The local stream is read from the store directly, no HTTP.
	srcs[topo.Self], errs[topo.Self] = scan.NewStoreIterator(s.Local.Store, start, end)
	wg.Wait()

	var open []scan.Iterator
	var failed []string
	for i, it := range srcs {
		if errs[i] != nil {
			failed = append(failed, errs[i].Error())
			continue
		}
		open = append(open, it)
	}
	if err := checkQuorum(len(failed), p.ack, p.from); err != nil {
		for _, it := range open {
			it.Close()
		}
		s.Log.Info("cluster scan refused", "failed", strings.Join(failed, "; "), "ack", p.ack, "from", p.from)
		return nil, fmt.Errorf("%w: %d of %d nodes did not open their stream (%s)",
			err, len(failed), topo.Size(), strings.Join(failed, "; "))
	}
	if len(failed) > 0 {
		s.Log.Debug("cluster scan without some nodes", "failed", strings.Join(failed, "; "))
	}
	if len(open) == 1 {
		return open[0], nil
	}
	return scan.NewMerge(open), nil
}

// checkQuorum decides whether a scan without `failed` nodes is complete for
// every key. A key lives on its first `from` nodes by placement, and
// rendezvous hashing gives some key every possible set of from nodes; so
// every key keeps at least ack answering replicas exactly when no more than
// from-ack nodes failed. The rule is exact over the key space and
// conservative for one range (whose keys may all avoid the failed nodes),
// which is the price of deciding before the first byte is sent.
func checkQuorum(failed, ack, from int) error {
	if failed > from-ack {
		return fmt.Errorf("cluster scan with ack=%d from=%d tolerates %d failed nodes: %w",
			ack, from, from-ack, cluster.ErrNotEnoughReplicas)
	}
	return nil
}

// scanRegistry tracks the streams in flight so that a stopping node can
// end them: a range may take any time, and graceful shutdown must not wait
// for it (nor close the store under its iterator).
type scanRegistry struct {
	mu      sync.Mutex
	closing bool
	streams map[*scanStream]struct{}
	cl      *scan.Client // created on first cluster scan
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

// client returns the client for other nodes' streams, created on first use.
func (r *scanRegistry) client(s *Server) *scan.Client {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cl == nil {
		idle := s.ScanIdleTimeout
		if idle <= 0 {
			idle = DefaultScanIdleTimeout
		}
		r.cl = scan.NewClient(scan.ClientOptions{
			OpenTimeout:  s.Coord.Timeout(),
			IdleTimeout:  idle,
			Secret:       s.Secret,
			SecretHeader: cluster.SecretHeader,
			MaxKey:       s.Limits.MaxKeyBytes,
			MaxEnvelope:  s.Limits.MaxValueBytes + record.HeaderSize,
		})
	}
	return r.cl
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
	cl := r.cl
	r.mu.Unlock()
	for _, st := range streams {
		st.cancel()
		st.conn.Close()
	}
	if cl != nil {
		cl.Close()
	}
}

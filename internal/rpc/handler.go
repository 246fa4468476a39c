package rpc

import (
	"bytes"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/tlsconf"
)

// The server side of the transport: what each internal endpoint accepts
// and answers, with which status and headers. The node's HTTP server
// (package httpapi) routes the paths here and reads the bodies, which
// share the public API's body budget and framing checks:
//
//  1. Accept answers a wrong method or a caller that is not another node,
//     before any body is read;
//  2. the HTTP server reads the body;
//  3. HandleBatch, HandleSummary, HandleMap or HandleReach answers (StreamPath's
//     stream is written by the HTTP server's stream writer, from
//     OpenStream's iterator, as public scans are).

// Accept answers, and returns false for, a request to an internal
// endpoint (path) not from another node, or with a method the endpoint
// does not serve. Another node is: under mutual TLS (RequirePeerCert), a
// connection with a verified client certificate; otherwise one with the
// cluster secret the node requires, or, without one, from a loopback
// address. Under mutual TLS a secret, if set, is required too. The caller
// is checked first: one that is not a node learns nothing of the
// endpoints, their methods included, but 403.
func (s *Server) Accept(ctx *fasthttp.RequestCtx, path string) bool {
	if !s.fromNode(ctx) {
		return false
	}
	switch path {
	case BatchPath, SummaryPath, LogPath:
		if !ctx.IsPost() {
			methodNotAllowed(ctx, "POST")
			return false
		}
	case StreamPath, ReachPath:
		if !ctx.IsGet() {
			methodNotAllowed(ctx, "GET")
			return false
		}
	case MapPath:
		if !ctx.IsGet() && !ctx.IsPost() {
			methodNotAllowed(ctx, "GET, POST")
			return false
		}
	}
	return true
}

// fromNode answers 403, and returns false, for a request that is not
// from another node (Accept).
func (s *Server) fromNode(ctx *fasthttp.RequestCtx) bool {
	switch {
	case s.RequirePeerCert:
		if !tlsconf.PeerVerified(ctx.TLSConnectionState()) {
			ctx.Error("forbidden: the internal endpoints require a client certificate from --peer-tls-ca\n", fasthttp.StatusForbidden)
			return false
		}
	case s.Secret == "" && !ctx.RemoteIP().IsLoopback():
		// Without a secret or mutual TLS nothing authenticates a peer:
		// only this machine's may call (node/security.go).
		ctx.Error("forbidden: without --cluster-secret-file or --peer-tls-ca the internal endpoints answer only loopback peers\n", fasthttp.StatusForbidden)
		return false
	}
	// One SecretHeader field, and the secret: with two, a proxy that
	// reads the last and this node the first would disagree on whether
	// the request was authenticated.
	got := ctx.Request.Header.PeekAll(SecretHeader)
	if len(got) <= 1 && s.Authorized(ctx.Request.Header.Peek(SecretHeader)) {
		return true
	}
	if len(got) > 1 {
		ctx.Error("forbidden: the cluster secret's header is repeated\n", fasthttp.StatusForbidden)
		return false
	}
	ctx.Error("forbidden: missing or wrong cluster secret\n", fasthttp.StatusForbidden)
	return false
}

func methodNotAllowed(ctx *fasthttp.RequestCtx, allow string) {
	ctx.Error("method not allowed\n", fasthttp.StatusMethodNotAllowed) // resets headers
	ctx.Response.Header.Set(fasthttp.HeaderAllow, allow)
}

// HandleBatch answers BatchPath's request, whose body is body (read by
// the HTTP server; nothing of it is kept). The answer is appended to the
// response's own buffer, which fasthttp keeps with the connection's
// response, so a batch costs no copy and no allocation once warm. An
// empty batch is a ping: its answer says whether this node knows the
// cluster is formed (FormedHeader).
func (s *Server) HandleBatch(ctx *fasthttp.RequestCtx, body []byte) {
	var num [20]byte
	epoch := ctx.Request.Header.Peek(EpochHeader)
	if !s.Admit(epoch) {
		s.refuseStale(ctx)
		return
	}
	if len(body) > 0 && s.late(ctx.Request.Header.Peek(DeadlineHeader)) {
		// Its sender gave up on it (DeadlineHeader): nothing is applied,
		// and the answer, should anyone still read it, is a timeout,
		// with this node's time, from which the sender reads this clock
		// anew (a sender still waiting resends the batch: late.go).
		s.Release(epoch)
		if s.Late != nil {
			s.Late.Inc()
		}
		ctx.Error("batch arrived after its sender's deadline\n", fasthttp.StatusGatewayTimeout)
		ctx.Response.Header.SetBytesV(TimeHeader, s.AppendTime(num[:0]))
		return
	}
	buf := ctx.Response.SwapBody(nil)[:0]
	out, err := s.ServeBatch(body, buf, len(ctx.Request.Header.Peek(BackgroundHeader)) > 0)
	s.Release(epoch)
	if err != nil {
		ctx.Response.SwapBody(buf)
		s.fail(ctx, err)
		return
	}
	ctx.Response.Header.SetBytesV(EpochHeader, s.AppendEpoch(num[:0]))
	ctx.Response.Header.SetBytesV(TimeHeader, s.AppendTime(num[:0]))
	if len(body) == 0 { // a ping
		formed, err := s.Formed()
		if err != nil {
			s.fail(ctx, err)
			return
		}
		if formed {
			ctx.Response.Header.Set(FormedHeader, "1")
		}
		if s.Rebuilding != nil && s.Rebuilding() {
			ctx.Response.Header.Set(RebuildingHeader, "1")
		}
		if at := s.formedAt(); !at.IsZero() {
			ctx.Response.Header.SetBytesV(FormedAtHeader, strconv.AppendInt(num[:0], at.UnixMilli(), 10))
		}
		if s.Incarnation != 0 {
			ctx.Response.Header.SetBytesV(IncarnationHeader, strconv.AppendUint(num[:0], s.Incarnation, 16))
		}
		if s.Settings != "" {
			ctx.Response.Header.Set(SettingsHeader, s.Settings)
		}
	}
	s.setAnswer(ctx, buf, out)
}

// HandleSummary answers SummaryPath's request: an anti-entropy comparison
// step against this node's store.
func (s *Server) HandleSummary(ctx *fasthttp.RequestCtx, body []byte) {
	epoch := ctx.Request.Header.Peek(EpochHeader)
	if !s.Admit(epoch) {
		s.refuseStale(ctx)
		return
	}
	buf := ctx.Response.SwapBody(nil)[:0]
	out, err := s.ServeSummary(body, buf)
	s.Release(epoch)
	if err != nil {
		ctx.Response.SwapBody(buf)
		s.fail(ctx, err)
		return
	}
	s.setAnswer(ctx, buf, out)
}

// HandleMap answers MapPath's request: GET (body nil) this node's map
// state, POST offers a map (the body).
func (s *Server) HandleMap(ctx *fasthttp.RequestCtx, body []byte) {
	if s.Maps == nil {
		ctx.Error("this node serves no cluster map\n", fasthttp.StatusBadRequest)
		return
	}
	if ctx.IsGet() {
		ctx.SetBody(s.Maps.State())
		return
	}
	out, err := s.Maps.Offer(body)
	if err != nil {
		s.fail(ctx, err)
		return
	}
	ctx.SetBody(out)
}

// refuseStale answers a request routed by an older cluster map than this
// node's: 409 with the map (epoch.go).
func (s *Server) refuseStale(ctx *fasthttp.RequestCtx) {
	var num [20]byte
	ctx.Response.Header.SetBytesV(EpochHeader, s.AppendEpoch(num[:0]))
	ctx.SetStatusCode(fasthttp.StatusConflict)
	ctx.SetBody(s.Maps.State())
}

// fail answers a refusal (an *Error) with its status and reason, and
// anything else as this replica's failure: 500, logged.
func (s *Server) fail(ctx *fasthttp.RequestCtx, err error) {
	if e, ok := IsRefusal(err); ok {
		ctx.Error(e.Msg+"\n", e.Status)
		return
	}
	s.Log.Error("request failed", "path", string(ctx.Path()), "err", err)
	ctx.Error("internal error\n", fasthttp.StatusInternalServerError)
}

// setAnswer makes out, appended to buf (the response's own buffer, taken
// with SwapBody), the response body. Handed to fasthttp as the body, a
// large answer would stay with the pooled response long after it was sent
// (one per pooled request context); it goes as a stream instead, and is
// garbage once written, and the response keeps its small buffer. It is
// held until its client has read it: with HoldAnswer set, charged to the
// node's budget of answers being sent, and refused with 503 beyond it.
func (s *Server) setAnswer(ctx *fasthttp.RequestCtx, buf, out []byte) {
	if cap(out) > retainAnswerBytes {
		ctx.Response.SwapBody(buf[:0])
		if s.HoldAnswer == nil {
			ctx.Response.SetBodyStream(bytes.NewReader(out), len(out))
			return
		}
		if !s.HoldAnswer(ctx, out) {
			ctx.Error(errAnswerBudget+"\n", fasthttp.StatusServiceUnavailable)
		}
		return
	}
	ctx.Response.SwapBody(out)
}

// errAnswerBudget is the reason of a batch or summary answer refused for
// HoldAnswer's budget.
const errAnswerBudget = "answers being sent exceed this node's budget (--max-inflight-response-bytes); retry later"

// retainAnswerBytes is the largest batch answer whose buffer fasthttp may
// keep with its pooled response for the next request.
const retainAnswerBytes = 256 << 10

package httpapi

import (
	"bytes"

	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/scan"
	"github.com/dhtkv/dhtkv/internal/tlsconf"
)

// The internal endpoints are package rpc's; this file only mounts them:
// method, authentication, and the transport of what rpc.Server returns.

// authorized answers 403 and returns false unless the request comes from
// another node: under mutual TLS, on a connection with a verified client
// certificate; otherwise with the cluster secret the node requires, or,
// without one, from a loopback address. Under mutual TLS a secret, if
// set, is required too.
func (s *Server) authorized(ctx *fasthttp.RequestCtx) bool {
	switch {
	case s.RequirePeerCert:
		if !tlsconf.PeerVerified(ctx.TLSConnectionState()) {
			ctx.Error("forbidden: the internal endpoints require a client certificate from --peer-tls-ca\n", fasthttp.StatusForbidden)
			return false
		}
	case s.RPC.Secret == "" && !ctx.RemoteIP().IsLoopback():
		// Without a secret or mutual TLS nothing authenticates a peer:
		// only this machine's may call (node/security.go).
		ctx.Error("forbidden: without --cluster-secret-file or --peer-tls-ca the internal endpoints answer only loopback peers\n", fasthttp.StatusForbidden)
		return false
	}
	if s.RPC.Authorized(ctx.Request.Header.Peek(rpc.SecretHeader)) {
		return true
	}
	ctx.Error("forbidden: missing or wrong cluster secret\n", fasthttp.StatusForbidden)
	return false
}

// internalBatch serves POST rpc.BatchPath. The answer is appended to the
// response's own buffer, which fasthttp keeps with the connection's
// response, so a batch costs no copy and no allocation once warm.
func (s *Server) internalBatch(ctx *fasthttp.RequestCtx) {
	if !ctx.IsPost() {
		methodNotAllowed(ctx, "POST")
		return
	}
	if !s.authorized(ctx) {
		return
	}
	body, aerr := s.readBody(ctx, s.bodyLimit(batchPath))
	if aerr != nil {
		fail(ctx, aerr)
		return
	}
	defer body.release()
	var num [20]byte
	epoch := ctx.Request.Header.Peek(rpc.EpochHeader)
	if !s.RPC.Admit(epoch) {
		s.refuseStale(ctx)
		return
	}
	buf := ctx.Response.SwapBody(nil)[:0]
	out, err := s.RPC.ServeBatch(body.bytes(), buf)
	s.RPC.Release(epoch)
	if err != nil {
		ctx.Response.SwapBody(buf)
		s.rpcError(ctx, err)
		return
	}
	ctx.Response.Header.SetBytesV(rpc.EpochHeader, s.RPC.AppendEpoch(num[:0]))
	ctx.Response.Header.SetBytesV(rpc.TimeHeader, s.RPC.AppendTime(num[:0]))
	if len(body.bytes()) == 0 { // a ping
		formed, err := s.RPC.Formed()
		if err != nil {
			s.replicaError(ctx, err)
			return
		}
		if formed {
			ctx.Response.Header.Set(rpc.FormedHeader, "1")
		}
	}
	setAnswer(ctx, buf, out)
}

// setAnswer makes out, appended to buf (the response's own buffer, taken
// with SwapBody), the response body. Handed to fasthttp as the body, a
// large answer would stay with the pooled response long after it was sent
// (one per pooled request context); it goes as a stream instead, and is
// garbage once written, and the response keeps its small buffer.
func setAnswer(ctx *fasthttp.RequestCtx, buf, out []byte) {
	if cap(out) > retainAnswerBytes {
		ctx.Response.SwapBody(buf[:0])
		ctx.Response.SetBodyStream(bytes.NewReader(out), len(out))
		return
	}
	ctx.Response.SwapBody(out)
}

// retainAnswerBytes is the largest batch answer whose buffer fasthttp may
// keep with its pooled response for the next request.
const retainAnswerBytes = 256 << 10

// internalSummary serves POST rpc.SummaryPath: an anti-entropy
// comparison step against this node's store.
func (s *Server) internalSummary(ctx *fasthttp.RequestCtx) {
	if !ctx.IsPost() {
		methodNotAllowed(ctx, "POST")
		return
	}
	if !s.authorized(ctx) {
		return
	}
	body, aerr := s.readBody(ctx, s.bodyLimit(summaryPath))
	if aerr != nil {
		fail(ctx, aerr)
		return
	}
	defer body.release()
	epoch := ctx.Request.Header.Peek(rpc.EpochHeader)
	if !s.RPC.Admit(epoch) {
		s.refuseStale(ctx)
		return
	}
	buf := ctx.Response.SwapBody(nil)[:0]
	out, err := s.RPC.ServeSummary(body.bytes(), buf)
	s.RPC.Release(epoch)
	if err != nil {
		ctx.Response.SwapBody(buf)
		s.rpcError(ctx, err)
		return
	}
	setAnswer(ctx, buf, out)
}

// internalStream serves GET rpc.StreamPath: this node's records,
// tombstones included, for another coordinator's merge.
func (s *Server) internalStream(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() {
		methodNotAllowed(ctx, "GET")
		return
	}
	if !s.authorized(ctx) {
		return
	}
	st, aerr := s.scans.register(ctx.Conn(), false, s.maxScans())
	if aerr != nil {
		fail(ctx, aerr)
		return
	}
	it, err := s.RPC.OpenStream(ctx.QueryArgs())
	if err != nil {
		s.scans.unregister(st)
		s.rpcError(ctx, err)
		return
	}
	s.stream(ctx, st, it, scan.FormatInternal, 0, "internal")
}

// refuseStale answers a request routed by an older cluster map than this
// node's: 409 with the map (rpc/epoch.go).
func (s *Server) refuseStale(ctx *fasthttp.RequestCtx) {
	var num [20]byte
	ctx.Response.Header.SetBytesV(rpc.EpochHeader, s.RPC.AppendEpoch(num[:0]))
	ctx.SetStatusCode(fasthttp.StatusConflict)
	ctx.SetBody(s.RPC.Maps.State())
}

// internalMap serves rpc.MapPath: GET answers this node's cluster map
// state, POST offers a map.
func (s *Server) internalMap(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() && !ctx.IsPost() {
		methodNotAllowed(ctx, "GET, POST")
		return
	}
	if !s.authorized(ctx) {
		return
	}
	if s.RPC.Maps == nil {
		fail(ctx, badRequest("this node serves no cluster map"))
		return
	}
	if ctx.IsGet() {
		ctx.SetBody(s.RPC.Maps.State())
		return
	}
	body, aerr := s.readBody(ctx, s.bodyLimit(mapPath))
	if aerr != nil {
		fail(ctx, aerr)
		return
	}
	defer body.release()
	out, err := s.RPC.Maps.Offer(body.bytes())
	if err != nil {
		s.rpcError(ctx, err)
		return
	}
	ctx.SetBody(out)
}

// rpcError answers a refusal with its status and reason, anything else
// as the replica's failure.
func (s *Server) rpcError(ctx *fasthttp.RequestCtx, err error) {
	if e, ok := rpc.IsRefusal(err); ok {
		ctx.Error(e.Msg+"\n", e.Status)
		return
	}
	s.replicaError(ctx, err)
}

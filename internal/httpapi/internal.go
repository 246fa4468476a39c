package httpapi

import (
	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/scan"
)

// The internal endpoints are package rpc's (rpc/handler.go): rpc accepts
// or refuses the request and answers it; this file only reads its body,
// within the node's body budget like any request's, and writes a record
// stream with the public scans' stream writer.

// internal serves an internal endpoint, path.
func (s *Server) internal(ctx *fasthttp.RequestCtx, path string) {
	if !s.RPC.Accept(ctx, path) {
		return
	}
	if path == rpc.StreamPath {
		s.internalStream(ctx)
		return
	}
	var body []byte
	if ctx.IsPost() {
		b, aerr := s.readBody(ctx, s.bodyLimit(ctx.Path()))
		if aerr != nil {
			fail(ctx, aerr)
			return
		}
		defer b.release()
		body = b.bytes()
	}
	switch path {
	case rpc.BatchPath:
		s.RPC.HandleBatch(ctx, body)
	case rpc.SummaryPath:
		s.RPC.HandleSummary(ctx, body)
	case rpc.MapPath:
		s.RPC.HandleMap(ctx, body)
	case rpc.ReachPath:
		s.RPC.HandleReach(ctx)
	}
}

// internalStream serves GET rpc.StreamPath: this node's records,
// tombstones included, for another coordinator's merge.
func (s *Server) internalStream(ctx *fasthttp.RequestCtx) {
	st, aerr := s.scans.register(ctx.Conn(), false, s.maxScans())
	if aerr != nil {
		fail(ctx, aerr)
		return
	}
	it, err := s.RPC.OpenStream(ctx.QueryArgs())
	if err != nil {
		s.scans.unregister(st)
		if e, ok := rpc.IsRefusal(err); ok {
			ctx.Error(e.Msg+"\n", e.Status)
		} else {
			s.replicaError(ctx, err)
		}
		return
	}
	s.stream(ctx, st, it, scan.FormatInternal, 0, "internal")
}

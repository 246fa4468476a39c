package httpapi

import "github.com/valyala/fasthttp"

// entities serves GET /v0/entities (range scans, issue 5).
func (s *Server) entities(ctx *fasthttp.RequestCtx) {
	ctx.Error("range scans are not implemented yet\n", fasthttp.StatusNotImplemented)
}

func (s *Server) internalEntities(ctx *fasthttp.RequestCtx) {
	ctx.Error("range scans are not implemented yet\n", fasthttp.StatusNotImplemented)
}

package httpapi

import (
	"crypto/subtle"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/cluster"
	"github.com/dhtkv/dhtkv/internal/metrics"
	"github.com/dhtkv/dhtkv/internal/record"
)

// checkSecret answers 403 and returns false when --cluster-secret is set and
// the request does not carry it.
func (s *Server) checkSecret(ctx *fasthttp.RequestCtx) bool {
	if s.Secret == "" {
		return true
	}
	got := ctx.Request.Header.Peek(cluster.SecretHeader)
	if subtle.ConstantTimeCompare(got, []byte(s.Secret)) != 1 {
		ctx.Error("forbidden: missing or wrong cluster secret\n", fasthttp.StatusForbidden)
		return false
	}
	return true
}

// internalEntity serves a replica read or write from another node's
// coordinator against the local replica only. Writes carry the version the
// coordinator assigned; last-write-wins in the store keeps the newest.
func (s *Server) internalEntity(ctx *fasthttp.RequestCtx) metrics.Op {
	op := metrics.OpInternalGet
	if ctx.IsPut() {
		op = metrics.OpInternalPut
	} else if !ctx.IsGet() {
		methodNotAllowed(ctx, "GET, PUT")
		return metrics.OpOther
	}
	if !s.checkSecret(ctx) {
		return op
	}
	key, aerr := parseKey(ctx.QueryArgs(), "id", s.Limits.MaxKeyBytes)
	if aerr != nil {
		fail(ctx, aerr)
		return op
	}
	if op == metrics.OpInternalGet {
		e, err := s.Local.Get(key)
		if err != nil {
			s.replicaError(ctx, err)
			return op
		}
		if !e.Found {
			ctx.SetStatusCode(fasthttp.StatusNotFound)
			return op
		}
		var hdr [record.HeaderSize]byte
		h := record.Record{Version: e.Rec.Version, Tombstone: e.Rec.Tombstone}
		ctx.Response.AppendBody(h.AppendEncode(hdr[:0]))
		ctx.Response.AppendBody(e.Rec.Value)
		return op
	}
	body := ctx.PostBody()
	if len(body) > s.Limits.MaxValueBytes+record.HeaderSize {
		fail(ctx, &apiError{fasthttp.StatusRequestEntityTooLarge, "value too large"})
		return op
	}
	rec, err := record.Decode(body)
	if err != nil || rec.Version == 0 {
		fail(ctx, badRequest("bad record envelope"))
		return op
	}
	if err := s.Clock.Observe(rec.Version); err != nil { // before storing it
		s.replicaError(ctx, err)
		return op
	}
	// A newer version already here means the coordinator's clock is
	// behind this key: refuse and tell it, so it can rewrite above it (see
	// cluster.Coordinator.Write). Equal is the same write repeated: apply.
	cur, found, err := s.Local.Store.Version(key)
	if err != nil {
		s.replicaError(ctx, err)
		return op
	}
	if found && cur > rec.Version {
		ctx.Error("a newer version is stored\n", fasthttp.StatusConflict) // resets headers
		ctx.Response.Header.Set(cluster.VersionHeader, strconv.FormatUint(cur, 10))
		return op
	}
	if err := s.Local.Apply(key, &rec); err != nil { // the store copies body
		s.replicaError(ctx, err)
		return op
	}
	ctx.SetStatusCode(fasthttp.StatusCreated)
	return op
}

package httpapi

import (
	"errors"
	"io"
	"net"

	"github.com/valyala/fasthttp"
)

// Request bodies, read as they arrive.
//
// fasthttp v1.74.0, reading a body itself, allocates the announced length
// (Content-Length, or each chunk's size) rounded up to a power of two
// before it reads a byte of it: a 72-byte request announcing 16 MiB held
// 32 MiB for as long as its client trickled. The node therefore runs
// fasthttp with StreamRequestBody, which reads at most 8 KiB ahead of the
// handler (readBodyWithStreaming), and the handlers that take a body read
// it here, into a buffer that grows with the bytes received: doubling
// from 16 KiB, never past the announced length, and for a chunked body
// never past the limit: each chunk's size is checked against it before
// any of its bytes is read (stream.go).
//
// Every buffer's capacity is charged to a budget shared by the requests in
// flight (Limits.MaxInflightBodyBytes) before it is allocated; a body that
// would exceed it is refused with 503. Memory held for bodies is then
// bounded by the budget however many connections trickle bytes, and
// per request by twice what it received.
//
// Invariant: Server.bodyBytes is the sum of the capacities of the buffers
// held by requestBody values not yet released.

const (
	initialBodyBuffer = 16 << 10
	// pooledBodyBuffer is the largest buffer kept for reuse; larger ones
	// go to the garbage collector with their request.
	pooledBodyBuffer = 64 << 10
)

// bodyBuf is a reusable body buffer (Server.bodyPool).
type bodyBuf struct{ b []byte }

// requestBody is a body read by readBody. Its bytes are valid until
// release, which returns its buffer and its charge.
type requestBody struct {
	b       []byte
	s       *Server  // nil: nothing to release
	pb      *bodyBuf // the buffer's holder, back to the pool on release
	charged int64
}

func (b requestBody) bytes() []byte { return b.b }

func (b requestBody) release() {
	if b.s == nil {
		return
	}
	b.s.bodyBytes.Add(-b.charged)
	b.pb.b = nil
	if cap(b.b) <= pooledBodyBuffer {
		b.pb.b = b.b[:0]
	}
	b.s.bodyPool.Put(b.pb)
}

// charge takes n bytes of the budget, or reports that they are not there.
func (s *Server) charge(b *requestBody, n int64) bool {
	used := s.bodyBytes.Add(n)
	if budget := s.Limits.MaxInflightBodyBytes; budget > 0 && used > budget {
		s.bodyBytes.Add(-n)
		return false
	}
	b.charged += n
	return true
}

var errBudget = &apiError{fasthttp.StatusServiceUnavailable,
	"request bodies in flight exceed this node's budget (--max-inflight-body-bytes); retry later"}

// readBody reads the request's body, at most limit bytes (413 beyond). A
// chunked body must end with its last chunk (chunkBoundary), one with a
// length with its last byte: a body cut short is never returned (400).
// The caller releases what it returns once done with its bytes. On an
// error the rest of the body is left unread: the connection closes after
// the answer, lingering (abandonBody).
func (s *Server) readBody(ctx *fasthttp.RequestCtx, limit int) (requestBody, *apiError) {
	rb, aerr := s.readStream(ctx, limit)
	if aerr != nil {
		// A client that timed out is not sending: no need to linger.
		abandonBody(ctx, aerr.code != fasthttp.StatusRequestTimeout)
	}
	return rb, aerr
}

func (s *Server) readStream(ctx *fasthttp.RequestCtx, limit int) (requestBody, *apiError) {
	stream := ctx.RequestBodyStream()
	if stream == nil {
		// Already in memory: a handler driven without a socket (tests,
		// benchmarks).
		b := ctx.PostBody()
		if len(b) > limit {
			return requestBody{}, tooLarge(limit)
		}
		return requestBody{b: b}, nil
	}
	n := ctx.Request.Header.ContentLength() // -1: chunked
	if n > limit {
		return requestBody{}, tooLarge(limit) // HeaderReceived refused it already
	}
	if n == 0 {
		_ = ctx.Request.CloseBodyStream()
		return requestBody{}, nil
	}
	most := n // the buffer never grows past it
	if n < 0 {
		most = limit
	}
	pb, _ := s.bodyPool.Get().(*bodyBuf)
	if pb == nil {
		pb = new(bodyBuf)
	}
	rb := requestBody{s: s, pb: pb, b: pb.b[:0]}
	if !s.charge(&rb, int64(cap(rb.b))) {
		rb.release()
		return requestBody{}, errBudget
	}
	for n < 0 || len(rb.b) < n {
		if n < 0 {
			ended, aerr := chunkBoundary(stream, len(rb.b), limit)
			if aerr != nil {
				rb.release()
				return requestBody{}, aerr
			}
			if ended {
				break
			}
		}
		if len(rb.b) == min(cap(rb.b), most) {
			grown := min(max(2*cap(rb.b), initialBodyBuffer), most)
			if !s.charge(&rb, int64(grown-cap(rb.b))) {
				rb.release()
				return requestBody{}, errBudget
			}
			rb.b = append(make([]byte, 0, grown), rb.b...)
		}
		m, err := stream.Read(rb.b[len(rb.b):min(cap(rb.b), most)])
		rb.b = rb.b[:len(rb.b)+m]
		// A chunked body's end is found by chunkBoundary alone: a chunk's
		// bytes end with ErrUnexpectedEOF if the connection does.
		if err != nil && (err != io.EOF || n < 0 || len(rb.b) < n) {
			rb.release()
			return requestBody{}, readError(err)
		}
	}
	// Read to its end: the connection may carry the next request.
	_ = ctx.Request.CloseBodyStream()
	return rb, nil
}

// abandonBody gives up on the rest of a body: the answer is the request's
// last on its connection, which then closes, lingering if asked so that a
// client still sending reads the answer rather than a reset. The request
// is marked to close, and Handler has the response say so once the
// handler answered (ctx.Error resets the response's header).
func abandonBody(ctx *fasthttp.RequestCtx, linger bool) {
	ctx.Request.Header.SetConnectionClose()
	if linger {
		lingerOnClose(ctx)
	}
	_ = ctx.Request.CloseBodyStream()
}

// readError is the answer to a body that could not be read whole.
func readError(err error) *apiError {
	var netErr net.Error
	switch {
	case errors.As(err, &netErr) && netErr.Timeout():
		return &apiError{fasthttp.StatusRequestTimeout, "request timeout: the body did not arrive within --read-timeout"}
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return errIncomplete
	}
	return badRequest("incomplete or malformed body")
}

package httpapi

import (
	"io"

	"github.com/valyala/fasthttp"
)

// Response values, held until their clients read them.
//
// A GET's value of RawValueMinBytes or more is answered by reference
// (setValue), and its connection holds it until it has written it all to
// the socket: up to --write-timeout for a client that stops reading once
// the socket's buffer (a few MiB on loopback) is full. A cache
// hit's value is the cache's and costs nothing more while the cache
// holds it, but a miss's is read from the store for that request, and an
// evicted value lives on in every response still sending it: without a
// bound, clients that ask for large values and never read the answers
// made a node hold --max-connections × --max-value-bytes (16 GiB at the
// defaults, from connections of a single address).
//
// So a referenced value is charged, by its length, to a budget shared by
// the responses in flight (Limits.MaxInflightResponseBytes) before it is
// answered; a value that would exceed it is refused with 503, as a
// request body beyond its budget is (body.go). Smaller values are copied
// into their connection's response buffer and not charged:
// --max-connections bounds them, at RawValueMinBytes each.
//
// The value goes out as a body stream, a heldValue, which fasthttp
// closes once it is done with the response: after writing its body or
// failing to (Response.writeBodyStream), or when the response is reset
// unwritten (ResetBody), in fasthttp v1.74.0. Close returns the charge.
// It writes the value in one Write (WriteTo), so nothing is copied on
// the way to the socket but what a written header leaves room for in the
// connection's write buffer.
//
// Invariant: Server.heldBytes is the sum of the lengths of the values of
// the heldValues not yet closed.

// heldValue is a value answered by reference, charged until closed.
type heldValue struct {
	b       []byte  // what is left to write
	s       *Server // nil once closed
	charged int64
}

// holdValue makes value the response body by reference, charged to the
// budget, or refuses it with 503.
func (s *Server) holdValue(ctx *fasthttp.RequestCtx, value []byte) *apiError {
	if !s.hold(ctx, value) {
		return errResponseBudget
	}
	return nil
}

// HoldAnswer is rpc.Server.HoldAnswer: an internal batch's or summary's
// answer, charged to the same budget as the values of GETs, so that
// stalled clients of the internal endpoints hold no more than it either.
func (s *Server) HoldAnswer(ctx *fasthttp.RequestCtx, answer []byte) bool {
	return s.hold(ctx, answer)
}

// hold makes b the response body by reference, charged to the budget
// until fasthttp closes it, and reports whether the budget took it. A b
// larger than the whole budget (a batch answer: a largest value and more)
// is taken when nothing else is held, so that it can be sent at all.
func (s *Server) hold(ctx *fasthttp.RequestCtx, b []byte) bool {
	n := int64(len(b))
	if budget := s.Limits.MaxInflightResponseBytes; budget > 0 {
		// Taken only if it fits: an add and a roll-back would show a
		// charge that is not held, and refuse a value that fits.
		for {
			used := s.heldBytes.Load()
			if used+n > budget && used > 0 {
				return false
			}
			if s.heldBytes.CompareAndSwap(used, used+n) {
				break
			}
		}
	} else {
		s.heldBytes.Add(n)
	}
	ctx.Response.SetBodyStream(&heldValue{b: b, s: s, charged: n}, len(b))
	return true
}

var errResponseBudget = &apiError{fasthttp.StatusServiceUnavailable,
	"values being sent exceed this node's budget (--max-inflight-response-bytes); retry later"}

func (h *heldValue) Read(p []byte) (int, error) {
	if len(h.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, h.b)
	h.b = h.b[n:]
	return n, nil
}

// WriteTo writes what is left of the value in one Write: a bufio.Writer
// passes a write larger than its buffer straight to the connection.
func (h *heldValue) WriteTo(w io.Writer) (int64, error) {
	n, err := w.Write(h.b)
	h.b = h.b[n:]
	return int64(n), err
}

// Close returns the charge; it may be called more than once.
func (h *heldValue) Close() error {
	if h.s != nil {
		h.s.heldBytes.Add(-h.charged)
		h.s = nil
	}
	h.b = nil
	return nil
}

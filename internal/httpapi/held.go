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
	n := int64(len(value))
	if budget := s.Limits.MaxInflightResponseBytes; budget > 0 {
		// Taken only if it fits: an add and a roll-back would show a
		// charge that is not held, and refuse a value that fits.
		for {
			used := s.heldBytes.Load()
			if used+n > budget {
				return errResponseBudget
			}
			if s.heldBytes.CompareAndSwap(used, used+n) {
				break
			}
		}
	} else {
		s.heldBytes.Add(n)
	}
	ctx.Response.SetBodyStream(&heldValue{b: value, s: s, charged: n}, len(value))
	return nil
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

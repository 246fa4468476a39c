package client

import (
	"errors"
	"fmt"
	"net/http"
)

var (
	// ErrNotFound is Get's answer for a key that is absent or deleted
	// (404).
	ErrNotFound = errors.New("dhtkv: not found")
	// ErrNotEnoughReplicas is returned when fewer than ack of the key's
	// replicas answered in time (504); for a Scan, when too many nodes did
	// not answer for the range to be complete. It does not fail over (see
	// the package's Failover).
	ErrNotEnoughReplicas = errors.New("dhtkv: not enough replicas")
	// ErrUnavailable is returned, wrapped with every endpoint's failure,
	// when no endpoint served a call.
	ErrUnavailable = errors.New("dhtkv: no endpoint served the request")
	// ErrInsufficientStorage is returned, with ErrUnavailable, when every
	// endpoint refused a write with 507 Insufficient Storage: their data
	// volumes are below --min-free-space, or their stores failed a write.
	// Nothing was stored.
	ErrInsufficientStorage = errors.New("dhtkv: insufficient storage")
	// ErrAnswerTooLarge is returned when an endpoint's answer is longer
	// than Config.MaxRecordBytes (a value stored through a node whose
	// --max-value-bytes is above it, or an endpoint that is not a dhtkv
	// node). It does not fail over: the client read none of it.
	ErrAnswerTooLarge = errors.New("dhtkv: answer larger than Config.MaxRecordBytes")
)

// BadRequestError is a node's refusal of the request itself: a 4xx other
// than Get's 404 (400 bad key, ack or from; 413 value too large; 401
// without a token the node knows, 403 with one whose role does not allow
// the call, see Config.Token).
type BadRequestError struct {
	// StatusCode is the HTTP status, 400 to 499.
	StatusCode int
	// Reason is the node's one-line explanation.
	Reason string
}

// authRefusal is a's refusal for want of a token (401) or of a role (403),
// as a *BadRequestError, or nil for any other answer.
func authRefusal(a answer) error {
	if a.code == http.StatusUnauthorized || a.code == http.StatusForbidden {
		return &BadRequestError{StatusCode: a.code, Reason: reason(a.body)}
	}
	return nil
}

// Error names a 400 a bad request and any other 4xx a refusal: a 401, 403,
// 413 or 429 says why in its reason, and "bad request" would mislead.
func (e *BadRequestError) Error() string {
	what := "refused"
	if e.StatusCode == http.StatusBadRequest {
		what = "bad request"
	}
	return fmt.Sprintf("dhtkv: %s (%d): %s", what, e.StatusCode, e.Reason)
}

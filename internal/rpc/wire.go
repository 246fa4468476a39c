package rpc

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/dhtkv/dhtkv/internal/store"
)

// BatchPath is where nodes send each other replica reads and writes, many
// in one request. It is separate from the public /v0/entity so that only
// node-to-node traffic can carry a version: the public API always gets a
// fresh version from the coordinator's clock, so clients cannot forge one.
//
// Why batches: one HTTP exchange per replica call costs more CPU than the
// replica's work itself, and a synced write costs an fsync each (figures
// in docs/benchmarks.md). A peer's sender goroutines (peer.go) put every call
// that queued up while their previous request was in flight into the next
// request, so under load one exchange and one Pebble commit (one fsync)
// serve many client requests, and under light load a call goes out alone,
// at once.
//
// The request body (POST) is a sequence of operations:
//
//	kind byte ('g' read | 'w' write)
//	uvarint key length, key
//	write only: uvarint envelope length, envelope (package record)
//
// A 200 answer carries one result per operation, in order:
//
//	'f' uvarint length, envelope   read: the replica's newest record
//	'n'                            read: never written here
//	'a'                            write: applied (last-write-wins)
//	'v' 8-byte big-endian version  write: refused, the replica already
//	                               holds this newer version of the key
//	'e' uvarint length, message    this operation failed at the replica
//	'r' uvarint length, message    write: refused, and always will be as
//	                               sent (its version is more than
//	                               --max-clock-skew ahead of the
//	                               replica's clock): not worth a retry
//	'l'                            read: not done, the answer reached
//	                               its byte limit (Server.MaxAnswerBytes;
//	                               the first read is always done): ask
//	                               again in another batch
//	's' uvarint length, message    write: not stored, the replica takes
//	                               no writes now (its data volume is below
//	                               --min-free-space, or its store failed a
//	                               write: store.ErrInsufficientStorage); it
//	                               counts as no answer, and the write is
//	                               worth a hint: the replica takes writes
//	                               again once it has space
//
// A malformed batch (bad framing, an empty key, a bad envelope, a
// version 0) is refused as a whole with 400
// and nothing of it is stored; a missing or wrong --cluster-secret gets
// 403.
const BatchPath = "/v0/internal/batch"

// BackgroundHeader, on a batch, says its reads are background work's
// (anti-entropy's pulls): the replica serves them without keeping what it
// read in its read cache. A node that does not know it serves them as any
// reads.
const BackgroundHeader = "X-Dhtkv-Background"

// Operation kinds and result codes of a batch (see BatchPath).
const (
	OpRead  = 'g'
	OpWrite = 'w'

	ResFound     = 'f'
	ResNotFound  = 'n'
	ResApplied   = 'a'
	ResNewer     = 'v'
	ResError     = 'e'
	ResRefused   = 'r'
	ResOverLimit = 'l'
	ResNoSpace   = 's'
)

// MaxBatchOps bounds the operations in one batch; a replica refuses more.
const MaxBatchOps = 1024

// BatchOp is one operation of a batch. Key and Envelope alias the buffer it
// was parsed from.
type BatchOp struct {
	Kind     byte
	Key      []byte
	Envelope []byte // writes only
}

// AppendBatchOp appends one operation's encoding to dst.
func AppendBatchOp(dst []byte, kind byte, key, envelope []byte) []byte {
	dst = append(dst, kind)
	dst = binary.AppendUvarint(dst, uint64(len(key)))
	dst = append(dst, key...)
	if kind == OpWrite {
		dst = binary.AppendUvarint(dst, uint64(len(envelope)))
		dst = append(dst, envelope...)
	}
	return dst
}

// batchOpSize is the encoded size of one operation.
func batchOpSize(key, envelope []byte) int {
	return 1 + 2*binary.MaxVarintLen32 + len(key) + len(envelope)
}

var errMalformed = errors.New("malformed batch")

// ParseBatch appends body's operations to ops. Keys are not validated here
// beyond their framing.
func ParseBatch(body []byte, ops []BatchOp) ([]BatchOp, error) {
	for len(body) > 0 {
		if len(ops) == MaxBatchOps {
			return ops, fmt.Errorf("%w: more than %d operations", errMalformed, MaxBatchOps)
		}
		op := BatchOp{Kind: body[0]}
		if op.Kind != OpRead && op.Kind != OpWrite {
			return ops, fmt.Errorf("%w: operation %d has kind %q", errMalformed, len(ops), op.Kind)
		}
		var ok bool
		if op.Key, body, ok = cutChunk(body[1:]); !ok {
			return ops, fmt.Errorf("%w: operation %d: bad key framing", errMalformed, len(ops))
		}
		if op.Kind == OpWrite {
			if op.Envelope, body, ok = cutChunk(body); !ok {
				return ops, fmt.Errorf("%w: operation %d: bad envelope framing", errMalformed, len(ops))
			}
		}
		ops = append(ops, op)
	}
	return ops, nil
}

// cutChunk splits a uvarint-length-prefixed chunk off buf.
func cutChunk(buf []byte) (chunk, rest []byte, ok bool) {
	n, w := binary.Uvarint(buf)
	if w <= 0 || n > uint64(len(buf)-w) {
		return nil, nil, false
	}
	end := w + int(n)
	return buf[w:end:end], buf[end:], true
}

// AppendResultFound, AppendResultNewer and AppendResultError append one
// result to a batch answer; the other results are the bare code byte.
func AppendResultFound(dst, envelopeHeader, value []byte) []byte {
	dst = append(dst, ResFound)
	dst = binary.AppendUvarint(dst, uint64(len(envelopeHeader)+len(value)))
	return append(append(dst, envelopeHeader...), value...)
}

func AppendResultNewer(dst []byte, version uint64) []byte {
	return binary.BigEndian.AppendUint64(append(dst, ResNewer), version)
}

func AppendResultError(dst []byte, msg string) []byte {
	return appendMessage(dst, ResError, msg)
}

// AppendResultRefused appends a write's refusal.
func AppendResultRefused(dst []byte, msg string) []byte {
	return appendMessage(dst, ResRefused, msg)
}

// AppendResultNoSpace appends a write the replica does not take now.
func AppendResultNoSpace(dst []byte, msg string) []byte {
	return appendMessage(dst, ResNoSpace, msg)
}

// storageError is a replica's ResNoSpace, as its caller gets it: it is
// store.ErrInsufficientStorage, and says the replica's reason.
type storageError struct{ reason string }

func (e storageError) Error() string        { return e.reason }
func (e storageError) Is(target error) bool { return target == store.ErrInsufficientStorage }

func appendMessage(dst []byte, code byte, msg string) []byte {
	dst = append(dst, code)
	dst = binary.AppendUvarint(dst, uint64(len(msg)))
	return append(dst, msg...)
}

// batchResult is one parsed result. Envelope aliases the answer's buffer.
type batchResult struct {
	code     byte
	envelope []byte // ResFound
	version  uint64 // ResNewer
	msg      string // ResError
}

// nextResult parses the first result off buf.
func nextResult(buf []byte) (r batchResult, rest []byte, err error) {
	if len(buf) == 0 {
		return r, nil, fmt.Errorf("%w: answer ends early", errMalformed)
	}
	r.code, rest = buf[0], buf[1:]
	var ok bool
	switch r.code {
	case ResNotFound, ResApplied, ResOverLimit:
		return r, rest, nil
	case ResNewer:
		if len(rest) < 8 {
			return r, nil, fmt.Errorf("%w: short version", errMalformed)
		}
		r.version = binary.BigEndian.Uint64(rest)
		return r, rest[8:], nil
	case ResFound:
		r.envelope, rest, ok = cutChunk(rest)
	case ResError, ResRefused, ResNoSpace:
		var msg []byte
		msg, rest, ok = cutChunk(rest)
		r.msg = string(msg)
	default:
		return r, nil, fmt.Errorf("%w: result code %q", errMalformed, r.code)
	}
	if !ok {
		return r, nil, fmt.Errorf("%w: bad framing of result %q", errMalformed, r.code)
	}
	return r, rest, nil
}

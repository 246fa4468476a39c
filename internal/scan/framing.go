// Package scan implements dhtkv's record streams: the wire framings of a
// stream (framing.go: the chunks framing, and the binary one, which is
// package framing's), the iterator over another node's stream, the k-way
// merge that turns the nodes' streams into one newest-version-per-key
// stream, and the response body that writes a stream to the client in
// constant memory. The local store's iterator is store.Iter; who opens
// which streams is the coordinator's (cluster.Coordinator.Scan).
//
// See docs/range-scans.md for the contract and the reasoning.
package scan

import (
	"io"

	"github.com/dhtkv/dhtkv/internal/scan/framing"
)

// The binary framing (format=binary, and every internal stream) is package
// framing's, which depends on the standard library only so that the public
// client can read streams. The node's code names it through this package,
// beside the iterators and the body that use it, and imports one package
// for streams, not two.

// AppendRecord appends one record frame to dst (framing.AppendRecord).
func AppendRecord(dst, key, value []byte) []byte { return framing.AppendRecord(dst, key, value) }

// AppendEnd appends the end marker for a stream of n records
// (framing.AppendEnd).
func AppendEnd(dst []byte, n uint64) []byte { return framing.AppendEnd(dst, n) }

// ErrTruncated reports a binary stream that ended without its end marker or
// with a wrong record count (framing.ErrTruncated).
var ErrTruncated = framing.ErrTruncated

// Decoder reads a binary-framed stream (framing.Decoder).
type Decoder = framing.Decoder

// NewDecoder reads frames from r, refusing keys longer than maxKey and
// values longer than maxValue bytes (framing.NewDecoder).
func NewDecoder(r io.Reader, maxKey, maxValue int) *Decoder {
	return framing.NewDecoder(r, maxKey, maxValue)
}

// AppendKeyNewlineValue appends one record of FormatChunks: key '\n' value.
// It is only unambiguous as long as every record travels in its own HTTP
// chunk and the key has no '\n'.
func AppendKeyNewlineValue(dst, key, value []byte) []byte {
	dst = append(dst, key...)
	dst = append(dst, '\n')
	return append(dst, value...)
}

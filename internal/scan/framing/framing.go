// Package framing is the binary framing of dhtkv's record streams (the
// writer's Append functions and the reader, Decoder) and the JSON lines
// framing (json.go). It depends on nothing but the standard library, so
// that the public client (package client) reads streams, and dhtkvctl
// prints them, without importing what a node needs; package scan, which
// serves and merges streams, uses it.
//
// See docs/range-scans.md for the contract.
package framing

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
)

// Binary framing (format=binary on the public endpoint, always on the
// internal one). It does not depend on HTTP chunk boundaries, so a proxy may
// re-chunk it and values may contain any byte:
//
//	record: uvarint(len key) key uvarint(len value) value   (len key >= 1)
//	end:    0x00 uvarint(number of records)
//
// Keys are never empty (the API rejects empty ids), so a zero key length is
// free to mark the end. A stream without the end marker, or whose count does
// not match, is truncated: that is how a reader tells a complete result from
// a failed one even if the HTTP layer hid the failure.

// AppendRecord appends one record frame to dst.
func AppendRecord(dst, key, value []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(key)))
	dst = append(dst, key...)
	dst = binary.AppendUvarint(dst, uint64(len(value)))
	return append(dst, value...)
}

// AppendEnd appends the end marker for a stream of n records.
func AppendEnd(dst []byte, n uint64) []byte {
	return binary.AppendUvarint(append(dst, 0), n)
}

// ErrTruncated reports a binary stream that ended without its end marker or
// with a wrong record count: the sender failed mid-stream.
var ErrTruncated = errors.New("scan stream truncated")

// ErrTooLarge reports a record whose key or value length exceeds the
// decoder's limit.
var ErrTooLarge = errors.New("record larger than the limit")

// Decoder reads a binary-framed stream. Key and Value of the current record
// alias the decoder's buffers and are valid until the next call to Next.
type Decoder struct {
	r        *bufio.Reader
	maxKey   int
	maxValue int
	key, val []byte
	n        uint64
	err      error
	done     bool
}

// NewDecoder reads frames from r, refusing keys longer than maxKey and
// values longer than maxValue bytes. Memory follows the bytes received,
// whatever a frame's length says (readN).
func NewDecoder(r io.Reader, maxKey, maxValue int) *Decoder {
	br, ok := r.(*bufio.Reader)
	if !ok {
		br = bufio.NewReaderSize(r, 64<<10)
	}
	return &Decoder{r: br, maxKey: maxKey, maxValue: maxValue}
}

// Next reads the next record. It returns false at the end marker (Err is
// nil) or on an error (Err says which; ErrTruncated, possibly wrapped, if
// the stream ended early).
func (d *Decoder) Next() bool {
	if d.done || d.err != nil {
		return false
	}
	klen, err := d.readLen("key", d.maxKey)
	if err != nil {
		d.err = err
		return false
	}
	if klen == 0 {
		d.err = d.readEnd()
		d.done = true
		return false
	}
	if d.key, err = d.readN(d.key, klen); err != nil {
		d.err = fmt.Errorf("record %d key: %w", d.n, err)
		return false
	}
	vlen, err := d.readLen("value", d.maxValue)
	if err != nil {
		d.err = err
		return false
	}
	if d.val, err = d.readN(d.val, vlen); err != nil {
		d.err = fmt.Errorf("record %d value: %w", d.n, err)
		return false
	}
	d.n++
	return true
}

func (d *Decoder) readLen(what string, limit int) (int, error) {
	x, err := binary.ReadUvarint(d.r)
	if err != nil {
		return 0, fmt.Errorf("record %d %s length: %w", d.n, what, eofIsTruncation(err))
	}
	if x > uint64(limit) {
		return 0, fmt.Errorf("%w: record %d: %s length %d exceeds limit %d", ErrTooLarge, d.n, what, x, limit)
	}
	return int(x), nil
}

// readN reads n bytes into buf's memory. A length beyond buf's capacity
// and readStep grows buf with the bytes received, doubling from readStep:
// a corrupt or hostile length holds no more memory than readStep and the
// bytes that follow it. Up to readStep, buf is allocated at once, as an
// ordinary value's is.
func (d *Decoder) readN(buf []byte, n int) ([]byte, error) {
	if cap(buf) < n && n <= readStep {
		buf = make([]byte, n)
	}
	if cap(buf) >= n {
		buf = buf[:n]
		if _, err := io.ReadFull(d.r, buf); err != nil {
			return buf, eofIsTruncation(err)
		}
		return buf, nil
	}
	buf = buf[:0]
	for len(buf) < n {
		step := min(n-len(buf), max(len(buf), readStep))
		buf = slices.Grow(buf, step)
		m, err := io.ReadFull(d.r, buf[len(buf):len(buf)+step])
		buf = buf[:len(buf)+m]
		if err != nil {
			return buf, eofIsTruncation(err)
		}
	}
	return buf, nil
}

// readStep is the longest key or value the decoder allocates for at once,
// and the first step of a longer one's: 1 MiB (BenchmarkDecoder: a stream
// of 1 MiB values read in steps from 64 KiB cost 10-20% more time and
// twice the bytes allocated).
const readStep = 1 << 20

// readEnd checks the record count and that nothing follows the marker.
func (d *Decoder) readEnd() error {
	want, err := binary.ReadUvarint(d.r)
	if err != nil {
		return fmt.Errorf("end marker: %w", eofIsTruncation(err))
	}
	if want != d.n {
		return fmt.Errorf("%w: end marker counts %d records, received %d", ErrTruncated, want, d.n)
	}
	if _, err := d.r.ReadByte(); err != io.EOF {
		if err == nil {
			return fmt.Errorf("scan stream: data after the end marker")
		}
		return fmt.Errorf("after end marker: %w", err)
	}
	return nil
}

// eofIsTruncation turns a clean EOF inside the stream into ErrTruncated and
// keeps other errors (io.ErrUnexpectedEOF from a broken chunked body, a
// timeout) visible next to it.
func eofIsTruncation(err error) error {
	if err == io.EOF {
		return ErrTruncated
	}
	return fmt.Errorf("%w: %w", ErrTruncated, err)
}

// Key is the current record's key.
func (d *Decoder) Key() []byte { return d.key }

// Value is the current record's value.
func (d *Decoder) Value() []byte { return d.val }

// Count is the number of records read so far.
func (d *Decoder) Count() uint64 { return d.n }

// Err is the error that stopped Next, nil after a complete stream.
func (d *Decoder) Err() error { return d.err }

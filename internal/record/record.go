// Package record defines the envelope in which dhtkv stores every value: a
// 64-bit version, a tombstone flag, an optional expiry and the value
// bytes. The same encoding is used on disk (Pebble values) and on the wire
// between nodes, so a replica can store what it receives without
// re-encoding.
//
// Layout (format 1), all integers big-endian:
//
//	offset 0  1 byte   format (currently 1)
//	offset 1  1 byte   flags  (bit 0: tombstone; bit 1: expires; other
//	                   bits must be zero)
//	offset 2  8 bytes  version
//	expires only:
//	offset 10 8 bytes  expiry, Unix milliseconds, 1 to 2^63-1
//	then               value (empty for a tombstone)
//
// The format byte lets a later release read old records; an unknown format or
// flag is an error, never guessed at, so a reader that does not know the
// expires flag refuses such a record as corrupt rather than misread it. On
// disk, the store's layout (3, docs/storage.md) says expiring records may
// be there, so a binary that cannot read them refuses the directory at
// open rather than record by record.
package record

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"
)

// Format is the envelope format written by this release.
const Format = 1

// HeaderSize is the number of bytes before the value of a record that does
// not expire; MaxHeaderSize of one that does.
const (
	HeaderSize    = 10
	MaxHeaderSize = HeaderSize + 8
)

const (
	flagTombstone = 1
	flagExpires   = 2
)

// MaxExpiresAt is the largest expiry an envelope may carry: the largest
// Unix millisecond time an int64 holds. Decode refuses one beyond it as
// corrupt: no write makes one (MaxTTL), and read back as an int64, as
// time.UnixMilli does, it would be a time before 1970.
const MaxExpiresAt = math.MaxInt64

// MaxTTL is the longest ttl a write may have: ten years, so that a value
// expires at most MaxTTL after its version's time. The client API refuses
// a longer ttl (httpapi.MaxTTL), and a replica refuses a record whose
// expiry is further from its version's time (rpc.Server.ServeBatch): no
// write of any release so far made one. Raising it takes a release whose
// replicas accept the new bound before any coordinator uses it.
const MaxTTL = 10 * 365 * 24 * time.Hour

// ErrCorrupt reports an envelope that cannot be decoded.
var ErrCorrupt = errors.New("corrupt record")

// Record is one version of a key's state. A tombstone records a delete: it
// carries a version like any write so that an older PUT arriving late at a
// replica cannot resurrect the key.
//
// A value may expire: from ExpiresAt on it reads as absent everywhere, like
// a tombstone. The expiry is part of the replicated record (set by the
// coordinator from the version's time and the request's ttl), never a
// node-local event, so every replica agrees on it and anti-entropy sees
// no difference.
type Record struct {
	Version   uint64
	Tombstone bool
	// ExpiresAt is when the value expires, in Unix milliseconds (0: never).
	// Always 0 for a tombstone, and at most MaxExpiresAt: a time.Time
	// holds it (time.UnixMilli takes an int64). A coordinator sets it to
	// its version's time plus the write's ttl, at most MaxTTL.
	ExpiresAt uint64
	Value     []byte
}

// LiveAt reports whether r is a value that reads as present at t: not a
// tombstone, and not expired.
func (r *Record) LiveAt(t time.Time) bool {
	return !r.Tombstone && (r.ExpiresAt == 0 || uint64(t.UnixMilli()) < r.ExpiresAt)
}

// headerSize is the length of r's header.
func (r *Record) headerSize() int {
	if r.ExpiresAt != 0 {
		return MaxHeaderSize
	}
	return HeaderSize
}

// Newer reports whether r should replace other under last-write-wins. Versions
// are unique per write (they embed the coordinator's node id), so equal
// versions are the same write and neither replaces the other.
func (r *Record) Newer(other *Record) bool { return r.Version > other.Version }

// EncodedSize is the length of r's envelope.
func (r *Record) EncodedSize() int { return r.headerSize() + len(r.Value) }

// AppendEncode appends r's envelope to dst and returns the extended slice.
func (r *Record) AppendEncode(dst []byte) []byte {
	var flags byte
	if r.Tombstone {
		flags |= flagTombstone
	}
	if r.ExpiresAt != 0 {
		flags |= flagExpires
	}
	dst = append(dst, Format, flags)
	dst = binary.BigEndian.AppendUint64(dst, r.Version)
	if r.ExpiresAt != 0 {
		dst = binary.BigEndian.AppendUint64(dst, r.ExpiresAt)
	}
	return append(dst, r.Value...)
}

// Encode returns r's envelope in a new slice.
func (r *Record) Encode() []byte {
	return r.AppendEncode(make([]byte, 0, r.EncodedSize()))
}

// Decode parses an envelope. The returned Value aliases buf: callers that keep
// the record beyond buf's lifetime (Pebble and fasthttp reuse their buffers)
// must copy the value.
func Decode(buf []byte) (Record, error) {
	if len(buf) < HeaderSize {
		return Record{}, fmt.Errorf("%w: %d bytes, header needs %d", ErrCorrupt, len(buf), HeaderSize)
	}
	if buf[0] != Format {
		return Record{}, fmt.Errorf("%w: unknown format %d", ErrCorrupt, buf[0])
	}
	flags := buf[1]
	if flags&^(flagTombstone|flagExpires) != 0 {
		return Record{}, fmt.Errorf("%w: unknown flags %#x", ErrCorrupt, flags)
	}
	r := Record{
		Version:   binary.BigEndian.Uint64(buf[2:HeaderSize]),
		Tombstone: flags&flagTombstone != 0,
		Value:     buf[HeaderSize:],
	}
	if flags&flagExpires != 0 {
		if len(buf) < MaxHeaderSize {
			return Record{}, fmt.Errorf("%w: %d bytes, an expiring record's header needs %d", ErrCorrupt, len(buf), MaxHeaderSize)
		}
		r.ExpiresAt = binary.BigEndian.Uint64(buf[HeaderSize:MaxHeaderSize])
		r.Value = buf[MaxHeaderSize:]
		if r.ExpiresAt == 0 || r.Tombstone {
			return Record{}, fmt.Errorf("%w: expiry %d on a tombstone=%v record", ErrCorrupt, r.ExpiresAt, r.Tombstone)
		}
		if r.ExpiresAt > MaxExpiresAt {
			return Record{}, fmt.Errorf("%w: expiry %d beyond the largest Unix millisecond time, %d", ErrCorrupt, r.ExpiresAt, uint64(MaxExpiresAt))
		}
	}
	if r.Tombstone && len(r.Value) > 0 {
		return Record{}, fmt.Errorf("%w: tombstone with %d value bytes", ErrCorrupt, len(r.Value))
	}
	return r, nil
}

// PeekVersion returns the version of an encoded envelope without decoding
// the rest; ok is false for a malformed one.
func PeekVersion(buf []byte) (v uint64, ok bool) {
	if len(buf) < HeaderSize || buf[0] != Format {
		return 0, false
	}
	return binary.BigEndian.Uint64(buf[2:HeaderSize]), true
}

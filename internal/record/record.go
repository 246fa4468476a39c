// Package record defines the envelope in which dhtkv stores every value: a
// 64-bit version, a tombstone flag and the value bytes. The same encoding is
// used on disk (Pebble values) and on the wire between nodes, so a replica can
// store what it receives without re-encoding.
//
// Layout (format 1), all integers big-endian:
//
//	offset 0  1 byte   format (currently 1)
//	offset 1  1 byte   flags  (bit 0: tombstone; other bits must be zero)
//	offset 2  8 bytes  version
//	offset 10 ...      value (empty for a tombstone)
//
// The format byte lets a later release read old records; an unknown format or
// flag is an error, never guessed at.
package record

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Format is the envelope format written by this release.
const Format = 1

// HeaderSize is the number of bytes before the value.
const HeaderSize = 10

const flagTombstone = 1

// ErrCorrupt reports an envelope that cannot be decoded.
var ErrCorrupt = errors.New("corrupt record")

// Record is one version of a key's state. A tombstone records a delete: it
// carries a version like any write so that an older PUT arriving late at a
// replica cannot resurrect the key.
type Record struct {
	Version   uint64
	Tombstone bool
	Value     []byte
}

// Newer reports whether r should replace other under last-write-wins. Versions
// are unique per write (they embed the coordinator's node id), so equal
// versions are the same write and neither replaces the other.
func (r *Record) Newer(other *Record) bool { return r.Version > other.Version }

// EncodedSize is the length of r's envelope.
func (r *Record) EncodedSize() int { return HeaderSize + len(r.Value) }

// AppendEncode appends r's envelope to dst and returns the extended slice.
func (r *Record) AppendEncode(dst []byte) []byte {
	var flags byte
	if r.Tombstone {
		flags |= flagTombstone
	}
	dst = append(dst, Format, flags)
	dst = binary.BigEndian.AppendUint64(dst, r.Version)
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
	if flags&^flagTombstone != 0 {
		return Record{}, fmt.Errorf("%w: unknown flags %#x", ErrCorrupt, flags)
	}
	r := Record{
		Version:   binary.BigEndian.Uint64(buf[2:HeaderSize]),
		Tombstone: flags&flagTombstone != 0,
		Value:     buf[HeaderSize:],
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

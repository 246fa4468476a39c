package partition

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math/bits"
)

// Set is a set of partitions: a bitmap of Count bits (512 bytes). The zero
// value is empty. A record stream between nodes names the partitions it
// carries with one (rpc.StreamPath's parts), so that the node sending it
// leaves out every record of the others.
type Set struct {
	w [Count / 64]uint64
}

// SetOf returns the set of parts.
func SetOf(parts ...ID) *Set {
	s := &Set{}
	for _, p := range parts {
		s.Add(p)
	}
	return s
}

// Add puts p in the set.
func (s *Set) Add(p ID) { s.w[p/64] |= 1 << (p % 64) }

// Has reports whether p is in the set. A nil set is empty.
func (s *Set) Has(p ID) bool { return s != nil && s.w[p/64]&(1<<(p%64)) != 0 }

// HasKey reports whether key's partition is in the set.
func (s *Set) HasKey(key []byte) bool {
	p, _ := Of(key)
	return s.Has(p)
}

// Len is the number of partitions in the set.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	n := 0
	for _, w := range s.w {
		n += bits.OnesCount64(w)
	}
	return n
}

// IDs returns the partitions of the set in increasing order.
func (s *Set) IDs() []ID {
	out := make([]ID, 0, s.Len())
	for p := range Count {
		if s.Has(ID(p)) {
			out = append(out, ID(p))
		}
	}
	return out
}

// encodedLen is the length of String's text: 512 bytes in unpadded
// base64url.
var encodedLen = base64.RawURLEncoding.EncodedLen(Count / 8)

// String encodes the set as unpadded base64url (RFC 4648 §5) of its bitmap,
// partition 0 in the lowest bit of the first byte: 683 characters that
// need no escaping in a URL query.
func (s *Set) String() string {
	var b [Count / 8]byte
	for i, w := range s.w {
		binary.LittleEndian.PutUint64(b[i*8:], w)
	}
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// ParseSet decodes String's text.
func ParseSet(text []byte) (*Set, error) {
	if len(text) != encodedLen {
		return nil, fmt.Errorf("partition set of %d characters, want %d", len(text), encodedLen)
	}
	var b [Count / 8]byte
	n, err := base64.RawURLEncoding.Strict().Decode(b[:], text)
	if err != nil || n != len(b) {
		return nil, fmt.Errorf("partition set: not base64url of %d bytes", len(b))
	}
	s := &Set{}
	for i := range s.w {
		s.w[i] = binary.LittleEndian.Uint64(b[i*8:])
	}
	return s, nil
}

package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// Identity says whose data a directory holds, so that a node never takes
// another cluster's or another node's data for its own, and whether the
// node has finished copying its share from the others after it started
// with an empty directory (see package rebuild).
type Identity struct {
	Cluster    uint64 // clustermap.Map.Cluster of the cluster it belongs to
	Node       int    // this node's id in that cluster (clustermap.Node.ID)
	Rebuilding bool   // still copying its share; its reads are not to be trusted
	// Formed is set once this node has seen every other node answer: the
	// cluster exists, and a member starting empty later is a lost disk,
	// not a new cluster.
	Formed bool
	// FormedAt is when Formed was first set, by this machine's clock, to
	// the millisecond (zero: not formed, or formed under a release that
	// did not record it, until the node records its start instead).
	FormedAt time.Time
	// Unconfirmed is set on an identity given to an empty directory while
	// not every peer answered: the node could not tell a new cluster from
	// a lost disk, and asks the peers until it can (package rebuild).
	Unconfirmed bool
	// Created is when the identity was given to an empty directory, by
	// this machine's clock, to the millisecond (zero: under a release that
	// did not record it).
	Created time.Time
}

// identityKey holds the Identity but its times, which identityTimesKey
// holds; both sort before every data key.
const (
	identityKey      = "\x00identity"
	identityTimesKey = "\x00identity-times"
)

// The identity's encoding under identityKey: the cluster (8 bytes,
// big-endian), the node (1), the flags (1); under identityTimesKey,
// Created and FormedAt in Unix milliseconds (8 bytes each, 0 for zero).
// The times have a key of their own so that identityKey stays the
// 10 bytes every release reads: a node rolled back to a release without
// them still starts (it ignores the flag it does not know).
const (
	identityLen      = 10
	identityTimesLen = 16

	flagRebuilding  = 1
	flagFormed      = 2
	flagUnconfirmed = 4
)

// Identity returns the stored identity; ok is false for a directory that
// has none yet.
func (s *Store) Identity() (id Identity, ok bool, err error) {
	v, err := s.meta(identityKey)
	if err != nil || v == nil {
		return Identity{}, false, err
	}
	if len(v) != identityLen {
		return Identity{}, false, fmt.Errorf("read identity in %s: %d bytes, want %d", s.dir, len(v), identityLen)
	}
	id = Identity{Cluster: binary.BigEndian.Uint64(v), Node: int(v[8]),
		Rebuilding: v[9]&flagRebuilding != 0, Formed: v[9]&flagFormed != 0, Unconfirmed: v[9]&flagUnconfirmed != 0}
	times, err := s.meta(identityTimesKey)
	switch {
	case err != nil:
		return Identity{}, false, err
	case times == nil: // written by a release before the times
	case len(times) != identityTimesLen:
		return Identity{}, false, fmt.Errorf("read identity times in %s: %d bytes, want %d", s.dir, len(times), identityTimesLen)
	default:
		id.Created = fromMillis(binary.BigEndian.Uint64(times))
		id.FormedAt = fromMillis(binary.BigEndian.Uint64(times[8:]))
	}
	return id, true, nil
}

// meta returns a copy of the value under key, nil if there is none.
func (s *Store) meta(key string) ([]byte, error) {
	v, closer, err := s.db.Get([]byte(key))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %q in %s: %w", key, s.dir, err)
	}
	defer closer.Close()
	return bytes.Clone(v), nil
}

// SetIdentity durably records id, its times with it in one commit.
func (s *Store) SetIdentity(id Identity) error {
	v := binary.BigEndian.AppendUint64(make([]byte, 0, identityLen), id.Cluster)
	var flags byte
	if id.Rebuilding {
		flags |= flagRebuilding
	}
	if id.Formed {
		flags |= flagFormed
	}
	if id.Unconfirmed {
		flags |= flagUnconfirmed
	}
	v = append(v, byte(id.Node), flags)
	times := binary.BigEndian.AppendUint64(make([]byte, 0, identityTimesLen), toMillis(id.Created))
	times = binary.BigEndian.AppendUint64(times, toMillis(id.FormedAt))
	b := s.db.NewBatch()
	defer b.Close()
	if err := errors.Join(b.Set([]byte(identityKey), v, nil), b.Set([]byte(identityTimesKey), times, nil)); err != nil {
		return fmt.Errorf("write identity in %s: %w", s.dir, err)
	}
	if err := s.write(func() error { return b.Commit(pebble.Sync) }); err != nil {
		return fmt.Errorf("write identity in %s: %w", s.dir, err)
	}
	return nil
}

func toMillis(t time.Time) uint64 {
	if t.IsZero() {
		return 0
	}
	return uint64(t.UnixMilli())
}

func fromMillis(ms uint64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(int64(ms))
}

package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/dhtkv/dhtkv/internal/partition"
)

// clusterMapKey holds the cluster map (clustermap.Map, encoded); it sorts
// before every data key.
const clusterMapKey = "\x00map"

// ClusterMap returns the stored cluster map; ok is false when there is
// none (a directory from before maps, or a new one).
func (s *Store) ClusterMap() (m []byte, ok bool, err error) {
	v, closer, err := s.db.Get([]byte(clusterMapKey))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read cluster map in %s: %w", s.dir, err)
	}
	defer closer.Close()
	return slices.Clone(v), true, nil
}

// SetClusterMap durably records the cluster map m.
func (s *Store) SetClusterMap(m []byte) error {
	if err := s.write(func() error { return s.db.Set([]byte(clusterMapKey), m, pebble.Sync) }); err != nil {
		return fmt.Errorf("write cluster map in %s: %w", s.dir, err)
	}
	return nil
}

// dropChunk is how many records DropPartition deletes per batch.
const dropChunk = 1024

// DropPartition deletes every record of partition part, and its index
// entries, and returns the keys deleted (for the caller's cache). It is
// for a partition this node no longer holds after a membership change;
// writes racing with it may be deleted too, which is what is wanted. The
// space comes back with compaction.
func (s *Store) DropPartition(part partition.ID) (removed [][]byte, err error) {
	for {
		var keys [][]byte
		err := s.SegmentEntries(part, -1, func(_ uint8, key []byte, _ IndexEntry) error {
			keys = append(keys, slices.Clone(key))
			if len(keys) == dropChunk {
				return errChunkFull
			}
			return nil
		})
		if err != nil && !errors.Is(err, errChunkFull) {
			return removed, err
		}
		if len(keys) == 0 {
			return removed, nil
		}
		b := s.db.NewBatch()
		for _, k := range keys {
			_, seg := partition.Of(k)
			ik := make([]byte, indexKeyLen(k))
			putIndexKey(ik, part, seg, k)
			if err := errors.Join(b.Delete(append([]byte{dataPrefix}, k...), nil), b.Delete(ik, nil)); err != nil {
				b.Close()
				return removed, fmt.Errorf("drop partition %d: %w", part, err)
			}
		}
		err = s.write(func() error { return s.db.Apply(b, pebble.NoSync) }) // lost by a crash: dropped again at the next start
		b.Close()
		if err != nil {
			return removed, fmt.Errorf("drop partition %d in %s: %w", part, s.dir, err)
		}
		s.summary.touch(part)
		removed = append(removed, keys...)
	}
}

var errChunkFull = errors.New("chunk full")

// Held returns the partitions of which the store holds any record, in
// increasing order, asking only those for which want is true: one index
// seek each, on one iterator (a membership cleanup asks for the
// partitions a node does not hold, most of them empty).
func (s *Store) Held(want func(partition.ID) bool) ([]partition.ID, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{indexPrefix}, UpperBound: []byte{indexPrefix + 1}})
	if err != nil {
		return nil, fmt.Errorf("index of %s: %w", s.dir, err)
	}
	var out []partition.ID
	var seek [3]byte
	seek[0] = indexPrefix
	for p := range partition.Count {
		part := partition.ID(p)
		if !want(part) {
			continue
		}
		binary.BigEndian.PutUint16(seek[1:], uint16(part))
		if it.SeekGE(seek[:]) && bytes.HasPrefix(it.Key(), seek[:]) {
			out = append(out, part)
		}
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return nil, fmt.Errorf("index of %s: %w", s.dir, err)
	}
	return out, nil
}

// cleanupKey marks a cleanup of partitions no longer held as pending
// (membership/move.go): set before it starts, deleted when it ends.
const cleanupKey = "\x00cleanup"

// CleanupPending reports whether a cleanup was left unfinished.
func (s *Store) CleanupPending() (bool, error) {
	_, closer, err := s.db.Get([]byte(cleanupKey))
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read cleanup marker in %s: %w", s.dir, err)
	}
	closer.Close()
	return true, nil
}

// SetCleanupPending durably sets or clears the cleanup marker.
func (s *Store) SetCleanupPending(pending bool) error {
	err := s.write(func() error {
		if pending {
			return s.db.Set([]byte(cleanupKey), nil, pebble.Sync)
		}
		return s.db.Delete([]byte(cleanupKey), pebble.Sync)
	})
	if err != nil {
		return fmt.Errorf("write cleanup marker in %s: %w", s.dir, err)
	}
	return nil
}

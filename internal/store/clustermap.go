package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/record"
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

// DropChunk is the most records DropPartition deletes in one batch, and
// so the most it asks of its Pacer at once: small enough that a pace of
// 20,000 records a second is at least 20 even steps a second (more where
// a partition holds fewer records than a chunk: about 250 each at 1M
// records a node).
const DropChunk = 1024

// Pacer paces a drop: WaitN returns once n more records may be deleted,
// or with ctx's error once ctx ends (golang.org/x/time/rate.Limiter, with
// a burst of at least DropChunk).
type Pacer interface {
	WaitN(ctx context.Context, n int) error
}

// DropPartition deletes every record of partition part, and its index
// entries, and returns how many records it deleted. It is for a partition
// this node no longer holds after a membership change.
//
// It walks the partition's index in chunks of at most DropChunk keys and
// deletes each chunk's data and index keys in one batch (two point
// deletes a record), applied without fsync: a crash loses some, which the
// caller drops again at the next start. Before each batch it waits for
// pace (nil: none), so that a drop of many records is spread over time
// instead of taking the cores and the disk from requests in a burst;
// after each commit it calls dropped (nil: nothing) with the batch's keys,
// for the caller's cache. Once ctx ends it returns ctx's error (or pace's,
// which ends the drop too), with the records of the batches committed
// deleted and the others untouched: the index entries left name exactly
// the records still to drop, so a later call finishes.
//
// It ends once a walk of the whole partition's index found nothing: a
// write racing with the drop may be deleted too, which is what is wanted
// (a write routed here by the next change's write-both stage is on the
// old replicas as well, and that change's copy brings it back). A data
// key and its index entry are always deleted together, never the index
// alone: a data key without an index entry would be invisible to
// anti-entropy, garbage collection and every later drop. The space comes
// back with compaction.
func (s *Store) DropPartition(ctx context.Context, part partition.ID, pace Pacer, dropped func(keys [][]byte)) (removed int, err error) {
	return s.dropPartition(ctx, part, pace, dropped, math.MaxUint64, true)
}

// DropHeld is DropPartition walking the partition's index once, and
// dropping only the records whose index entry says they arrived before
// arrivedBefore (Unix ms; IndexEntry.Arrived): what the partition held
// from before a moment, kept apart from what arrived since (package
// membership: a partition this node gains during a change holds
// leftovers from an earlier time it held it, and the change's own writes
// and copies, which must stay). It ends although writes keep arriving;
// DropPartition walks again until a walk finds nothing, which writes
// that keep arriving would never let it see.
func (s *Store) DropHeld(ctx context.Context, part partition.ID, pace Pacer, dropped func(keys [][]byte), arrivedBefore uint64) (removed int, err error) {
	return s.dropPartition(ctx, part, pace, dropped, arrivedBefore, false)
}

func (s *Store) dropPartition(ctx context.Context, part partition.ID, pace Pacer, dropped func(keys [][]byte), arrivedBefore uint64, rewalk bool) (removed int, err error) {
	// Partitions stop at 0x0fff: part+1 does not carry out of two bytes.
	lower := []byte{indexPrefix, byte(part >> 8), byte(part)}
	upper := []byte{indexPrefix, byte((part + 1) >> 8), byte(part + 1)}
	// found counts the records this walk of the index found so far.
	from, found := lower, 0
	for {
		if err := ctx.Err(); err != nil {
			return removed, err
		}
		keys, ikeys, last, err := s.indexKeys(from, upper, DropChunk, arrivedBefore)
		if err != nil {
			return removed, fmt.Errorf("drop partition %d in %s: %w", part, s.dir, err)
		}
		if last == nil { // the walk reached the partition's end
			if found == 0 || !rewalk {
				return removed, nil
			}
			from, found = lower, 0 // walk again: writes that raced behind the cursor
			continue
		}
		// The next chunk starts just after this one's last index key.
		from = append(last, 0)
		if len(keys) == 0 {
			continue // every entry of the chunk arrived since arrivedBefore
		}
		found += len(keys)
		if pace != nil {
			if err := pace.WaitN(ctx, len(keys)); err != nil {
				return removed, err
			}
		}
		if keys, err = s.dropChunk(keys, ikeys, arrivedBefore); err != nil {
			return removed, fmt.Errorf("drop partition %d in %s: %w", part, s.dir, err)
		}
		s.summary.touch(part)
		removed += len(keys)
		if dropped != nil && len(keys) > 0 {
			dropped(keys)
		}
	}
}

// dropChunk deletes the records and index entries of keys (ikeys their
// index keys) in one batch, applied without fsync (lost by a crash: the
// caller drops them again at its next start), and returns the keys
// deleted. With arrivedBefore (not math.MaxUint64) it holds writers off
// (gcState.mu, as Collect does) and reads each entry again: a key
// written since indexKeys read it arrived since, and stays.
func (s *Store) dropChunk(keys, ikeys [][]byte, arrivedBefore uint64) ([][]byte, error) {
	filter := arrivedBefore != math.MaxUint64
	if filter {
		if err := s.lockGC(); err != nil {
			return nil, err
		}
		defer s.gc.mu.Unlock()
	}
	b := s.db.NewBatch()
	defer b.Close()
	n := 0
	for i, k := range keys {
		if filter {
			v, closer, err := s.db.Get(ikeys[i])
			if errors.Is(err, pebble.ErrNotFound) {
				continue
			}
			if err != nil {
				return nil, err
			}
			e, ok := decodeIndexValue(v)
			closer.Close()
			if !ok {
				return nil, fmt.Errorf("index entry of %q: %w", k, record.ErrCorrupt)
			}
			if e.Arrived >= arrivedBefore {
				continue
			}
		}
		if err := errors.Join(b.Delete(append([]byte{dataPrefix}, k...), nil), b.Delete(ikeys[i], nil)); err != nil {
			return nil, err
		}
		keys[n] = k
		n++
	}
	if n == 0 {
		return nil, nil
	}
	if err := s.write(func() error { return s.db.Apply(b, pebble.NoSync) }); err != nil {
		return nil, err
	}
	return keys[:n], nil
}

// indexKeys reads up to max entries of the index between lower
// (included) and upper, in order, and returns the user keys and index
// keys (each its own copy) of those whose record arrived before
// arrivedBefore (Unix ms; math.MaxUint64: all), and the last index key
// read (nil: none, the range is done).
func (s *Store) indexKeys(lower, upper []byte, max int, arrivedBefore uint64) (keys, ikeys [][]byte, last []byte, err error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return nil, nil, nil, err
	}
	read := 0
	for ok := it.First(); ok && read < max; ok = it.Next() {
		read++
		k := it.Key()
		if len(k) < 4 {
			it.Close()
			return nil, nil, nil, fmt.Errorf("index key %q: %w", k, record.ErrCorrupt)
		}
		last = append(last[:0], k...)
		if arrivedBefore != math.MaxUint64 {
			e, ok := decodeIndexValue(it.Value())
			if !ok {
				it.Close()
				return nil, nil, nil, fmt.Errorf("index entry of %q: %w", k, record.ErrCorrupt)
			}
			if e.Arrived >= arrivedBefore {
				continue
			}
		}
		ik := slices.Clone(k)
		ikeys = append(ikeys, ik)
		keys = append(keys, ik[4:len(ik):len(ik)])
	}
	return keys, ikeys, last, errors.Join(it.Error(), it.Close())
}

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

// changeBeganKey holds when this node installed the first map of the
// change under way, Unix ms, 8 bytes big-endian (package membership):
// what a partition it gains held from before the change is what arrived
// before then (DropHeld). Absent: none recorded (a node that joined with
// the change, or a store of an earlier release).
const changeBeganKey = "\x00began"

// ChangeBegan returns what SetChangeBegan recorded last (0: nothing).
func (s *Store) ChangeBegan() (uint64, error) {
	v, closer, err := s.db.Get([]byte(changeBeganKey))
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read when the change began in %s: %w", s.dir, err)
	}
	defer closer.Close()
	if len(v) != 8 {
		return 0, fmt.Errorf("read when the change began in %s: %d bytes, want 8: %w", s.dir, len(v), record.ErrCorrupt)
	}
	return binary.BigEndian.Uint64(v), nil
}

// SetChangeBegan durably records when the change under way began here
// (Unix ms).
func (s *Store) SetChangeBegan(ms uint64) error {
	err := s.write(func() error {
		return s.db.Set([]byte(changeBeganKey), binary.BigEndian.AppendUint64(nil, ms), pebble.Sync)
	})
	if err != nil {
		return fmt.Errorf("record when the change began in %s: %w", s.dir, err)
	}
	return nil
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

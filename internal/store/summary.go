package store

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"

	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/record"
)

// The anti-entropy index and summaries
//
// Every write also merges its version into an index key
//
//	'i' | partition (2 bytes, big-endian) | segment (1 byte) | user key  →  version (8 bytes)
//
// in the same batch, resolved by the larger version (merge.go), so the
// index holds exactly the version the data key holds: no read before the
// write, and no value read to summarize. Keys sort by partition and then
// segment, so one segment's (key, version) list is one contiguous range.
//
// A segment's hash is the XOR of partition.EntryHash over its entries; a
// partition's, the XOR of its segments'. Hashes are computed from the index
// when asked for and kept in memory (2 MiB: 4096 partitions × 64 segments
// × 8 bytes) until a write touches the partition. A store opens with every
// partition stale, so the first summary after a start reads the whole
// index (about 1M entries a second here).
//
// Staleness is tracked per partition with a flag that a write sets after
// its commit and a recomputation clears before it opens its iterator. So a
// write committed before the iterator opened is in the scan, and one
// committed after it sets the flag again (its Set comes after its commit,
// which comes after the clear): a summary may miss a write that committed
// while it was computed, never one that committed before it was asked
// for, and the next summary includes it.

const indexPrefix = 'i'

// indexKeyLen is the length of key's index key.
func indexKeyLen(key []byte) int { return 4 + len(key) }

// putIndexKey writes key's index key into dst (indexKeyLen(key) bytes).
func putIndexKey(dst []byte, part partition.ID, seg uint8, key []byte) {
	dst[0] = indexPrefix
	binary.BigEndian.PutUint16(dst[1:], uint16(part))
	dst[3] = seg
	copy(dst[4:], key)
}

type summary struct {
	mu    sync.Mutex // serializes recomputations and guards segs
	stale [partition.Count]atomic.Bool
	segs  *[partition.Count][partition.Segments]uint64
}

func (m *summary) init() {
	m.segs = new([partition.Count][partition.Segments]uint64)
	for i := range m.stale {
		m.stale[i].Store(true)
	}
}

// touch marks part's hashes stale. Call it after the write's commit.
func (m *summary) touch(part partition.ID) { m.stale[part].Store(true) }

// SegmentHashes copies partition part's segment hashes into dst. It reads
// the partition's index range if the partition was written since its
// hashes were last computed.
func (s *Store) SegmentHashes(part partition.ID, dst *[partition.Segments]uint64) error {
	m := &s.summary
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stale[part].Swap(false) {
		var fresh [partition.Segments]uint64
		err := s.SegmentEntries(part, -1, func(seg uint8, key []byte, version uint64) error {
			fresh[seg] ^= partition.EntryHash(key, version)
			return nil
		})
		if err != nil {
			m.stale[part].Store(true)
			return err
		}
		m.segs[part] = fresh
	}
	*dst = m.segs[part]
	return nil
}

// PartitionHash returns the XOR of partition part's segment hashes.
func (s *Store) PartitionHash(part partition.ID) (uint64, error) {
	var segs [partition.Segments]uint64
	if err := s.SegmentHashes(part, &segs); err != nil {
		return 0, err
	}
	var h uint64
	for _, x := range segs {
		h ^= x
	}
	return h, nil
}

// SegmentEntries calls fn with every (key, version) in segment seg of
// partition part, in key order; seg -1 means every segment of the
// partition, in segment order. key is valid only during the call. An error
// from fn stops the walk and is returned.
func (s *Store) SegmentEntries(part partition.ID, seg int, fn func(seg uint8, key []byte, version uint64) error) error {
	var lower, upper [4]byte
	lower[0] = indexPrefix
	binary.BigEndian.PutUint16(lower[1:], uint16(part))
	n := 3
	if seg >= 0 {
		lower[3] = uint8(seg)
		n = 4
	}
	copy(upper[:], lower[:n])
	// The upper bound is the prefix plus one, with carry; it cannot
	// overflow, as partitions stop at 0x0fff.
	for i := n - 1; i >= 0; i-- {
		upper[i]++
		if upper[i] != 0 {
			break
		}
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower[:n], UpperBound: upper[:n]})
	if err != nil {
		return fmt.Errorf("index of partition %d in %s: %w", part, s.dir, err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		v, err := it.ValueAndErr()
		if err != nil {
			it.Close()
			return fmt.Errorf("index of partition %d in %s: %w", part, s.dir, err)
		}
		if len(k) < 4 || len(v) != 8 {
			it.Close()
			return fmt.Errorf("index of partition %d in %s: entry %q: %w", part, s.dir, k, record.ErrCorrupt)
		}
		if err := fn(k[3], k[4:], binary.BigEndian.Uint64(v)); err != nil {
			it.Close()
			return err
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("index of partition %d in %s: %w", part, s.dir, err)
	}
	return nil
}

// upgradeBatch bounds the index entries written in one commit while a
// layout 1 directory is upgraded.
const upgradeBatch = 4096

// upgradeLayout1 builds the anti-entropy index of a layout 1 directory
// from its data keys, then records the current layout. A crash part-way leaves
// layout 1 recorded, and the next Open starts again: index merges are
// idempotent.
func (s *Store) upgradeLayout1() error {
	s.log.Info("upgrading the data directory from layout 1: building the anti-entropy index", "dir", s.dir)
	it, err := s.NewIter(nil, nil)
	if err != nil {
		return err
	}
	b := s.db.NewBatch()
	n := 0
	commit := func() error {
		err := s.db.Apply(b, pebble.Sync)
		b.Close()
		b = s.db.NewBatch()
		return err
	}
	for it.Next() {
		key := it.Key()
		part, seg := partition.Of(key)
		ix := b.MergeDeferred(indexKeyLen(key), 8)
		putIndexKey(ix.Key, part, seg, key)
		binary.BigEndian.PutUint64(ix.Value, it.Record().Version)
		if err = ix.Finish(); err != nil {
			break
		}
		if n++; n%upgradeBatch == 0 {
			if err = commit(); err != nil {
				break
			}
		}
	}
	if err == nil {
		err = it.Err()
	}
	if cerr := it.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = b.Set([]byte(layoutKey), []byte(layoutVersion), nil)
	}
	if err == nil {
		err = commit()
	}
	b.Close()
	if err != nil {
		return fmt.Errorf("upgrade %s to %s: %w", s.dir, layoutVersion, err)
	}
	s.log.Info("upgraded the data directory", "dir", s.dir, "layout", layoutVersion, "keys", n)
	return nil
}

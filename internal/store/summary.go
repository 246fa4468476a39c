package store

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/record"
)

// The anti-entropy index and summaries
//
// Every write also merges an index entry for its key
//
//	'i' | partition (2 bytes, big-endian) | segment (1 byte) | user key
//	  →  version (8 bytes) | arrived (8) | collect (8)      (IndexEntry)
//
// in the same batch, resolved by the larger version (merge.go), so the
// index holds exactly the version the data key holds: no read before the
// write, and no value read to summarize or to find what garbage
// collection may remove (gc.go). Keys sort by partition and then
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

// IndexEntry is a key's entry in the index.
type IndexEntry struct {
	Version uint64
	// Arrived is when this node last stored this version, Unix
	// milliseconds: garbage collection removes a record only once this
	// node has since compared it with every other replica.
	Arrived uint64
	// Collect is when the record may be collected, Unix milliseconds: a
	// tombstone's version time, an expiring value's expiry; 0 for a value
	// that never expires.
	Collect uint64
}

const indexValueLen = 24

func (e IndexEntry) put(dst []byte) {
	binary.BigEndian.PutUint64(dst, e.Version)
	binary.BigEndian.PutUint64(dst[8:], e.Arrived)
	binary.BigEndian.PutUint64(dst[16:], e.Collect)
}

func decodeIndexValue(v []byte) (IndexEntry, bool) {
	if len(v) != indexValueLen {
		return IndexEntry{}, false
	}
	return IndexEntry{
		Version: binary.BigEndian.Uint64(v),
		Arrived: binary.BigEndian.Uint64(v[8:]),
		Collect: binary.BigEndian.Uint64(v[16:]),
	}, true
}

// indexEntryOf is the entry of rec stored at arrived (Unix ms).
func indexEntryOf(rec *record.Record, arrived uint64) IndexEntry {
	e := IndexEntry{Version: rec.Version, Arrived: arrived, Collect: rec.ExpiresAt}
	if rec.Tombstone {
		e.Collect = uint64(hlc.TimeOf(rec.Version).UnixMilli())
	}
	return e
}

// addIndex adds key's index entry e to b.
func addIndex(b *pebble.Batch, key []byte, e IndexEntry) (partition.ID, error) {
	part, seg := partition.Of(key)
	return part, addIndexIn(b, key, part, seg, e)
}

// addIndexIn is addIndex for a key whose partition and segment the
// caller has.
func addIndexIn(b *pebble.Batch, key []byte, part partition.ID, seg uint8, e IndexEntry) error {
	ix := b.MergeDeferred(indexKeyLen(key), indexValueLen)
	putIndexKey(ix.Key, part, seg, key)
	e.put(ix.Value)
	return ix.Finish()
}

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
	_, err := s.SegmentHashesWalked(part, dst)
	return err
}

// SegmentHashesWalked is SegmentHashes, and how many index entries it
// read to recompute them (0: they were current), for a caller that paces
// its walks.
func (s *Store) SegmentHashesWalked(part partition.ID, dst *[partition.Segments]uint64) (walked int, err error) {
	m := &s.summary
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stale[part].Swap(false) {
		var fresh [partition.Segments]uint64
		err := s.SegmentEntries(part, -1, func(seg uint8, key []byte, e IndexEntry) error {
			fresh[seg] ^= partition.EntryHash(key, e.Version)
			walked++
			return nil
		})
		if err != nil {
			m.stale[part].Store(true)
			return walked, err
		}
		m.segs[part] = fresh
	}
	*dst = m.segs[part]
	return walked, nil
}

// PartitionHash returns the XOR of partition part's segment hashes, and
// how many index entries it read to recompute them (SegmentHashesWalked).
func (s *Store) PartitionHash(part partition.ID) (h uint64, walked int, err error) {
	var segs [partition.Segments]uint64
	if walked, err = s.SegmentHashesWalked(part, &segs); err != nil {
		return 0, walked, err
	}
	for _, x := range segs {
		h ^= x
	}
	return h, walked, nil
}

// SegmentEntries calls fn with every key's index entry in segment seg of
// partition part, in key order; seg -1 means every segment of the
// partition, in segment order. key is valid only during the call. An error
// from fn stops the walk and is returned. To list many segments, a
// SegmentReader costs less.
func (s *Store) SegmentEntries(part partition.ID, seg int, fn func(seg uint8, key []byte, e IndexEntry) error) error {
	r := s.NewSegmentReader()
	err := r.Entries(part, seg, fn)
	if cerr := r.Close(); err == nil {
		err = cerr
	}
	return err
}

// SegmentReader lists index segments one after another with one Pebble
// iterator, moved from segment to segment (SetBounds), where
// SegmentEntries opens an iterator for each: an exchange lists up to a
// few hundred thousand segments of a few entries each, and opening an
// iterator costs more than listing a few entries. The iterator reads the
// store as it was when it was opened, so it is opened again once it is
// segmentReaderFresh old: a long walk pins no memtable or sstable longer
// than that, and sees writes at most that late. The zero value is not
// usable; NewSegmentReader opens nothing. Not safe for concurrent use.
type SegmentReader struct {
	s      *Store
	it     *pebble.Iterator
	opened time.Time
}

// segmentReaderFresh is how long a SegmentReader reads through one
// iterator.
const segmentReaderFresh = time.Second

// NewSegmentReader returns a reader of s's index segments; Close it.
func (s *Store) NewSegmentReader() *SegmentReader { return &SegmentReader{s: s} }

// Entries is SegmentEntries through r's iterator.
func (r *SegmentReader) Entries(part partition.ID, seg int, fn func(seg uint8, key []byte, e IndexEntry) error) error {
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
	if r.it != nil && time.Since(r.opened) >= segmentReaderFresh {
		if err := r.Close(); err != nil {
			return err
		}
	}
	if r.it == nil {
		it, err := r.s.db.NewIter(&pebble.IterOptions{LowerBound: lower[:n], UpperBound: upper[:n]})
		if err != nil {
			return fmt.Errorf("index of partition %d in %s: %w", part, r.s.dir, err)
		}
		r.it, r.opened = it, time.Now()
	} else {
		r.it.SetBounds(lower[:n], upper[:n]) // copies them
	}
	it := r.it
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		v, err := it.ValueAndErr()
		if err != nil {
			return fmt.Errorf("index of partition %d in %s: %w", part, r.s.dir, err)
		}
		e, ok := decodeIndexValue(v)
		if len(k) < 4 || !ok {
			return fmt.Errorf("index of partition %d in %s: entry %q: %w", part, r.s.dir, k, record.ErrCorrupt)
		}
		if err := fn(k[3], k[4:], e); err != nil {
			return err
		}
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("index of partition %d in %s: %w", part, r.s.dir, err)
	}
	return nil
}

// Close releases r's iterator; r can be used again.
func (r *SegmentReader) Close() error {
	if r.it == nil {
		return nil
	}
	err := r.it.Close()
	r.it = nil
	if err != nil {
		return fmt.Errorf("index iterator of %s: %w", r.s.dir, err)
	}
	return nil
}

// upgradeBatch bounds the index entries written in one commit while a
// layout 1 directory is upgraded.
const upgradeBatch = 4096

// buildIndex (re)builds the anti-entropy index of a directory of an older
// layout from its data keys, each arrived now, then records the current
// layout. A crash part-way leaves the old layout recorded, and the next
// Open starts again from scratch.
func (s *Store) buildIndex(from string) error {
	s.log.Info("upgrading the data directory: building the anti-entropy index", "dir", s.dir, "layout", from)
	if err := s.write(func() error { return s.db.DeleteRange([]byte{indexPrefix}, []byte{indexPrefix + 1}, pebble.Sync) }); err != nil {
		return fmt.Errorf("upgrade %s: %w", s.dir, err)
	}
	it, err := s.NewIter(nil, nil)
	if err != nil {
		return err
	}
	arrived := uint64(time.Now().UnixMilli())
	b := s.db.NewBatch()
	n := 0
	commit := func() error {
		err := s.write(func() error { return s.db.Apply(b, pebble.Sync) })
		b.Close()
		b = s.db.NewBatch()
		return err
	}
	for it.Next() {
		rec := it.Record()
		if _, err = addIndex(b, it.Key(), indexEntryOf(&rec, arrived)); err != nil {
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

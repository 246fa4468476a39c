package store

import (
	"bytes"
	"context"
	"fmt"
)

// The shape of the LSM, for settling (package settle).
//
// A GET that misses the read cache is a Pebble point lookup. It consults
// the memtables, every L0 file (a bloom filter each) and the levels below
// down to the one that holds the key; and since every record is a merge
// operand (merge.go), a key found above the bottom level makes the lookup
// go on below it for older operands, reading the next entry of the level
// that held it first. A compaction into the bottom level leaves each key
// one SET. So the same data answers a miss with less CPU once it is all in
// the bottom level (docs/storage.md, "Settling a quiet store").

// Shape is what package settle decides by, from Pebble's metrics.
type Shape struct {
	// WALBytes counts the bytes written to the WAL since Open: it stays
	// the same while the store takes no write.
	WALBytes uint64
	// Above is the bytes of the tables in L0 (whose tables overlap, each
	// one a lookup consults) and in the levels above the bottom level
	// that holds any; Total, of every table.
	Above, Total uint64
}

// Shape reads the store's shape.
func (s *Store) Shape() Shape {
	m := s.db.Metrics()
	sh := Shape{WALBytes: m.WAL.BytesIn}
	bottom := -1
	for i := range m.Levels {
		if m.Levels[i].TablesSize > 0 {
			bottom = i
		}
	}
	for i := range m.Levels {
		size := uint64(max(m.Levels[i].TablesSize, 0))
		sh.Total += size
		if i < bottom || i == 0 {
			sh.Above += size
		}
	}
	return sh
}

// KeyRange is a range of the store's own keys (data, index and meta keys
// alike), Start and End included.
type KeyRange struct {
	Start, End []byte
	// Bytes is about how much of the bottom level the range holds.
	Bytes uint64
}

// Slices splits the whole key space into ranges that each hold about
// maxBytes of the bottom level (one table at least), cut at its tables'
// boundaries, so that compacting one range rewrites about that much. A
// store with no tables is one range.
func (s *Store) Slices(maxBytes uint64) ([]KeyRange, error) {
	levels, err := s.db.SSTables()
	if err != nil {
		return nil, fmt.Errorf("store tables: %w", err)
	}
	bottom := -1
	for i := range levels {
		if len(levels[i]) > 0 {
			bottom = i
		}
	}
	first, last := []byte{}, []byte{0xff, 0xff}
	if bottom <= 0 {
		// No tables, or L0's alone: they overlap, so there is no cut to
		// make.
		var size uint64
		if bottom == 0 {
			for _, t := range levels[0] {
				size += t.Size
			}
		}
		return []KeyRange{{Start: first, End: last, Bytes: size}}, nil
	}
	var out []KeyRange
	cur := KeyRange{Start: first}
	for i, t := range levels[bottom] {
		cur.Bytes += t.Size
		if i+1 == len(levels[bottom]) || cur.Bytes < maxBytes {
			continue
		}
		// The level's tables are in key order and do not overlap: the next
		// one's smallest key is above every key of this slice.
		cut := levels[bottom][i+1].Smallest.UserKey
		if bytes.Compare(cut, cur.Start) <= 0 { // the store orders keys bytewise
			continue
		}
		cur.End = append([]byte(nil), cut...)
		out = append(out, cur)
		cur = KeyRange{Start: cur.End}
	}
	cur.End = last
	return append(out, cur), nil
}

// CompactRange compacts r's keys down to the bottom level (Pebble's
// manual compaction, level by level). Writes go on meanwhile; a memtable
// holding keys of r is flushed first. Once ctx is done, the levels not
// begun are left (one under way completes).
func (s *Store) CompactRange(ctx context.Context, r KeyRange) error {
	if err := s.db.Compact(ctx, r.Start, r.End, false); err != nil {
		return fmt.Errorf("compact %q to %q: %w", r.Start, r.End, err)
	}
	return nil
}

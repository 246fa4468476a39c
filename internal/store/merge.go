package store

import (
	"fmt"
	"io"
	"sync"

	"github.com/cockroachdb/pebble/v2"

	"github.com/dhtkv/dhtkv/internal/record"
)

// mergerName is persisted by Pebble in the OPTIONS file; opening a directory
// written with another merger fails, which is what we want if the semantics
// ever change (bump the suffix then).
const mergerName = "dhtkv.lww.v1"

// lwwMerger makes last-write-wins Pebble's job instead of ours: every write is
// a Merge of a full envelope, and merging keeps the operand with the highest
// version. The operation is associative and commutative, as Pebble requires,
// so it is correct whichever subset of operands a compaction sees. A write
// therefore needs no read-before-write and no lock: concurrent writers of one
// key, and replicas receiving writes out of order, converge on the newest.
//
// Pebble merges on every read of a key stored as merge operands and in
// every flush and compaction, so mergers and their buffers are recycled:
// Finish hands Pebble the merger itself as the io.Closer of the result,
// and Close returns it to the pool once Pebble is done with the bytes.
// (Allocating them was most of the bytes allocated under PUT load.)
//
// The anti-entropy index (summary.go) is merged too, by the larger
// version: its keys start with indexPrefix and its values are index
// entries, so it always holds the version that last-write-wins kept in the
// data key, whatever order the writes came in.
var lwwMerger = &pebble.Merger{
	Name: mergerName,
	Merge: func(key, value []byte) (pebble.ValueMerger, error) {
		if len(key) > 0 && key[0] == indexPrefix {
			m := maxMergerPool.Get().(*indexMerger)
			m.best = IndexEntry{}
			if err := m.add(value); err != nil {
				maxMergerPool.Put(m)
				return nil, err
			}
			return m, nil
		}
		m := mergerPool.Get().(*lwwValueMerger)
		m.best, m.version = m.best[:0], 0
		if err := m.add(value); err != nil {
			mergerPool.Put(m)
			return nil, err
		}
		return m, nil
	},
}

var mergerPool = sync.Pool{New: func() any { return new(lwwValueMerger) }}

// maxPooledBuffer keeps one huge value from pinning its buffer in the pool.
const maxPooledBuffer = 64 << 10

type lwwValueMerger struct {
	best    []byte // owned copy of the winning envelope
	version uint64
}

func (m *lwwValueMerger) add(value []byte) error {
	v, ok := record.PeekVersion(value)
	if !ok {
		return fmt.Errorf("merge operand: %w", record.ErrCorrupt)
	}
	if m.best == nil || v > m.version {
		// Pebble retains ownership of value: copy the winner.
		m.best = append(m.best[:0], value...)
		m.version = v
	}
	return nil
}

func (m *lwwValueMerger) MergeNewer(value []byte) error { return m.add(value) }
func (m *lwwValueMerger) MergeOlder(value []byte) error { return m.add(value) }

// Finish returns the winner; it stays valid until Pebble calls Close.
func (m *lwwValueMerger) Finish(includesBase bool) ([]byte, io.Closer, error) {
	return m.best, m, nil
}

// Close recycles the merger once Pebble no longer needs Finish's result.
func (m *lwwValueMerger) Close() error {
	if cap(m.best) <= maxPooledBuffer {
		mergerPool.Put(m)
	}
	return nil
}

var maxMergerPool = sync.Pool{New: func() any { return new(indexMerger) }}

// indexMerger keeps the index entry (summary.go) of the largest version;
// of two entries of one version (the same write stored twice), the later
// arrival: a record a change's copy stored again is the copy, which the
// drop of what a gained partition held from before (DropHeld) must keep,
// and garbage collection then waits for an exchange since (only later).
type indexMerger struct {
	best IndexEntry
	buf  [indexValueLen]byte
}

func (m *indexMerger) add(value []byte) error {
	e, ok := decodeIndexValue(value)
	if !ok {
		return fmt.Errorf("index merge operand of %d bytes: %w", len(value), record.ErrCorrupt)
	}
	if e.Version > m.best.Version || e.Version == m.best.Version && e.Arrived > m.best.Arrived {
		m.best = e
	}
	return nil
}

func (m *indexMerger) MergeNewer(value []byte) error { return m.add(value) }
func (m *indexMerger) MergeOlder(value []byte) error { return m.add(value) }

// Finish returns the winning entry; it stays valid until Pebble calls
// Close.
func (m *indexMerger) Finish(includesBase bool) ([]byte, io.Closer, error) {
	m.best.put(m.buf[:])
	return m.buf[:], m, nil
}

// Close recycles the merger once Pebble no longer needs Finish's result.
func (m *indexMerger) Close() error {
	maxMergerPool.Put(m)
	return nil
}

package store

import (
	"fmt"
	"io"

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
var lwwMerger = &pebble.Merger{
	Name: mergerName,
	Merge: func(key, value []byte) (pebble.ValueMerger, error) {
		m := &lwwValueMerger{}
		if err := m.add(value); err != nil {
			return nil, err
		}
		return m, nil
	},
}

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

func (m *lwwValueMerger) Finish(includesBase bool) ([]byte, io.Closer, error) {
	return m.best, nil, nil
}

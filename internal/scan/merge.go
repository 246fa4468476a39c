package scan

import (
	"bytes"
	"container/heap"
	"errors"

	"github.com/dhtkv/dhtkv/internal/record"
)

// Merge is the k-way merge of the nodes' streams: it yields every key that
// appears in any source once, in key order, with the newest version among
// the sources that have it (last-write-wins, like a GET). Tombstones are
// yielded too, so that a newer delete hides an older value on another node;
// the caller drops them.
//
// Memory is one current record per source, held by the sources themselves:
// the merge copies nothing. That is why the winner is yielded before any
// source moves on: advancing a source invalidates its Key and Record.
type Merge struct {
	srcs    []Iterator
	h       mergeHeap
	pending []int // sources whose record was consumed, to advance on Next
	best    int
	err     error
}

// NewMerge merges srcs, which must each be in strictly increasing key
// order. Close closes all of them.
func NewMerge(srcs []Iterator) *Merge {
	m := &Merge{srcs: srcs, best: -1}
	m.h.srcs = srcs
	for i := range srcs {
		m.pending = append(m.pending, i)
	}
	return m
}

// Next advances to the next key.
func (m *Merge) Next() bool {
	if m.err != nil {
		return false
	}
	for _, i := range m.pending {
		if m.srcs[i].Next() {
			heap.Push(&m.h, i)
		} else if err := m.srcs[i].Err(); err != nil {
			// A source that fails cannot be told apart from one that has
			// no more keys in the rest of the range: the merged stream
			// would silently miss its keys. Stop.
			m.err = err
			m.best = -1
			return false
		}
	}
	m.pending = m.pending[:0]
	if m.h.Len() == 0 {
		m.best = -1
		return false
	}
	first := heap.Pop(&m.h).(int)
	m.pending = append(m.pending, first)
	m.best = first
	key := m.srcs[first].Key()
	bestVersion := m.srcs[first].Record().Version
	for m.h.Len() > 0 && bytes.Equal(m.srcs[m.h.idx[0]].Key(), key) {
		j := heap.Pop(&m.h).(int)
		m.pending = append(m.pending, j)
		// Equal versions are the same write (versions embed the writer's
		// node id), so keeping the first is as good as any.
		if v := m.srcs[j].Record().Version; v > bestVersion {
			m.best, bestVersion = j, v
		}
	}
	return true
}

// Key, Envelope and Record describe the newest version of the current key;
// they are valid until the next call to Next.
func (m *Merge) Key() []byte { return m.srcs[m.best].Key() }

// Envelope is the winning record's encoded envelope.
func (m *Merge) Envelope() []byte { return m.srcs[m.best].Envelope() }

// Record is the winning record.
func (m *Merge) Record() record.Record { return m.srcs[m.best].Record() }

// Err is the first source error.
func (m *Merge) Err() error { return m.err }

// Close closes every source and returns the first error.
func (m *Merge) Close() error {
	var errs []error
	for _, s := range m.srcs {
		if err := s.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Release releases every source that is a Releaser (a node's own store
// iterator; another node's stream pins nothing here, and that node
// releases its own iterator when the stream stalls). The sources keep
// their current records, so the merge's state, which is their keys, holds.
func (m *Merge) Release() error {
	var errs []error
	for _, s := range m.srcs {
		if r, ok := s.(Releaser); ok {
			if err := r.Release(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// mergeHeap orders source indexes by their current key; equal keys by index
// so the order is deterministic.
type mergeHeap struct {
	srcs []Iterator
	idx  []int
}

func (h *mergeHeap) Len() int { return len(h.idx) }
func (h *mergeHeap) Less(a, b int) bool {
	c := bytes.Compare(h.srcs[h.idx[a]].Key(), h.srcs[h.idx[b]].Key())
	return c < 0 || (c == 0 && h.idx[a] < h.idx[b])
}
func (h *mergeHeap) Swap(a, b int) { h.idx[a], h.idx[b] = h.idx[b], h.idx[a] }
func (h *mergeHeap) Push(x any)    { h.idx = append(h.idx, x.(int)) }
func (h *mergeHeap) Pop() any {
	n := len(h.idx) - 1
	x := h.idx[n]
	h.idx = h.idx[:n]
	return x
}

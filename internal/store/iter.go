package store

import (
	"bytes"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/record"
)

// Iter walks the store's records in increasing key order, tombstones
// included. It reads a consistent snapshot of the store as of NewIter and
// holds that snapshot's memtables and sstables until Close, Release or its
// end, so it must always be closed, and not kept open longer than needed:
// a stalled Iter pins memory (and disk) that writes have since replaced.
//
// Release gives the snapshot back without losing the position: the next
// Next opens a new snapshot of the store as it is then, just after the
// current key. Across a Release the walk is therefore not one snapshot:
// each key still comes at most once and in increasing order, at a version
// at least as new as the one the Iter would have shown without the
// Release (last-write-wins only moves versions forward), but keys written
// meanwhile behind the position are not seen and keys written or deleted
// ahead of it are.
//
// Key, Envelope and Record alias Pebble's memory (after a Release, the
// Iter's own copy) and are valid until the next call to Next or Close;
// nothing is copied per record.
type Iter struct {
	s        *Store
	it       *pebble.Iterator // nil once closed or released
	lower    []byte           // prefixed lower bound; rewritten on reopen
	upper    []byte           // prefixed upper bound
	key      []byte
	env      []byte
	rec      record.Record
	err      error
	first    bool   // it is not positioned yet: the next Next calls First
	done     bool   // the end was reached
	closed   bool   // Close was called
	released bool   // Release closed it; Next reopens it
	held     []byte // key and envelope of the current record, kept across a Release
	// parts, when not nil, leaves out every record of the partitions
	// not in it (NewPartitionIter).
	parts *partition.Set
}

var dataUpper = []byte{dataPrefix + 1}

// NewIter returns an iterator over the records with start <= key < end;
// end nil means to the last key.
func (s *Store) NewIter(start, end []byte) (*Iter, error) {
	upper := dataUpper
	if end != nil {
		upper = append([]byte{dataPrefix}, end...)
	}
	lower := append([]byte{dataPrefix}, start...)
	if bytes.Compare(lower, upper) >= 0 {
		upper = lower // empty range
	}
	it := &Iter{s: s, lower: lower, upper: upper, first: true}
	if err := it.open(); err != nil {
		return nil, err
	}
	return it, nil
}

// NewPartitionIter returns an iterator over the records with start <= key
// < end (as NewIter) of the partitions in parts, in key order like any
// Iter: a walk of the range that leaves the others out before it reads
// their values. Partitions are hashed
// over the keyspace, so no key range holds one alone; the walk reads
// every key, and costs little more than NewIter's once the set covers a
// good part of the store (a membership change's gains, a node's share).
// parts is not copied and must not change while the Iter is used.
func (s *Store) NewPartitionIter(start, end []byte, parts *partition.Set) (*Iter, error) {
	it, err := s.NewIter(start, end)
	if err != nil {
		return nil, err
	}
	it.parts = parts
	return it, nil
}

// open opens the Pebble iterator over [lower, upper).
func (s *Iter) open() error {
	it, err := s.s.db.NewIter(&pebble.IterOptions{LowerBound: s.lower, UpperBound: s.upper})
	if err != nil {
		return fmt.Errorf("new iterator in %s: %w", s.s.dir, err)
	}
	s.it = it
	s.s.iters.Add(1)
	return nil
}

// Next advances to the next record; false at the end or on an error (Err).
func (s *Iter) Next() bool {
	if s.closed || s.done || s.err != nil {
		return false
	}
	if s.released && !s.reopen() {
		return false
	}
	var ok bool
	if s.first {
		ok, s.first = s.it.First(), false
	} else {
		ok = s.it.Next()
	}
	for ok && s.parts != nil && !s.wanted(s.it.Key()) {
		ok = s.it.Next()
	}
	if !ok {
		// No record is current any more: the snapshot can go at once.
		s.done = true
		if err := s.it.Error(); err != nil {
			s.err = fmt.Errorf("scan store: %w", err)
		}
		if err := s.closeIt(); err != nil && s.err == nil {
			s.err = fmt.Errorf("scan store: %w", err)
		}
		return false
	}
	pk := s.it.Key()
	if len(pk) == 0 || pk[0] != dataPrefix {
		// The bounds keep the iterator inside the data prefix.
		s.err = fmt.Errorf("scan store: non-data key %q inside the bounds", pk)
		return false
	}
	s.key = pk[1:]
	env, err := s.it.ValueAndErr()
	if err != nil {
		s.err = fmt.Errorf("scan store: value of %q: %w", s.key, err)
		return false
	}
	if s.rec, err = record.Decode(env); err != nil {
		s.err = fmt.Errorf("scan store: key %q: %w", s.key, err)
		return false
	}
	s.env = env
	return true
}

// wanted reports whether the record at prefixed key pk is in the Iter's
// partitions (a key outside the data prefix is wanted: Next refuses it).
func (s *Iter) wanted(pk []byte) bool {
	return len(pk) == 0 || pk[0] != dataPrefix || s.parts.HasKey(pk[1:])
}

// reopen opens a new Pebble iterator after a Release, starting just after
// the current key (the smallest key above it is the key and a zero byte),
// or where the range starts if Next never returned a record. It reports
// false, with Err set or the end reached, when there is nothing to open.
func (s *Iter) reopen() bool {
	if !s.first {
		s.lower = append(append(append(s.lower[:0], dataPrefix), s.key...), 0)
		s.first = true
	}
	s.released = false
	if bytes.Compare(s.lower, s.upper) >= 0 {
		s.done = true
		return false
	}
	if err := s.open(); err != nil {
		s.err = fmt.Errorf("scan store: reopen after %q: %w", s.key, err)
		return false
	}
	return true
}

// Release closes the Pebble iterator, so that the Iter no longer pins its
// snapshot's memtables and sstables, and keeps the position: Key, Envelope
// and Record stay valid (they are copied first) and the next Next reopens
// an iterator just after the current key (see Iter for what the walk then
// sees). A range stream calls it while its client does not read. It is a
// no-op on an Iter already released or closed; it is not safe to call
// concurrently with the Iter's other methods.
func (s *Iter) Release() error {
	if s.it == nil {
		return nil
	}
	if !s.first && !s.done && s.err == nil {
		// Positioned on a record whose key and envelope alias the
		// iterator's memory.
		s.held = append(append(s.held[:0], s.key...), s.env...)
		s.key, s.env = s.held[:len(s.key):len(s.key)], s.held[len(s.key):]
		var err error
		if s.rec, err = record.Decode(s.env); err != nil {
			s.err = fmt.Errorf("scan store: key %q: %w", s.key, err)
		}
	}
	s.released = !s.done && s.err == nil
	if err := s.closeIt(); err != nil {
		return fmt.Errorf("release store iterator: %w", err)
	}
	return nil
}

// closeIt closes the Pebble iterator, if one is open.
func (s *Iter) closeIt() error {
	if s.it == nil {
		return nil
	}
	err := s.it.Close()
	s.it = nil
	s.s.iters.Add(-1)
	return err
}

// Key is the current record's key.
func (s *Iter) Key() []byte { return s.key }

// Envelope is the current record's encoded envelope (package record).
func (s *Iter) Envelope() []byte { return s.env }

// Record is the decoded envelope; its Value aliases Envelope.
func (s *Iter) Record() record.Record { return s.rec }

// Err is the error that ended the iteration, if any.
func (s *Iter) Err() error { return s.err }

// Close releases the snapshot; it is safe to call twice, and after
// Release.
func (s *Iter) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	s.released = false
	if err := s.closeIt(); err != nil {
		return fmt.Errorf("close store iterator: %w", err)
	}
	return nil
}

// RangeIters is the number of Iters holding a Pebble iterator: made by
// NewIter, and neither at their end, released nor closed. Each pins the memtables and
// sstables of its snapshot.
func (s *Store) RangeIters() int64 { return s.iters.Load() }

// HasData reports whether any key was ever written (tombstones count).
func (s *Store) HasData() (bool, error) {
	it, err := s.NewIter(nil, nil)
	if err != nil {
		return false, err
	}
	found := it.Next()
	if err := it.Close(); err != nil {
		return false, err
	}
	return found, it.Err()
}

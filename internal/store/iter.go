package store

import (
	"bytes"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/dhtkv/dhtkv/internal/record"
)

// Iter walks the store's records in increasing key order, tombstones
// included. It reads a consistent snapshot of the store as of NewIter and
// holds that snapshot's memtables and sstables until Close, so it must
// always be closed, and not kept open longer than needed: a stalled Iter
// pins memory that writes have since replaced.
//
// Key, Envelope and Record alias Pebble's memory and are valid until the
// next call to Next or Close; nothing is copied per record.
type Iter struct {
	it    *pebble.Iterator
	key   []byte
	env   []byte
	rec   record.Record
	err   error
	first bool
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
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return nil, fmt.Errorf("new iterator in %s: %w", s.dir, err)
	}
	return &Iter{it: it, first: true}, nil
}

// Next advances to the next record; false at the end or on an error (Err).
func (s *Iter) Next() bool {
	if s.it == nil || s.err != nil {
		return false
	}
	var ok bool
	if s.first {
		ok, s.first = s.it.First(), false
	} else {
		ok = s.it.Next()
	}
	if !ok {
		if err := s.it.Error(); err != nil {
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

// Key is the current record's key.
func (s *Iter) Key() []byte { return s.key }

// Envelope is the current record's encoded envelope (package record).
func (s *Iter) Envelope() []byte { return s.env }

// Record is the decoded envelope; its Value aliases Envelope.
func (s *Iter) Record() record.Record { return s.rec }

// Err is the error that ended the iteration, if any.
func (s *Iter) Err() error { return s.err }

// Close releases the snapshot; it is safe to call twice.
func (s *Iter) Close() error {
	if s.it == nil {
		return nil
	}
	err := s.it.Close()
	s.it = nil
	if err != nil {
		return fmt.Errorf("close store iterator: %w", err)
	}
	return nil
}

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

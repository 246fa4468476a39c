package scan

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/store"
)

// Iterator is a stream of records in strictly increasing key order,
// tombstones included. Key, Envelope and Record alias the iterator's memory
// and are valid until the next call to Next; nothing is copied per record,
// which is what keeps a scan's memory independent of its size.
type Iterator interface {
	// Next advances; false at the end or on an error (see Err).
	Next() bool
	Key() []byte
	// Envelope is the record's encoded envelope (package record).
	Envelope() []byte
	// Record is the decoded envelope; its Value aliases Envelope.
	Record() record.Record
	Err() error
	// Close releases the iterator's resources; safe to call twice.
	Close() error
}

// storeIter reads the local Pebble store.
type storeIter struct {
	it    *pebble.Iterator
	key   []byte
	env   []byte
	rec   record.Record
	err   error
	first bool
}

// NewStoreIterator iterates st's records with start <= key < end (end nil:
// to the last key). Pebble gives it a consistent snapshot of the store as
// of this call; it holds that snapshot's memtables and sstables until Close,
// so it must always be closed.
func NewStoreIterator(st *store.Store, start, end []byte) (Iterator, error) {
	it, err := st.NewIter(start, end)
	if err != nil {
		return nil, fmt.Errorf("scan local store: %w", err)
	}
	return &storeIter{it: it, first: true}, nil
}

func (s *storeIter) Next() bool {
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
			s.err = fmt.Errorf("scan local store: %w", err)
		}
		return false
	}
	s.key = store.UserKey(s.it.Key())
	if s.key == nil {
		// The bounds keep the iterator inside the data prefix.
		s.err = fmt.Errorf("scan local store: non-data key %q inside the bounds", s.it.Key())
		return false
	}
	env, err := s.it.ValueAndErr()
	if err != nil {
		s.err = fmt.Errorf("scan local store: value of %q: %w", s.key, err)
		return false
	}
	if s.rec, err = record.Decode(env); err != nil {
		s.err = fmt.Errorf("scan local store: key %q: %w", s.key, err)
		return false
	}
	s.env = env
	return true
}

func (s *storeIter) Key() []byte           { return s.key }
func (s *storeIter) Envelope() []byte      { return s.env }
func (s *storeIter) Record() record.Record { return s.rec }
func (s *storeIter) Err() error            { return s.err }

func (s *storeIter) Close() error {
	if s.it == nil {
		return nil
	}
	err := s.it.Close()
	s.it = nil
	if err != nil {
		return fmt.Errorf("close local scan: %w", err)
	}
	return nil
}

// DecoderIterator adapts a binary-framed stream whose values are record
// envelopes (the internal endpoint's) to an Iterator. It checks what the
// merge relies on: envelopes decode and keys strictly increase. closer, if
// not nil, is closed by Close (the HTTP body).
type DecoderIterator struct {
	d      *Decoder
	closer interface{ Close() error }
	name   string
	prev   []byte
	rec    record.Record
	err    error
}

// NewDecoderIterator wraps d; name identifies the source in errors.
func NewDecoderIterator(d *Decoder, closer interface{ Close() error }, name string) *DecoderIterator {
	return &DecoderIterator{d: d, closer: closer, name: name}
}

func (it *DecoderIterator) Next() bool {
	if it.err != nil {
		return false
	}
	if it.d.Count() > 0 {
		// Keep the previous key for the order check; the decoder reuses
		// its buffer.
		it.prev = append(it.prev[:0], it.d.Key()...)
	}
	if !it.d.Next() {
		if err := it.d.Err(); err != nil {
			it.err = fmt.Errorf("scan stream from %s: %w", it.name, err)
		}
		return false
	}
	if it.d.Count() > 1 && bytes.Compare(it.d.Key(), it.prev) <= 0 {
		it.err = fmt.Errorf("scan stream from %s: key %q after %q: %w", it.name, it.d.Key(), it.prev, errOrder)
		return false
	}
	rec, err := record.Decode(it.d.Value())
	if err != nil {
		it.err = fmt.Errorf("scan stream from %s: key %q: %w", it.name, it.d.Key(), err)
		return false
	}
	it.rec = rec
	return true
}

var errOrder = errors.New("keys out of order")

func (it *DecoderIterator) Key() []byte           { return it.d.Key() }
func (it *DecoderIterator) Envelope() []byte      { return it.d.Value() }
func (it *DecoderIterator) Record() record.Record { return it.rec }
func (it *DecoderIterator) Err() error            { return it.err }

func (it *DecoderIterator) Close() error {
	if it.closer == nil {
		return nil
	}
	err := it.closer.Close()
	it.closer = nil
	return err
}

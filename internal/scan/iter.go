package scan

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/dhtkv/dhtkv/internal/record"
)

// Iterator is a stream of records in strictly increasing key order,
// tombstones included: a node's store (*store.Iter), another node's stream
// (DecoderIterator) or their merge (Merge). Key, Envelope and Record alias the iterator's memory
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

// Releaser is an Iterator that can give back what it pins while its
// consumer waits, without losing its position: store.Iter gives back its
// Pebble snapshot, and a Merge what its sources can. Key, Envelope and
// Record stay valid across Release, and the next Next continues after the
// current key, from a newer view of the source (store.Iter says which).
// Release is not safe to call concurrently with the iterator's other
// methods, and is a no-op on an iterator with nothing to give back.
type Releaser interface {
	Release() error
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

package store

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/dhtkv/dhtkv/internal/record"
)

// Hints are writes this node owes another replica: a replicated write
// that failed or timed out on that replica is kept here until it can be
// delivered (package handoff). They live in the same Pebble
// under their own prefix, so a hint is as durable as the write it copies
// and costs no second database:
//
//	'h' | target node (1 byte) | version (8 bytes, big-endian) | user key  →  envelope
//
// Ordering by version within a target gives replay oldest first, and the
// same write hinted twice (a retry, a second round) is one hint.
const hintPrefix = 'h'

// Hint is one write owed to Target.
type Hint struct {
	Target   int
	Key      []byte
	Envelope []byte
}

// Version is the version of the hinted record.
func (h *Hint) Version() uint64 { v, _ := record.PeekVersion(h.Envelope); return v }

// Size is what the hint costs on disk, roughly: key, envelope and framing.
func (h *Hint) Size() int { return len(h.Key) + len(h.Envelope) + 10 }

func hintKey(target int, version uint64, key []byte) []byte {
	k := make([]byte, 0, 10+len(key))
	k = append(k, hintPrefix, byte(target))
	k = binary.BigEndian.AppendUint64(k, version)
	return append(k, key...)
}

// AddHint stores h durably (synced like the writes it copies; concurrent
// commits share an fsync in Pebble's commit pipeline).
func (s *Store) AddHint(h Hint) error {
	v, ok := record.PeekVersion(h.Envelope)
	if !ok || h.Target < 0 || h.Target > 255 {
		return fmt.Errorf("add hint for node %d: %w", h.Target, record.ErrCorrupt)
	}
	if err := s.admit(h.Size()); err != nil {
		return fmt.Errorf("add hint for node %d: %w", h.Target, err)
	}
	if err := s.write(func() error { return s.db.Set(hintKey(h.Target, v, h.Key), h.Envelope, s.writeOpt) }); err != nil {
		return fmt.Errorf("add hint for node %d: %w", h.Target, err)
	}
	return nil
}

// HasHint reports whether h is stored: the same write hinted for the same
// target (its version and key) is one hint.
func (s *Store) HasHint(h Hint) (bool, error) {
	v, ok := record.PeekVersion(h.Envelope)
	if !ok || h.Target < 0 || h.Target > 255 {
		return false, fmt.Errorf("has hint for node %d: %w", h.Target, record.ErrCorrupt)
	}
	_, closer, err := s.db.Get(hintKey(h.Target, v, h.Key))
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("has hint for node %d: %w", h.Target, err)
	}
	return true, closer.Close()
}

// Hints calls fn with target's hints, oldest first, until fn returns false.
// after, if not nil, is a hint fn saw before: the walk starts past it, so
// a caller going through a backlog in slices does not step again over the
// hints it already handled (deleted hints are tombstones a walk from the
// start would pass every time). The hint's slices are copies: fn may keep
// them.
func (s *Store) Hints(target int, after *Hint, fn func(Hint) bool) error {
	lower := []byte{hintPrefix, byte(target)}
	if after != nil {
		lower = append(hintKey(target, after.Version(), after.Key), 0)
	}
	upper := []byte{hintPrefix, byte(target) + 1}
	if target == 255 {
		upper = []byte{hintPrefix + 1}
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return fmt.Errorf("hints for node %d: %w", target, err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		if len(k) < 10 {
			it.Close()
			return fmt.Errorf("hints for node %d: %w: key %q", target, record.ErrCorrupt, k)
		}
		v, err := it.ValueAndErr()
		if err != nil {
			it.Close()
			return fmt.Errorf("hints for node %d: %w", target, err)
		}
		h := Hint{Target: target, Key: append([]byte(nil), k[10:]...), Envelope: append([]byte(nil), v...)}
		if !fn(h) {
			break
		}
	}
	return errors.Join(it.Error(), it.Close())
}

// HintBytes returns, for every target with hints, the sum of their Size.
// It reads every hint: call it once, at start-up.
func (s *Store) HintBytes() (map[int]int64, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{hintPrefix}, UpperBound: []byte{hintPrefix + 1}})
	if err != nil {
		return nil, fmt.Errorf("count hints: %w", err)
	}
	out := map[int]int64{}
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		if len(k) < 10 {
			continue
		}
		h := Hint{Key: k[10:], Envelope: it.Value()}
		out[int(k[1])] += int64(h.Size())
	}
	return out, errors.Join(it.Error(), it.Close())
}

// DeleteHints removes delivered or dropped hints in one commit.
func (s *Store) DeleteHints(hs []Hint) error {
	if len(hs) == 0 {
		return nil
	}
	b := s.db.NewBatch()
	defer b.Close()
	for _, h := range hs {
		if err := b.Delete(hintKey(h.Target, h.Version(), h.Key), nil); err != nil {
			return fmt.Errorf("delete hints: %w", err)
		}
	}
	if err := s.write(func() error { return s.db.Apply(b, s.writeOpt) }); err != nil {
		return fmt.Errorf("delete %d hints: %w", len(hs), err)
	}
	return nil
}

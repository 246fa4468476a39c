package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"

	"github.com/dhtkv/dhtkv/internal/partition"
)

// Garbage collection
//
// A tombstone, or a value past its expiry, can be removed once every
// replica has it (package gc decides when); until then
// it must stay, or a replica that missed the delete would bring the value
// back. This file does the removal safely against concurrent writes, and
// keeps the horizon: the version below which this store refuses every
// write from then on (ApplyBatch drops it), so that a write older than a
// collected delete, arriving late (a hint, a straggler), cannot resurrect
// the key either. The horizon only rises, and is persisted with the
// deletions it covers, in one batch.
//
// Interleaving with writes: Collect deletes a candidate only if its data
// key still holds the version the candidate names, and commits the
// deletions while it holds gcState.mu exclusively; writers hold mu shared
// for their whole commit, and count themselves in their partitions'
// gcState.writes before it. Collect reads the candidates' versions without
// the lock (a batch of cold records takes milliseconds, and every write of
// the node would wait), between two moments it holds the lock: at the
// first it notes the partitions' counts (no writer is then between its
// count and its commit), at the second it reads again, under the lock,
// the candidates of every partition whose count moved. So a write either
// committed before Collect's read of the key (the version differs, nothing
// is deleted), or counted itself after the first moment (the key is read
// again under the lock), or commits after the deletion and the new horizon
// (and is dropped if it is below it). A Pebble Delete removes every
// earlier merge operand of the key, which is why a write must never commit
// between the read that decides and the delete.

// gcKey holds the horizon, 8 bytes big-endian.
const gcKey = "\x00gc"

type gcState struct {
	mu      sync.RWMutex
	horizon atomic.Uint64
	// writes counts, per partition, the writes of ApplyBatch, each before
	// its commit under mu shared.
	writes [partition.Count]atomic.Uint64
	// read is a test's hook, called between Collect's unlocked reads and
	// its locked check (nil: none).
	read func()
}

func (s *Store) loadHorizon() error {
	v, closer, err := s.db.Get([]byte(gcKey))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read gc horizon in %s: %w", s.dir, err)
	}
	defer closer.Close()
	if len(v) != 8 {
		return fmt.Errorf("read gc horizon in %s: %d bytes, want 8", s.dir, len(v))
	}
	s.gc.horizon.Store(binary.BigEndian.Uint64(v))
	return nil
}

// Horizon is the version below which writes are dropped (0: none
// collected yet).
func (s *Store) Horizon() uint64 { return s.gc.horizon.Load() }

// Candidate is a record garbage collection may remove: the key, and the
// version it held when found.
type Candidate struct {
	Key     []byte
	Version uint64
}

// Candidates calls fn for every key of partition part whose index entry
// says its record may be collected before collectBefore (Unix ms) and
// arrived here before arrivedBefore (Unix ms), and returns how many index
// entries it read (the partition's, on success: the scan's cost). key is
// valid only during the call.
func (s *Store) Candidates(part partition.ID, collectBefore, arrivedBefore uint64, fn func(key []byte, e IndexEntry) error) (read int, err error) {
	err = s.SegmentEntries(part, -1, func(_ uint8, key []byte, e IndexEntry) error {
		read++
		if e.Collect == 0 || e.Collect >= collectBefore || e.Arrived >= arrivedBefore {
			return nil
		}
		return fn(key, e)
	})
	return read, err
}

// Collect removes each candidate's record and index entry if the key
// still holds the candidate's version, and raises the horizon to horizon
// (never lowers it): from then on, writes below it are dropped. Every
// candidate's version must be below horizon. It returns the keys removed.
func (s *Store) Collect(cands []Candidate, horizon uint64) (removed [][]byte, err error) {
	for _, c := range cands {
		if c.Version >= horizon {
			return nil, fmt.Errorf("collect %q: version %d is not below the horizon %d", c.Key, c.Version, horizon)
		}
	}
	// The partitions' write counts while no writer is between its count
	// and its commit; then the versions, unlocked (see above).
	counts := map[partition.ID]uint64{}
	s.gc.mu.Lock()
	for _, c := range cands {
		part, _ := partition.Of(c.Key)
		counts[part] = s.gc.writes[part].Load()
	}
	s.gc.mu.Unlock()
	held := make([]bool, len(cands))
	for i, c := range cands {
		v, found, err := s.Version(c.Key)
		if err != nil {
			return nil, err
		}
		held[i] = found && v == c.Version
	}
	if s.gc.read != nil {
		s.gc.read()
	}

	s.gc.mu.Lock()
	defer s.gc.mu.Unlock()
	b := s.db.NewBatch()
	defer b.Close()
	var parts []partition.ID
	for i, c := range cands {
		if !held[i] {
			continue // written since it was found
		}
		if part, _ := partition.Of(c.Key); s.gc.writes[part].Load() != counts[part] {
			// Its partition was written since: read it again, locked.
			v, found, err := s.Version(c.Key)
			if err != nil {
				return nil, err
			}
			if !found || v != c.Version {
				continue
			}
		}
		dk := append([]byte{dataPrefix}, c.Key...)
		if err := b.Delete(dk, nil); err != nil {
			return nil, fmt.Errorf("collect %q: %w", c.Key, err)
		}
		part, seg := partition.Of(c.Key)
		ik := make([]byte, indexKeyLen(c.Key))
		putIndexKey(ik, part, seg, c.Key)
		if err := b.Delete(ik, nil); err != nil {
			return nil, fmt.Errorf("collect %q: %w", c.Key, err)
		}
		removed = append(removed, c.Key)
		parts = append(parts, part)
	}
	if horizon > s.gc.horizon.Load() {
		if err := b.Set([]byte(gcKey), binary.BigEndian.AppendUint64(nil, horizon), nil); err != nil {
			return nil, fmt.Errorf("collect: %w", err)
		}
	}
	if b.Empty() {
		return nil, nil
	}
	if err := s.write(func() error { return s.db.Apply(b, pebble.Sync) }); err != nil {
		return nil, fmt.Errorf("collect %d records in %s: %w", len(removed), s.dir, err)
	}
	if horizon > s.gc.horizon.Load() {
		s.gc.horizon.Store(horizon)
	}
	for _, p := range parts {
		s.summary.touch(p)
	}
	return removed, nil
}

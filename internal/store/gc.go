package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/dhtkv/dhtkv/internal/partition"
)

// Garbage collection
//
// A tombstone, or a value past its expiry, can be removed once every
// replica has it (package gc decides when); until then
// it must stay, or a replica that missed the delete would bring the value
// back. This file does the removal safely against concurrent writes, and
// keeps each partition's horizon: the version below which this store
// refuses a write of a key of that partition that it holds nothing of
// (ApplyBatch drops it), so that a write older than a collected delete,
// arriving late (a hint, a straggler), cannot resurrect the key either.
// A horizon only rises while the node holds its partition, and is
// persisted with the deletions it covers, in one batch.
//
// Why a horizon per partition, and only for keys held nothing of: a
// horizon says that deletes older than it may have been removed here, and
// that is true only of the partitions whose records were removed here,
// and of the keys that hold nothing now. One horizon for the whole store
// made a node that had collected in one partition refuse every older
// record of the others: the live records a membership change streamed to
// it for a partition it gained (the change ended with the key on fewer
// replicas than the replication factor, which anti-entropy never
// repaired, as the refusal reads as "holds newer"), and the tombstone of
// a delete it had missed while cut off, which its peer then counted
// delivered and collected (the value came back). A key that holds a
// record older than the write is not one whose delete was collected here
// (a collection removes the key; whatever was stored after it was at or
// above the horizon of that moment), so the write is newer than
// everything the key had: last-write-wins applies as above the horizon.
// When a membership change that took a partition away ends, its horizon
// goes back to 0 (ResetHorizons): no write of it is routed here any more,
// its records are being dropped, and should the node gain it again, the
// copy brings every record the replicas hold, old ones included, as to a
// node that never held it (with the horizon kept, the copy's records of
// the keys already dropped would have been refused).
//
// Interleaving with writes: Collect deletes a candidate only if its data
// key still holds the version found, and commits the deletions while it
// holds gcState.mu exclusively; writers hold mu shared for their whole
// commit, and count themselves in their partitions' gcState.writes before
// it. Collect reads the candidates' versions without the lock (a batch of
// cold records takes milliseconds, and every write of the node would
// wait), between two moments it holds the lock: at the first it notes the
// partitions' counts (no writer is then between its count and its
// commit), at the second it reads again, under the lock, the candidates
// of every partition whose count moved. So a write either committed
// before Collect's read of the key (the version differs, nothing is
// deleted), or counted itself after the first moment (the key is read
// again under the lock), or commits after the deletion and the new
// horizon (and is dropped if it is below it and the key holds nothing).
// A Pebble Delete removes every earlier merge operand of the key, which
// is why a write must never commit between the read that decides and the
// delete.

// horizonPrefix starts each partition's horizon key (the prefix and the
// partition, 2 bytes big-endian), whose value is the horizon, 8 bytes
// big-endian; absent: 0. legacyHorizonKey held the one horizon of the
// whole store of earlier releases (migrateHorizon).
const (
	horizonPrefix    = "\x00gcp"
	horizonUpper     = "\x00gcq"
	legacyHorizonKey = "\x00gc"
)

func horizonKey(part partition.ID) []byte {
	return binary.BigEndian.AppendUint16([]byte(horizonPrefix), uint16(part))
}

type gcState struct {
	mu sync.RWMutex
	// horizons holds each partition's horizon; highest is the highest of
	// them (a metric's).
	horizons [partition.Count]atomic.Uint64
	highest  atomic.Uint64
	// writes counts, per partition, the writes of ApplyBatch, each before
	// its commit under mu shared.
	writes [partition.Count]atomic.Uint64
	// stuck is set once an exclusive taker waited closeWait for mu on a
	// failed store in vain: a holder is parked inside Pebble (lockGC).
	stuck atomic.Bool
	// read is a test's hook, called between Collect's unlocked reads and
	// its locked check (nil: none).
	read func()
}

// setHorizon records part's horizon in memory (persisted by the caller).
func (g *gcState) setHorizon(part partition.ID, h uint64) {
	g.horizons[part].Store(h)
	for {
		top := g.highest.Load()
		if h <= top || g.highest.CompareAndSwap(top, h) {
			return
		}
	}
}

// loadHorizons reads every partition's horizon, then migrates an earlier
// release's one horizon (migrateHorizon).
func (s *Store) loadHorizons() error {
	it, err := s.db.NewIter(&pebble.IterOptions{
		LowerBound: []byte(horizonPrefix),
		UpperBound: []byte(horizonUpper),
	})
	if err != nil {
		return fmt.Errorf("read gc horizons in %s: %w", s.dir, err)
	}
	for it.First(); it.Valid(); it.Next() {
		k, v := it.Key(), it.Value()
		if len(k) != len(horizonPrefix)+2 || len(v) != 8 {
			it.Close()
			return fmt.Errorf("read gc horizons in %s: key %q holds %d bytes", s.dir, k, len(v))
		}
		part := binary.BigEndian.Uint16(k[len(horizonPrefix):])
		if int(part) >= partition.Count {
			it.Close()
			return fmt.Errorf("read gc horizons in %s: partition %d", s.dir, part)
		}
		s.gc.setHorizon(partition.ID(part), binary.BigEndian.Uint64(v))
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("read gc horizons in %s: %w", s.dir, err)
	}
	return s.migrateHorizon()
}

// migrateHorizon turns an earlier release's one horizon into the horizon
// of every partition this store holds records of, and removes it: a
// partition it holds nothing of was never collected here, or was dropped
// (and its horizon with it, had it had one of its own).
func (s *Store) migrateHorizon() error {
	v, closer, err := s.db.Get([]byte(legacyHorizonKey))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read gc horizon in %s: %w", s.dir, err)
	}
	if len(v) != 8 {
		closer.Close()
		return fmt.Errorf("read gc horizon in %s: %d bytes, want 8", s.dir, len(v))
	}
	h := binary.BigEndian.Uint64(v)
	closer.Close()
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{indexPrefix}, UpperBound: []byte{indexPrefix + 1}})
	if err != nil {
		return fmt.Errorf("migrate gc horizon in %s: %w", s.dir, err)
	}
	b := s.db.NewBatch()
	defer b.Close()
	var held []partition.ID
	for p := range partition.Count {
		part := partition.ID(p)
		if !it.SeekGE([]byte{indexPrefix, byte(part >> 8), byte(part)}) {
			break
		}
		if k := it.Key(); len(k) < 3 || binary.BigEndian.Uint16(k[1:3]) != uint16(part) || h <= s.gc.horizons[part].Load() {
			continue
		}
		held = append(held, part)
		if err := b.Set(horizonKey(part), binary.BigEndian.AppendUint64(nil, h), nil); err != nil {
			it.Close()
			return fmt.Errorf("migrate gc horizon: %w", err)
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("migrate gc horizon in %s: %w", s.dir, err)
	}
	if err := b.Delete([]byte(legacyHorizonKey), nil); err != nil {
		return fmt.Errorf("migrate gc horizon: %w", err)
	}
	if err := s.write(func() error { return s.db.Apply(b, pebble.Sync) }); err != nil {
		return fmt.Errorf("migrate gc horizon in %s: %w", s.dir, err)
	}
	for _, part := range held {
		s.gc.setHorizon(part, h)
	}
	return nil
}

// Horizon is partition part's horizon: the version below which a write
// of one of its keys that holds nothing is dropped (0: none collected
// since the node holds the partition).
func (s *Store) Horizon(part partition.ID) uint64 { return s.gc.horizons[part].Load() }

// HighestHorizon is the highest partition's horizon (0: none).
func (s *Store) HighestHorizon() uint64 { return s.gc.highest.Load() }

// belowHorizon reports whether a write of version v of key, of partition
// part, is dropped: v is below the partition's horizon and the key holds
// nothing, or something at least as new (see above).
func (s *Store) belowHorizon(key []byte, part partition.ID, v uint64) (bool, error) {
	if v >= s.gc.horizons[part].Load() {
		return false, nil
	}
	cur, found, err := s.Version(key)
	if err != nil {
		return false, err
	}
	return !found || cur > v, nil
}

// ResetHorizons puts back to 0 the horizon of every partition for which
// gone reports true: partitions this node no longer holds (package
// membership, as a change that took them away ends). Should the node
// gain one again, the copy brings every record its replicas hold, old
// ones included, as to a node that never held it (see above).
func (s *Store) ResetHorizons(gone func(partition.ID) bool) error {
	if err := s.lockGC(); err != nil {
		return fmt.Errorf("reset gc horizons: %w", err)
	}
	defer s.gc.mu.Unlock()
	b := s.db.NewBatch()
	defer b.Close()
	var reset []partition.ID
	for p := range partition.Count {
		part := partition.ID(p)
		if s.gc.horizons[part].Load() == 0 || !gone(part) {
			continue
		}
		if err := b.Delete(horizonKey(part), nil); err != nil {
			return fmt.Errorf("reset gc horizons: %w", err)
		}
		reset = append(reset, part)
	}
	if len(reset) == 0 {
		return nil
	}
	if err := s.write(func() error { return s.db.Apply(b, pebble.Sync) }); err != nil {
		return fmt.Errorf("reset the gc horizons of %d partitions in %s: %w", len(reset), s.dir, err)
	}
	for _, part := range reset {
		s.gc.horizons[part].Store(0)
	}
	var top uint64
	for i := range s.gc.horizons {
		top = max(top, s.gc.horizons[i].Load())
	}
	s.gc.highest.Store(top)
	return nil
}

// ErrCollectWithdrawn is Collect's error when its still reported false:
// nothing was removed.
var ErrCollectWithdrawn = errors.New("collection withdrawn: what it was decided on changed")

// AwaitCommits returns once every write that took its arrival time
// before the call (the index entry's Arrived, ApplyBatch) has committed or
// failed, and every Collect under way has committed or withdrawn. Writers take their arrival time and commit under gcState.mu
// shared; this takes it exclusively, for an instant. An anti-entropy
// exchange calls it once it noted its start, before it hashes anything:
// garbage collection counts the exchange for every record that arrived
// before that start (package gc's rule 1), and a record whose commit was
// still in flight (a slow fsync) would be missing from the hashes the
// exchange compared. Package membership calls it once a new cluster map
// is installed: no removal decided under the old map commits after it
// (Collect's still).
//
// On a failed store it waits at most closeWait, once, for a write stalled
// inside Pebble, which never returns (lockGC).
func (s *Store) AwaitCommits() {
	if s.lockGC() == nil {
		s.gc.mu.Unlock()
	}
}

// lockGC takes gcState.mu exclusively, or returns the store's failure
// without it once the store failed and the lock did not come: a write
// stalled inside Pebble when Pebble parked on a failed MANIFEST write
// (health.go's Fatalf) holds its share for good, and every exclusive
// taker would wait with it (an exchange's start, a collection, the node's
// stop behind them). Not every failure parks Pebble, though: after an
// sstable's EIO (fileError, backgroundError) the commits already past
// Store.write's check complete, and a taker that returned at once would
// let them finish after it (AwaitCommits' promise). So on a failed store
// it waits for the lock as long as Close waits for Pebble (closeWait),
// once: a wait that timed out marks the lock held for good (gcState.stuck),
// and later calls only try it. Only a contended call on a store that has
// not failed costs a goroutine, which waits for the lock for good only if
// the store fails meanwhile and the lock never comes.
func (s *Store) lockGC() error {
	if s.gc.mu.TryLock() {
		return nil
	}
	if s.Failure() != nil {
		return s.lockFailed()
	}
	got := make(chan struct{})
	go func() {
		s.gc.mu.Lock()
		close(got)
	}()
	select {
	case <-got:
		return nil
	case <-s.health.failedCh:
	}
	if !s.gc.stuck.Load() {
		t := time.NewTimer(s.closeWait)
		defer t.Stop()
		select {
		case <-got:
			return nil
		case <-t.C:
			s.gc.stuck.Store(true)
		}
	}
	// Should the lock come after all, it is released at once.
	go func() {
		<-got
		s.gc.mu.Unlock()
	}()
	return s.Failure()
}

// lockFailed is lockGC on a failed store, with no goroutine: no write is
// admitted any more, so the lock's holders leave unless parked inside
// Pebble; it tries the lock for up to closeWait, unless a wait timed out
// before.
func (s *Store) lockFailed() error {
	deadline := time.Now().Add(s.closeWait)
	for !s.gc.stuck.Load() {
		if s.gc.mu.TryLock() {
			return nil
		}
		if time.Now().After(deadline) {
			s.gc.stuck.Store(true)
			break
		}
		time.Sleep(time.Millisecond)
	}
	return s.Failure()
}

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
// still holds the candidate's version, and raises the horizon of each
// partition it removed a record of to horizon (never lowers it): from
// then on, writes below it of keys that hold nothing are dropped. Every
// candidate's version must be below horizon. It returns the keys removed.
//
// still, when not nil, is called under the lock that AwaitCommits takes,
// just before the commit: if it reports false (what the caller decided
// on has changed, say the cluster map), Collect removes nothing and
// returns ErrCollectWithdrawn. So a caller that changes what still reads
// and then calls AwaitCommits knows that no removal decided before the
// change commits after AwaitCommits returns.
func (s *Store) Collect(cands []Candidate, horizon uint64, still func() bool) (removed [][]byte, err error) {
	for _, c := range cands {
		if c.Version >= horizon {
			return nil, fmt.Errorf("collect %q: version %d is not below the horizon %d", c.Key, c.Version, horizon)
		}
	}
	// The partitions' write counts while no writer is between its count
	// and its commit; then the versions, unlocked (see above).
	counts := map[partition.ID]uint64{}
	if err := s.lockGC(); err != nil {
		return nil, fmt.Errorf("collect: %w", err)
	}
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

	if err := s.lockGC(); err != nil {
		return nil, fmt.Errorf("collect: %w", err)
	}
	defer s.gc.mu.Unlock()
	if still != nil && !still() {
		return nil, ErrCollectWithdrawn
	}
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
	if b.Empty() {
		return nil, nil
	}
	slices.Sort(parts)
	parts = slices.Compact(parts)
	for _, p := range parts {
		if horizon > s.gc.horizons[p].Load() {
			if err := b.Set(horizonKey(p), binary.BigEndian.AppendUint64(nil, horizon), nil); err != nil {
				return nil, fmt.Errorf("collect: %w", err)
			}
		}
	}
	if err := s.write(func() error { return s.db.Apply(b, pebble.Sync) }); err != nil {
		return nil, fmt.Errorf("collect %d records in %s: %w", len(removed), s.dir, err)
	}
	for _, p := range parts {
		if horizon > s.gc.horizons[p].Load() {
			s.gc.setHorizon(p, horizon)
		}
		s.summary.touch(p)
	}
	return removed, nil
}

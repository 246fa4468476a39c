// Package replica is this node's copy of the data: the Pebble store with the
// read cache in front of it. Both the public API (single node) and the
// cluster coordinator (for the local replica, in-process) go through it, so
// the cache protocol is applied on every path that reads or writes.
package replica

import (
	"context"
	"fmt"

	"github.com/dhtkv/dhtkv/internal/cache"
	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/store"
)

// Replica is safe for concurrent use.
type Replica struct {
	Store *store.Store
	Cache *cache.Cache // nil: no read cache
	// Versions spares most reads of NewerVersion (nil: always read). Every
	// write of this replica goes through Apply or ApplyBatch, which keep
	// it up to date.
	Versions *VersionFilter
	// Clock is this node's clock: ApplyRemote bounds and observes the
	// versions of other nodes' records with it.
	Clock *hlc.Clock
}

// Get returns key's newest record as the cache or the store knows it. The
// record's value is shared and must not be modified. Found is false for a
// key never written; a deleted key is found as a tombstone.
func (r *Replica) Get(key []byte) (cache.Entry, error) {
	e, err := r.Cache.GetOrLoad(key, func(prefix []byte) ([]byte, bool, error) { return r.Store.AppendEnvelope(prefix, key) })
	if err != nil {
		return cache.Entry{}, fmt.Errorf("replica get: %w", err)
	}
	return e, nil
}

// GetUncached is Get for background work: a record the read cache does
// not hold is read from the store and not cached (cache.GetOrRead).
func (r *Replica) GetUncached(key []byte) (cache.Entry, error) {
	e, err := r.Cache.GetOrRead(key, func(prefix []byte) ([]byte, bool, error) { return r.Store.AppendEnvelope(prefix, key) })
	if err != nil {
		return cache.Entry{}, fmt.Errorf("replica get: %w", err)
	}
	return e, nil
}

// Apply stores rec under key (last-write-wins) and invalidates the cache.
// When it returns nil the write is committed and visible to every later Get.
func (r *Replica) Apply(key []byte, rec *record.Record) error {
	if err := r.Store.Apply(key, rec); err != nil {
		return fmt.Errorf("replica apply: %w", err)
	}
	r.Versions.Raise(key, rec.Version)
	r.Cache.Invalidate(key)
	return nil
}

// ApplyBatch is Apply for many writes in one store commit (one fsync).
func (r *Replica) ApplyBatch(ws []store.Write) error {
	if err := r.Store.ApplyBatch(ws); err != nil {
		return fmt.Errorf("replica apply: %w", err)
	}
	for _, w := range ws {
		r.Versions.Raise(w.Key, w.Rec.Version)
		r.Cache.Invalidate(w.Key)
	}
	return nil
}

// NewerVersion returns the version key holds if it is newer than v, and 0
// if it holds v, an older version or nothing. A version below its
// partition's garbage-collection horizon, of a key that holds nothing,
// gets the horizon: it would be dropped, as if the key held something
// newer (it may have, before a collection); of a key that holds an older
// version, it is newer than anything the key had (store's gc.go).
func (r *Replica) NewerVersion(key []byte, v uint64) (uint64, error) {
	part, _ := partition.Of(key)
	h := r.Store.Horizon(part)
	if v >= h && r.Versions.Below(key, v) {
		return 0, nil
	}
	cur, found, err := r.Store.Version(key)
	if err != nil {
		return 0, fmt.Errorf("replica version: %w", err)
	}
	switch {
	case found && cur > v:
		return cur, nil
	case !found && v < h:
		return h, nil
	}
	return 0, nil
}

// Collect removes the candidates' records (store.Collect, still included)
// and drops them from the cache; it returns how many it removed.
func (r *Replica) Collect(cands []store.Candidate, horizon uint64, still func() bool) (int, error) {
	removed, err := r.Store.Collect(cands, horizon, still)
	if err != nil {
		return 0, fmt.Errorf("replica collect: %w", err)
	}
	for _, k := range removed {
		r.Cache.Invalidate(k)
	}
	return len(removed), nil
}

// DropHeld is DropPartition walking the partition once and dropping only
// what arrived before arrivedBefore (Unix ms; store.Store.DropHeld).
func (r *Replica) DropHeld(ctx context.Context, part partition.ID, pace store.Pacer, arrivedBefore uint64) (int, error) {
	return r.drop(func(ctx context.Context, part partition.ID, pace store.Pacer, dropped func([][]byte)) (int, error) {
		return r.Store.DropHeld(ctx, part, pace, dropped, arrivedBefore)
	}, ctx, part, pace)
}

// DropPartition deletes partition part's records here, paced by pace,
// and from the cache batch by batch (see store.Store.DropPartition), and
// returns how many; once ctx ends it returns ctx's error, having dropped
// some.
func (r *Replica) DropPartition(ctx context.Context, part partition.ID, pace store.Pacer) (int, error) {
	return r.drop(r.Store.DropPartition, ctx, part, pace)
}

// drop runs one of the store's drops with the cache invalidated batch by
// batch.
func (r *Replica) drop(fn func(context.Context, partition.ID, store.Pacer, func([][]byte)) (int, error), ctx context.Context, part partition.ID, pace store.Pacer) (int, error) {
	removed, err := fn(ctx, part, pace, func(keys [][]byte) {
		for _, k := range keys {
			r.Cache.Invalidate(k)
		}
	})
	if err != nil {
		return removed, fmt.Errorf("replica drop partition %d: %w", part, err)
	}
	return removed, nil
}

// NewIter returns this replica's records with start <= key < end (end
// nil: to the last key), tombstones included, from a snapshot of the
// store (store.Store.NewIter). The caller must close it.
func (r *Replica) NewIter(start, end []byte) (*store.Iter, error) {
	it, err := r.Store.NewIter(start, end)
	if err != nil {
		return nil, fmt.Errorf("replica scan: %w", err)
	}
	return it, nil
}

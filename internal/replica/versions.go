package replica

import (
	"hash/maphash"
	"sync/atomic"
)

// VersionFilter answers "can key hold a version newer than v?" without
// reading the store, for most keys most of the time.
//
// A replica refuses an internal write older than what it holds (see
// ApplyRemote and cluster.Coordinator.Write), which needs the
// key's current version: a Pebble lookup per replicated write, the largest
// single cost of a replica's write path when the key's block is not in
// Pebble's block cache. The filter is a fixed table of slots, each holding
// the largest version ever applied to any key that hashes to it (and,
// from start-up, the clock's restored bound, above every version stored
// before). So a slot below v proves that the key holds nothing newer than
// v; otherwise (a newer write of this key, or of another key sharing the
// slot) the store is read. A false "maybe" costs one lookup, never a wrong
// answer.
//
// Memory: 8 bytes per slot (DefaultVersionSlots: 8 MiB), whatever the
// number of keys; with many more live keys than slots it simply says
// "maybe" more often.
type VersionFilter struct {
	seed  maphash.Seed
	floor uint64 // every slot is at least this (kept apart: no start-up fill)
	slots []atomic.Uint64
	mask  uint64
}

// DefaultVersionSlots is the slot count of a node's filter.
const DefaultVersionSlots = 1 << 20

// NewVersionFilter returns a filter with n slots (rounded up to a power of
// two) that all start at floor: every version already stored must be at
// most floor (pass the clock's restored bound, or 0 for an empty store).
func NewVersionFilter(n int, floor uint64) *VersionFilter {
	size := 1
	for size < n {
		size <<= 1
	}
	return &VersionFilter{seed: maphash.MakeSeed(), floor: floor, slots: make([]atomic.Uint64, size), mask: uint64(size - 1)}
}

func (f *VersionFilter) slot(key []byte) *atomic.Uint64 {
	return &f.slots[maphash.Bytes(f.seed, key)&f.mask]
}

// Below reports whether every version key may hold is below v. A nil
// filter knows nothing (false).
func (f *VersionFilter) Below(key []byte, v uint64) bool {
	return f != nil && max(f.slot(key).Load(), f.floor) < v
}

// Raise records that key now holds v (or newer). Call it once the write is
// committed, before it is acknowledged.
func (f *VersionFilter) Raise(key []byte, v uint64) {
	if f == nil {
		return
	}
	s := f.slot(key)
	for {
		cur := s.Load()
		if cur >= v || s.CompareAndSwap(cur, v) {
			return
		}
	}
}

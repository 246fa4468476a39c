package main

import (
	"bytes"
	"hash/maphash"
	"sync"
)

// shardCount spreads keys over enough locks that two connections rarely
// wait for each other; a power of two, so a shard is picked with a mask.
const shardCount = 256

// shard is one lock and the keys that hash to it. The padding keeps two
// shards' locks off one cache line, so that writers on neighbouring shards
// do not slow each other down through false sharing.
type shard struct {
	mu   sync.RWMutex
	vals map[string][]byte
	_    [32]byte
}

// memStore is a map from key to value split into shards, each behind its
// own read-write lock: the least a concurrent key-value server must do.
type memStore struct {
	seed   maphash.Seed
	shards []shard
}

func newMemStore() *memStore {
	s := &memStore{seed: maphash.MakeSeed(), shards: make([]shard, shardCount)}
	for i := range s.shards {
		s.shards[i].vals = make(map[string][]byte)
	}
	return s
}

func (s *memStore) shardOf(key []byte) *shard {
	return &s.shards[maphash.Bytes(s.seed, key)&(shardCount-1)]
}

// load returns the value of key. The slice is shared with the store and
// replaced, never modified, by a later store: callers may read it after the
// lock is released but must not write to it.
func (s *memStore) load(key []byte) ([]byte, bool) {
	sh := s.shardOf(key)
	sh.mu.RLock()
	v, ok := sh.vals[string(key)] // the compiler does not allocate for this conversion
	sh.mu.RUnlock()
	return v, ok
}

// store sets key to a copy of val: fasthttp reuses the request's buffers
// once the handler returns.
func (s *memStore) store(key, val []byte) {
	v := bytes.Clone(val)
	if v == nil {
		v = []byte{}
	}
	k := string(key)
	sh := s.shardOf(key)
	sh.mu.Lock()
	sh.vals[k] = v
	sh.mu.Unlock()
}

// remove deletes key; removing a missing key is not an error, as in dhtkv.
func (s *memStore) remove(key []byte) {
	sh := s.shardOf(key)
	sh.mu.Lock()
	delete(sh.vals, string(key))
	sh.mu.Unlock()
}

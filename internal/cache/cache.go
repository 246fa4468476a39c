// Package cache is the read cache in front of the store: a ristretto v2 cache
// of records, bounded by the bytes it holds, plus the locking protocol that
// keeps it from ever serving a value older than an acknowledged write.
//
// # Why a protocol is needed
//
// ristretto's Set of a key that is not yet cached is asynchronous: it is
// queued (and may be dropped when the queue is full), then admitted or
// rejected by the TinyLFU policy on a background goroutine. Only then does the
// item become visible. Del, in contrast, removes the item at once and queues a
// delete behind any queued Set, so it is never lost. Two races follow from
// plain cache-aside (fill on miss, Del on write):
//
//  1. The classic one. Reader R misses, reads v1 from Pebble; writer W
//     commits v2 and Dels (nothing cached yet); R Sets v1. The cache now
//     serves v1 after W was acknowledged.
//  2. The ristretto one. R Sets v1 (queued, not visible); W commits v2 and
//     Dels: the map holds nothing yet, so only a queued delete is left
//     behind R's queued Set. When the policy goroutine runs, v1 becomes
//     visible and stays visible until the queued delete is processed: a
//     read that began after W's acknowledgement can return v1.
//
// # The protocol
//
// Keys hash onto a fixed set of mutex stripes.
//
//   - A fill (GetOrLoad on a miss) holds its key's stripe while it re-checks the cache,
//     reads the store, Sets the record and Waits for ristretto to process
//     the Set. When it unlocks, its item is either visible in the map or
//     gone for good (dropped or rejected): nothing of it is still queued.
//   - A write commits to the store first, then calls Invalidate, which
//     takes the stripe and Dels the key (if the map holds it: nothing of
//     this key can be queued then, see Invalidate), and only then is
//     acknowledged.
//
// Interleavings of one fill F and one write W of the same key:
//
//   - F takes the stripe after W's Invalidate: F reads the store after W's
//     commit and caches v2 (or newer). Correct.
//   - F holds the stripe when W's commit lands: W's Invalidate waits for
//     F to unlock. By then F's v1 is in the map (or not at all), so W's Del
//     removes it synchronously, before W is acknowledged. Correct.
//   - F finishes before W commits: same as above, W's Del removes v1.
//
// So after a write is acknowledged no fill that read an older state can
// leave an entry behind, and no queued Set can surface later. Cache hits take
// no lock; fills of one key are serialized by the stripe, so a burst of
// misses on a hot key reads the store once.
//
// Entries are immutable once cached and own their memory: keys and values are
// copied before they go in, because Pebble and fasthttp reuse their buffers.
// An entry is one buffer holding the key and the record (see Loader). Nothing
// may write into it once cached, not even after it is evicted: GET answers
// of large values reference it while they are sent (httpapi's setValue),
// and ristretto only drops its reference on eviction, never reuses it.
//
// The linearizability test in internal/httpapi checks this end to end; it
// fails when Invalidate is skipped (see its comment).
package cache

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"

	"github.com/dgraph-io/ristretto/v2"

	"github.com/dhtkv/dhtkv/internal/record"
)

// nStripes is a power of two large enough that 64+ concurrent requests rarely
// share a stripe, small enough to be a few KiB.
const nStripes = 1024

// entryOverhead approximates the bytes an entry costs beyond its buffer
// (ristretto's map slot and policy bookkeeping).
const entryOverhead = 64

// Entry is a record as the cache knows it. Found is false for a key the
// store has never seen; such negative entries are cached too, like
// tombstones, so repeated GETs of absent or deleted keys do not reach
// Pebble. Rec.Value of a cached entry is the cache's memory: read-only.
type Entry struct {
	Rec   record.Record
	Found bool
}

// A cached entry is one buffer, so that a hit touches one allocation: the
// key compare reads the buffer's first cache line and the value follows
// it, where an Entry struct pointing at a separate key and a separate
// value cost three dependent cache misses per hit on a data set larger
// than the CPU caches (BenchmarkGetHitLarge):
//
//	uvarint key length, key, envelope (package record; absent: not found)
//
// A found record's envelope is at least record.HeaderSize bytes, so
// nothing after the key means "never written".

// Loader appends key's envelope to prefix in a new buffer that the cache
// keeps, and reports found false (and the buffer unused) when the store
// has never seen the key. store.Store.AppendEnvelope is one.
type Loader func(prefix []byte) (buf []byte, found bool, err error)

// Metrics are the cache's counters, for the metrics collector. Hits and
// Misses count reads (GetOrLoad, GetOrRead) by their first look, each
// once; the others are ristretto's.
type Metrics struct {
	Hits, Misses, Evictions, SetsDropped, SetsRejected uint64
	CostAdded, CostEvicted                             uint64
	MaxCost                                            int64
}

// Cache is a record cache bounded by bytes. A nil *Cache is a valid, always
// missing cache: the node runs without one when --cache-bytes is 0.
type Cache struct {
	rc      *ristretto.Cache[uint64, []byte]
	seed    maphash.Seed
	stripes [nStripes]stripe
	// evicted counts entries the policy evicted (OnEvict): ristretto's
	// KeysEvicted counts every Del (Invalidate) too.
	evicted atomic.Uint64
}

// stripe is one key stripe's lock and the read counters of its keys.
//
// The cache counts hits and misses itself, by a read's first look
// (get): ristretto would count fill's second look under the lock as a
// lookup of its own, every miss twice. The counters are per stripe, as
// ristretto's are striped, so that reads on many cores do not share one
// cache line; Metrics sums them.
type stripe struct {
	mu           sync.Mutex
	hits, misses atomic.Uint64
}

// New returns a cache holding at most maxBytes of entries, or nil when
// maxBytes is 0.
func New(maxBytes int64) (*Cache, error) {
	if maxBytes <= 0 {
		return nil, nil
	}
	counters := maxBytes / 100 // ~10 counters per expected entry of ~1 KiB
	if counters < 10000 {
		counters = 10000
	}
	c := &Cache{seed: maphash.MakeSeed()}
	rc, err := ristretto.NewCache(&ristretto.Config[uint64, []byte]{
		NumCounters: counters,
		MaxCost:     maxBytes,
		BufferItems: 64,
		Metrics:     true,
		OnEvict:     func(*ristretto.Item[[]byte]) { c.evicted.Add(1) },
		// The cost of an entry is its buffer and entryOverhead, which
		// stands for ristretto's own bookkeeping: its internal cost
		// would count that twice.
		IgnoreInternalCost: true,
	})
	if err != nil {
		return nil, fmt.Errorf("new cache: %w", err)
	}
	c.rc = rc
	return c, nil
}

// Close releases the cache's goroutines.
func (c *Cache) Close() {
	if c != nil {
		c.rc.Close()
	}
}

// The ristretto key is a 64-bit hash of the user key; the full key is kept in
// the entry and compared on every hit, so a hash collision is a miss, never a
// wrong answer. All protocol steps for a key use the same hash, hence the
// same stripe, so collisions cannot break the protocol either (they only
// cause an extra invalidation).
func (c *Cache) hash(key []byte) uint64 { return maphash.Bytes(c.seed, key) }

// GetOrLoad returns key's entry: from the cache when it holds one (no lock,
// no allocation), else from load under the key's stripe, caching what load
// returned (see the protocol above). load is called at most once, on this
// goroutine, and not kept. The entry's value is the cache's: read-only.
func (c *Cache) GetOrLoad(key []byte, load Loader) (Entry, error) {
	if e, ok := c.get(key); ok {
		return e, nil
	}
	return c.fill(key, load)
}

// GetOrRead is GetOrLoad for a read the cache should not keep: a
// background read (anti-entropy pulling a record) of a key requests may
// never ask for, whose fill would cost the policy's work and evict what
// requests use. On a miss it loads without caching; the store is the
// truth, so a read outside the fill protocol is never stale.
func (c *Cache) GetOrRead(key []byte, load Loader) (Entry, error) {
	if e, ok := c.get(key); ok {
		return e, nil
	}
	return loadUncached(load)
}

// loadUncached is key's entry as load finds it, cached nowhere.
func loadUncached(load Loader) (Entry, error) {
	buf, found, err := load(nil)
	if err != nil || !found {
		return Entry{}, err
	}
	rec, err := record.Decode(buf)
	if err != nil {
		return Entry{}, fmt.Errorf("cache load: %w", err)
	}
	return Entry{Rec: rec, Found: true}, nil
}

// get returns the cached entry for key, if any.
func (c *Cache) get(key []byte) (Entry, bool) {
	if c == nil {
		return Entry{}, false
	}
	h := c.hash(key)
	st := &c.stripes[h%nStripes]
	buf, ok := c.rc.Get(h)
	if !ok {
		st.misses.Add(1)
		return Entry{}, false
	}
	e, ok := decode(buf, key)
	if !ok {
		st.misses.Add(1) // another key's entry (a hash collision): a miss
		return Entry{}, false
	}
	st.hits.Add(1)
	return e, true
}

// decode reads a cached buffer; ok is false when it holds another key (a
// hash collision) or is malformed.
func decode(buf, key []byte) (Entry, bool) {
	n, w := binary.Uvarint(buf)
	if w <= 0 || n != uint64(len(key)) || uint64(len(buf)-w) < n || !bytes.Equal(buf[w:w+len(key)], key) {
		return Entry{}, false
	}
	env := buf[w+len(key):]
	if len(env) == 0 {
		return Entry{Found: false}, true
	}
	rec, err := record.Decode(env)
	if err != nil {
		return Entry{}, false
	}
	return Entry{Rec: rec, Found: true}, true
}

// fill returns key's entry, loading it with load on a miss and caching the
// result.
func (c *Cache) fill(key []byte, load Loader) (Entry, error) {
	if c == nil {
		return loadUncached(load)
	}
	h := c.hash(key)
	mu := &c.stripes[h%nStripes].mu
	mu.Lock()
	defer mu.Unlock()
	if buf, ok := c.rc.Get(h); ok {
		if e, ok := decode(buf, key); ok {
			return e, nil // filled by a concurrent reader while we waited
		}
	}
	prefix := append(binary.AppendUvarint(make([]byte, 0, binary.MaxVarintLen64+len(key)), uint64(len(key))), key...)
	buf, found, err := load(prefix)
	if err != nil {
		return Entry{}, err
	}
	if !found {
		buf = prefix
	}
	e, ok := decode(buf, key)
	if !ok {
		return Entry{}, fmt.Errorf("cache fill %q: %w", key, record.ErrCorrupt)
	}
	c.rc.Set(h, buf, int64(len(buf)+entryOverhead))
	// Do not unlock while the Set may still be queued: see race 2 above.
	c.rc.Wait()
	return e, nil
}

// Invalidate removes key's entry. Call it after the write to the store has
// committed and before acknowledging the write.
//
// Most writes find nothing to remove, and ristretto's Del is not free: it
// queues a delete for its policy goroutine (an allocation and a channel
// send) to cancel a Set that might still be queued. Under the stripe no
// Set of this key can be queued (fills Set and Wait under it), so when the
// map does not hold the key there is nothing to remove now or later, and
// the Del is skipped. GetTTL reads the map without touching the policy or
// the hit counters.
func (c *Cache) Invalidate(key []byte) {
	if c == nil {
		return
	}
	h := c.hash(key)
	mu := &c.stripes[h%nStripes].mu
	mu.Lock()
	if _, cached := c.rc.GetTTL(h); cached {
		c.rc.Del(h)
	}
	mu.Unlock()
}

// Metrics returns a snapshot of the cache's counters (zero for a nil cache).
func (c *Cache) Metrics() Metrics {
	if c == nil {
		return Metrics{}
	}
	var hits, misses uint64
	for i := range c.stripes {
		hits += c.stripes[i].hits.Load()
		misses += c.stripes[i].misses.Load()
	}
	m := c.rc.Metrics
	return Metrics{
		Hits: hits, Misses: misses, Evictions: c.evicted.Load(),
		SetsDropped: m.SetsDropped(), SetsRejected: m.SetsRejected(),
		CostAdded: m.CostAdded(), CostEvicted: m.CostEvicted(),
		MaxCost: c.rc.MaxCost(),
	}
}

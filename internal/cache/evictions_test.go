package cache

import (
	"testing"
)

// TestInvalidationIsNotAnEviction: dhtkv_cache_evictions_total is
// "Entries evicted from the read cache" (capacity pressure). It was
// ristretto's KeysEvicted, which also counts every Del (policy.Del adds
// to it), so every write of a cached key counted as an eviction, and a
// cache far larger than its data reported evictions. It now counts the
// policy's evictions (Config.OnEvict).
func TestInvalidationIsNotAnEviction(t *testing.T) {
	c, err := New(64 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 100 {
		key := []byte{byte(i)}
		if _, err := c.GetOrLoad(key, loader(1, "v")); err != nil {
			t.Fatal(err)
		}
		c.Invalidate(key)
	}
	c.rc.Wait()
	if m := c.Metrics(); m.Evictions != 0 {
		t.Errorf("a 64 MiB cache holding 100 tiny entries reports %d evictions (all of them invalidations)", m.Evictions)
	}
}

// An entry costs its buffer and entryOverhead, no more: ristretto added
// its own per-item cost (56 bytes) on top of entryOverhead, which stands
// for it, so dhtkv_cache_bytes read high and the cache held fewer small
// entries than --cache-bytes allows.
func TestEntryCostCountedOnce(t *testing.T) {
	c, err := New(64 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n = 100
	for i := range n {
		if _, err := c.GetOrLoad([]byte{byte(i)}, loader(1, "v")); err != nil {
			t.Fatal(err)
		}
	}
	c.rc.Wait()
	m := c.Metrics()
	if per := m.CostAdded / n; per < entryOverhead || per > entryOverhead+32 {
		t.Errorf("a 1-byte value's entry costs %d bytes; want its buffer (a few bytes) and %d", per, entryOverhead)
	}
}

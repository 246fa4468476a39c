package store

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/record"
)

// TestHeldAndDropPartition: Held finds exactly the partitions asked about
// that hold a record (a tombstone counts), and a partition dropped holds
// none afterwards while the others keep theirs.
func TestHeldAndDropPartition(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	byPart := map[partition.ID][]string{}
	for i := range 300 {
		key := fmt.Sprintf("h%d", i)
		var value []byte
		if i%5 != 0 {
			value = []byte("v")
		}
		put(t, s, key, 1, value)
		p, _ := partition.Of([]byte(key))
		byPart[p] = append(byPart[p], key)
	}
	all := func(partition.ID) bool { return true }
	held, err := s.Held(all)
	require.NoError(t, err)
	require.Equal(t, slices.Sorted(maps.Keys(byPart)), held)

	odd := func(p partition.ID) bool { return p%2 == 1 }
	oddHeld, err := s.Held(odd)
	require.NoError(t, err)
	for _, p := range oddHeld {
		require.True(t, odd(p))
		require.NotEmpty(t, byPart[p])
	}

	victim := held[0]
	removed, err := s.DropPartition(t.Context(), victim, nil, nil)
	require.NoError(t, err)
	require.Equal(t, len(byPart[victim]), removed)
	after, err := s.Held(all)
	require.NoError(t, err)
	require.Equal(t, held[1:], after)
	for _, key := range byPart[held[1]] {
		_, found, err := s.Version([]byte(key))
		require.NoError(t, err)
		require.True(t, found, "a partition not dropped keeps %s", key)
	}
	for _, key := range byPart[victim] {
		_, found, err := s.Version([]byte(key))
		require.NoError(t, err)
		require.False(t, found, "%s dropped", key)
	}
}

// keysIn returns, for each partition in want, want[p] keys of it (and
// nothing of others), found by trying keys named prefix<n> in order.
func keysIn(prefix string, want map[partition.ID]int) map[partition.ID][]string {
	got := map[partition.ID][]string{}
	left := 0
	for _, n := range want {
		left += n
	}
	buf := []byte(prefix)
	for i := 0; left > 0; i++ {
		buf = strconv.AppendInt(buf[:len(prefix)], int64(i), 10)
		p, _ := partition.Of(buf)
		if len(got[p]) < want[p] {
			got[p] = append(got[p], string(buf))
			left--
		}
	}
	return got
}

// pacer is a store.Pacer that records what it is asked, and calls hook
// (when set) with the number of the call, from 1, before answering.
type pacer struct {
	asked []int
	hook  func(call int) error
}

func (p *pacer) WaitN(ctx context.Context, n int) error {
	p.asked = append(p.asked, n)
	if p.hook != nil {
		if err := p.hook(len(p.asked)); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// TestDropPartitionResumes: a drop of a partition larger than a chunk asks
// its pacer for each chunk's records before deleting them; stopped by its
// context after the first chunk, it has deleted exactly that chunk (keys
// and index entries together: the records left are still found by Held
// and the index) and a second drop deletes the rest, and a record written
// during it after its walk read the index (a second walk finds it). The partitions on
// either side, whose index keys border the dropped one's, and every
// other, keep every record.
func TestDropPartitionResumes(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	const victim = partition.ID(0x0800)
	size := DropChunk + DropChunk/2
	byPart := keysIn("d", map[partition.ID]int{victim - 1: 20, victim: size, victim + 1: 20})
	for i := range 200 {
		k := fmt.Sprintf("o%d", i)
		if p, _ := partition.Of([]byte(k)); p != victim {
			byPart[p] = append(byPart[p], k)
		}
	}
	for _, keys := range byPart {
		for i, k := range keys {
			var value []byte
			if i%7 != 0 { // some tombstones: a drop deletes them too
				value = []byte("v")
			}
			put(t, s, k, 10, value)
		}
	}
	found := func(key string) bool {
		t.Helper()
		_, ok, err := s.Version([]byte(key))
		require.NoError(t, err)
		return ok
	}
	indexed := func(part partition.ID) int {
		t.Helper()
		n := 0
		require.NoError(t, s.SegmentEntries(part, -1, func(uint8, []byte, IndexEntry) error { n++; return nil }))
		return n
	}

	ctx, cancel := context.WithCancel(t.Context())
	var dropped []string
	p := &pacer{hook: func(call int) error {
		if call == 2 {
			cancel()
		}
		return nil
	}}
	removed, err := s.DropPartition(ctx, victim, p, func(keys [][]byte) {
		for _, k := range keys {
			dropped = append(dropped, string(k))
		}
	})
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, []int{DropChunk, size - DropChunk}, p.asked, "each chunk's records asked of the pacer before it is deleted")
	require.Equal(t, DropChunk, removed)
	require.Len(t, dropped, DropChunk)
	gone := map[string]bool{}
	for _, k := range dropped {
		gone[k] = true
		require.False(t, found(k), "%s dropped", k)
	}
	for _, k := range byPart[victim] {
		require.Equal(t, !gone[k], found(k), "%s: dropped exactly when reported", k)
	}
	require.Equal(t, size-DropChunk, indexed(victim), "the records left are indexed")
	held, err := s.Held(func(q partition.ID) bool { return q == victim })
	require.NoError(t, err)
	require.Equal(t, []partition.ID{victim}, held)

	// The drop again, and a write of a key the first one dropped while
	// it runs, after its walk read the index.
	p = &pacer{hook: func(call int) error {
		if call == 1 {
			put(t, s, dropped[0], 11, []byte("again"))
		}
		return nil
	}}
	removed, err = s.DropPartition(t.Context(), victim, p, nil)
	require.NoError(t, err)
	require.Equal(t, size-DropChunk+1, removed)
	require.Equal(t, []int{size - DropChunk, 1}, p.asked, "the rest, then what a second walk found")
	for _, k := range byPart[victim] {
		require.False(t, found(k), "%s dropped", k)
	}
	require.Zero(t, indexed(victim))
	held, err = s.Held(func(q partition.ID) bool { return q == victim })
	require.NoError(t, err)
	require.Empty(t, held)
	for part, keys := range byPart {
		if part == victim {
			continue
		}
		require.Equal(t, len(keys), indexed(part), "partition %d keeps its index", part)
		for _, k := range keys {
			require.True(t, found(k), "%s of partition %d kept", k, part)
		}
	}
}

// BenchmarkDropPartition: dropping partitions of 256 records of 1 KiB (a
// 1M-record store's share) among 64k others, one at a time without a
// pace: the cost a record that --drop-rate spreads over time (the walk of
// the index, the deletes, the commit; not the cache's invalidation, which
// is the replica's). point is DropPartition; index-range is the
// alternative it does not take, the data keys deleted one by one and the
// index by one range deletion a partition (cheaper, but a write racing
// with it would keep its data key and lose its index entry). Each
// partition is dropped once up to 128 iterations (-benchtime 128x);
// beyond, again after a refill, over the tombstones of its last drop.
func BenchmarkDropPartition(b *testing.B) {
	for _, tc := range []struct {
		name string
		drop func(s *Store, part partition.ID) (int, error)
	}{
		{"point", func(s *Store, part partition.ID) (int, error) { return s.DropPartition(b.Context(), part, nil, nil) }},
		{"index-range", dropIndexRange},
	} {
		b.Run(tc.name, func(b *testing.B) { benchmarkDrop(b, tc.drop) })
	}
}

// dropIndexRange drops part's data keys one by one and its index by one
// range deletion, in one batch (BenchmarkDropPartition's comparison).
func dropIndexRange(s *Store, part partition.ID) (int, error) {
	lower := []byte{indexPrefix, byte(part >> 8), byte(part)}
	upper := []byte{indexPrefix, byte((part + 1) >> 8), byte(part + 1)}
	keys, _, _, err := s.indexKeys(lower, upper, math.MaxInt, math.MaxUint64)
	if err != nil {
		return 0, err
	}
	batch := s.db.NewBatch()
	defer batch.Close()
	for _, k := range keys {
		if err := batch.Delete(append([]byte{dataPrefix}, k...), nil); err != nil {
			return 0, err
		}
	}
	if err := batch.DeleteRange(lower, upper, nil); err != nil {
		return 0, err
	}
	return len(keys), s.db.Apply(batch, pebble.NoSync)
}

func benchmarkDrop(b *testing.B, drop func(s *Store, part partition.ID) (int, error)) {
	s, err := Open(filepath.Join(b.TempDir(), "db"), Options{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(b, err)
	defer s.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	value := func() []byte {
		v := make([]byte, 1024)
		for i := range v {
			v[i] = byte(rng.Uint32())
		}
		return v
	}
	const parts, size = 128, 256
	want := map[partition.ID]int{}
	for p := range parts {
		want[partition.ID(p*(partition.Count/parts))] = size
	}
	byPart := keysIn("b", want)
	var others []Write
	for i := 0; len(others) < 1<<16; i++ {
		key := fmt.Appendf(nil, "o%08d", i)
		if p, _ := partition.Of(key); want[p] == 0 {
			others = append(others, Write{Key: key, Rec: &record.Record{Version: 1 << 40, Value: value()}})
		}
	}
	for i := 0; i < len(others); i += 4096 {
		require.NoError(b, s.ApplyBatch(others[i:min(i+4096, len(others))]))
	}
	round, n := 0, 0
	for b.Loop() {
		b.StopTimer()
		part := partition.ID((round % parts) * (partition.Count / parts))
		var ws []Write
		for _, k := range byPart[part] {
			ws = append(ws, Write{Key: []byte(k), Rec: &record.Record{Version: 1<<40 + uint64(round), Value: value()}})
		}
		round++
		require.NoError(b, s.ApplyBatch(ws))
		b.StartTimer()
		removed, err := drop(s, part)
		if err != nil || removed != len(ws) {
			b.Fatalf("dropped %d of %d: %v", removed, len(ws), err)
		}
		n += removed
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/record")
}

// TestDropHeldKeepsWhatArrivedSince: DropHeld drops only the records
// that arrived before its moment (a partition's leftovers from before a
// change), whatever the walk's chunks hold: chunks of records that
// arrived since only are passed over, and a key written again since (a
// newer version: a write of the change) is kept. The moment is recorded
// and read back across a restart (SetChangeBegan, ChangeBegan).
func TestDropHeldKeepsWhatArrivedSince(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	part := partOf("k0")
	var keys []string
	buf := []byte("k")
	for i := int64(0); len(keys) < 200+DropChunk; i++ {
		buf = strconv.AppendInt(buf[:1], i, 10)
		if p, _ := partition.Of(buf); p == part {
			keys = append(keys, string(buf))
		}
	}
	// More than a chunk: the walk goes on past entries it keeps.
	old, rewritten, since := keys[:200], keys[:10], keys[200:]
	for _, k := range old {
		put(t, s, k, 1, []byte("old"))
	}
	last := time.Now().UnixMilli()
	require.Eventually(t, func() bool { return time.Now().UnixMilli() > last }, time.Second, 100*time.Microsecond)
	began := uint64(time.Now().UnixMilli())
	for _, k := range since {
		put(t, s, k, 1, []byte("since"))
	}
	for _, k := range rewritten {
		put(t, s, k, 2, []byte("written again"))
	}

	v, err := s.ChangeBegan()
	require.NoError(t, err)
	require.Zero(t, v, "nothing recorded yet")
	require.NoError(t, s.SetChangeBegan(began))
	require.NoError(t, s.Close())
	s = open(t, dir)
	defer s.Close()
	v, err = s.ChangeBegan()
	require.NoError(t, err)
	require.Equal(t, began, v)

	var dropped int
	removed, err := s.DropHeld(t.Context(), part, nil, func(keys [][]byte) { dropped += len(keys) }, began)
	require.NoError(t, err)
	require.Equal(t, len(old)-len(rewritten), removed)
	require.Equal(t, removed, dropped)
	for _, k := range old[len(rewritten):] {
		_, found, err := s.Version([]byte(k))
		require.NoError(t, err)
		require.False(t, found, "%s arrived before the moment", k)
	}
	for _, k := range append(slices.Clone(rewritten), since...) {
		_, found, err := s.Version([]byte(k))
		require.NoError(t, err)
		require.True(t, found, "%s arrived since", k)
	}
}

// TestDropHeldKeepsAWriteRacingItsChunk: DropHeld decides by the index
// entries of a chunk it read, and a key written again between that read
// and the chunk's delete (a write of the change, over a leftover) arrived
// since: it stays. The pacer, called between the two, is the race made
// certain.
func TestDropHeldKeepsAWriteRacingItsChunk(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	k := "k0"
	put(t, s, k, 1, []byte("leftover"))
	last := time.Now().UnixMilli()
	require.Eventually(t, func() bool { return time.Now().UnixMilli() > last }, time.Second, 100*time.Microsecond)
	began := uint64(time.Now().UnixMilli())

	p := &pacer{hook: func(int) error {
		put(t, s, k, 2, []byte("written since"))
		return nil
	}}
	removed, err := s.DropHeld(t.Context(), partOf(k), p, nil, began)
	require.NoError(t, err)
	require.Zero(t, removed)
	v, found, err := s.Version([]byte(k))
	require.NoError(t, err)
	require.True(t, found, "the write arrived after the moment (%d)", began)
	require.Equal(t, uint64(2), v)
}

// TestDropHeldKeepsARecordStoredAgainSince: a leftover stored again
// since the moment at the same version (a change's copy bringing it from
// an old replica, after the drop before the copy failed) is the copy the
// map's log may have counted: a second DropHeld (the mover run again
// after a restart in the stream stage) must keep it. The index merge
// keeps the earlier arrival of equal versions, so it was dropped.
func TestDropHeldKeepsARecordStoredAgainSince(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	k := "k0"
	put(t, s, k, 1, []byte("leftover"))
	last := time.Now().UnixMilli()
	require.Eventually(t, func() bool { return time.Now().UnixMilli() > last }, time.Second, 100*time.Microsecond)
	began := uint64(time.Now().UnixMilli())
	require.Eventually(t, func() bool { return uint64(time.Now().UnixMilli()) > began }, time.Second, 100*time.Microsecond)

	put(t, s, k, 1, []byte("leftover")) // the copy, from an old replica
	removed, err := s.DropHeld(t.Context(), partOf(k), nil, nil, began)
	require.NoError(t, err)
	require.Zero(t, removed, "the copy stored the record again after the moment (%d)", began)
	_, found, err := s.Version([]byte(k))
	require.NoError(t, err)
	require.True(t, found)
}

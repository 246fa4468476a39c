package store

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/record"
)

// put stores value under key at version v (a tombstone when value is nil).
func put(t *testing.T, s *Store, key string, v uint64, value []byte) {
	t.Helper()
	r := record.Record{Version: v, Value: value, Tombstone: value == nil}
	require.NoError(t, s.Apply([]byte(key), &r))
}

// TestIterRelease: a released Iter holds no Pebble iterator, keeps its
// current record readable, and resumes just after it on the store as it
// is then: keys behind the position are not seen again, keys ahead of it
// are seen at their newest version, each key once and in order.
func TestIterRelease(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	for i := range 10 {
		put(t, s, fmt.Sprintf("k%d", i), 1, []byte(fmt.Sprintf("v%d", i)))
	}
	it, err := s.NewIter([]byte("k1"), []byte("k8"))
	require.NoError(t, err)
	require.EqualValues(t, 1, s.RangeIters())

	var keys []string
	next := func() {
		t.Helper()
		require.True(t, it.Next(), "err %v", it.Err())
		keys = append(keys, string(it.Key()))
	}
	next() // k1
	next() // k2
	require.NoError(t, it.Release())
	require.EqualValues(t, 0, s.RangeIters(), "a released Iter pins no snapshot")
	require.NoError(t, it.Release(), "a second Release is a no-op")
	// The current record is still readable after the release.
	require.Equal(t, "k2", string(it.Key()))
	require.Equal(t, "v2", string(it.Record().Value))
	env, err := record.Decode(it.Envelope())
	require.NoError(t, err)
	require.Equal(t, "v2", string(env.Value))

	put(t, s, "k0", 2, []byte("behind the range"))
	put(t, s, "k2", 2, []byte("the current key, rewritten"))
	put(t, s, "k1a", 2, []byte("behind the position"))
	put(t, s, "k2a", 2, []byte("just after the position"))
	put(t, s, "k4", 2, nil) // deleted ahead: seen as a tombstone
	put(t, s, "k5", 2, []byte("v5, newer"))
	put(t, s, "k9", 2, []byte("after the range"))

	next() // k2a: reopened just after k2
	require.EqualValues(t, 1, s.RangeIters())
	require.Equal(t, "just after the position", string(it.Record().Value))
	next() // k3
	next() // k4
	require.True(t, it.Record().Tombstone)
	require.NoError(t, it.Release())
	require.NoError(t, it.Release())
	next() // k5
	require.Equal(t, "v5, newer", string(it.Record().Value))
	next() // k6
	next() // k7
	require.NoError(t, it.Release())
	require.False(t, it.Next(), "k8 is the range's end")
	require.NoError(t, it.Err())
	require.Equal(t, []string{"k1", "k2", "k2a", "k3", "k4", "k5", "k6", "k7"}, keys)
	require.EqualValues(t, 0, s.RangeIters())
	require.NoError(t, it.Release(), "Release at the end is a no-op")
	require.NoError(t, it.Close())
	require.NoError(t, it.Close())
	require.EqualValues(t, 0, s.RangeIters())
}

// TestIterReleaseEdges: released before the first record, the Iter starts
// where its range starts; released on the range's last key, it ends; a
// released Iter closes without a Pebble iterator to close.
func TestIterReleaseEdges(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	put(t, s, "a", 1, []byte("1"))
	put(t, s, "b", 1, []byte("2"))

	it, err := s.NewIter([]byte("a"), nil)
	require.NoError(t, err)
	require.NoError(t, it.Release())
	require.EqualValues(t, 0, s.RangeIters())
	put(t, s, "a", 2, []byte("1, newer"))
	require.True(t, it.Next())
	require.Equal(t, "a", string(it.Key()))
	require.Equal(t, "1, newer", string(it.Record().Value))
	require.True(t, it.Next())
	require.Equal(t, "b", string(it.Key()))
	require.NoError(t, it.Release())
	require.False(t, it.Next())
	require.NoError(t, it.Err())
	require.NoError(t, it.Close())

	it, err = s.NewIter([]byte("a"), []byte("b"))
	require.NoError(t, err)
	require.True(t, it.Next())
	require.NoError(t, it.Release())
	require.False(t, it.Next(), "after a, the range [a, b) holds nothing")
	require.NoError(t, it.Close())

	it, err = s.NewIter([]byte("a"), nil)
	require.NoError(t, err)
	require.True(t, it.Next())
	require.NoError(t, it.Release())
	require.NoError(t, it.Close())
	require.False(t, it.Next(), "closed")
	require.EqualValues(t, 0, s.RangeIters())
}

// TestPartitionIter: a partition iterator shows every record of its
// partitions, tombstones included, in key order, and nothing of the
// others; across a Release too.
func TestPartitionIter(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	want := map[string]bool{}
	var parts []partition.ID
	for i := range 400 {
		key := fmt.Sprintf("k%03d", i)
		var value []byte
		if i%7 != 0 {
			value = []byte("v")
		}
		put(t, s, key, 1, value)
		if p, _ := partition.Of([]byte(key)); i%3 == 0 {
			parts = append(parts, p)
		}
	}
	set := partition.SetOf(parts...)
	for i := range 400 {
		key := fmt.Sprintf("k%03d", i)
		if set.HasKey([]byte(key)) {
			want[key] = true
		}
	}
	it, err := s.NewPartitionIter(nil, nil, set)
	require.NoError(t, err)
	defer it.Close()
	var got []string
	for it.Next() {
		got = append(got, string(it.Key()))
		if len(got) == 10 {
			require.NoError(t, it.Release())
		}
	}
	require.NoError(t, it.Err())
	require.Len(t, got, len(want))
	require.True(t, slices.IsSorted(got))
	for _, k := range got {
		require.True(t, want[k], "key %s of another partition", k)
	}

	empty, err := s.NewPartitionIter(nil, nil, partition.SetOf())
	require.NoError(t, err)
	require.False(t, empty.Next())
	require.NoError(t, empty.Err())
	require.NoError(t, empty.Close())
}

// BenchmarkPartitionIter: a partition stream's walk (a membership change's
// or a rebuild's copy, at the sender) of a quarter of the partitions of a
// store of 100k records of 1 KiB, flushed to L0 as a node's recent writes
// are, or compacted to the last level; the cost per record sent and per
// key walked.
func BenchmarkPartitionIter(b *testing.B) {
	for _, compacted := range []bool{false, true} {
		b.Run(fmt.Sprintf("compacted=%t", compacted), func(b *testing.B) {
			b.ReportAllocs()
			const n = 100_000
			s := benchStore(b, n)
			if compacted {
				require.NoError(b, s.db.Compact(context.Background(), []byte{0}, []byte{0xff}, true))
			}
			var parts partition.Set
			for p := 0; p < partition.Count; p += 4 {
				parts.Add(partition.ID(p))
			}
			b.ResetTimer()
			sent := 0
			for range b.N {
				it, err := s.NewPartitionIter(nil, nil, &parts)
				require.NoError(b, err)
				for it.Next() {
					sent++
				}
				require.NoError(b, it.Err())
				require.NoError(b, it.Close())
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(sent), "ns/record")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n*b.N), "ns/key")
		})
	}
}

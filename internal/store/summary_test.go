package store

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/record"
)

func openTemp(t *testing.T) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "db"), Options{})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// allHashes returns every partition's segment hashes.
func allHashes(t *testing.T, s *Store) map[partition.ID][partition.Segments]uint64 {
	t.Helper()
	out := map[partition.ID][partition.Segments]uint64{}
	for p := range partition.Count {
		var segs [partition.Segments]uint64
		require.NoError(t, s.SegmentHashes(partition.ID(p), &segs))
		if segs != ([partition.Segments]uint64{}) {
			out[partition.ID(p)] = segs
		}
	}
	return out
}

// indexOf returns every (key, version) of the index, checking that each key
// is in the partition and segment it hashes to.
func indexOf(t *testing.T, s *Store) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for p := range partition.Count {
		require.NoError(t, s.SegmentEntries(partition.ID(p), -1, func(seg uint8, key []byte, e IndexEntry) error {
			v := e.Version
			wp, ws := partition.Of(key)
			require.Equal(t, partition.ID(p), wp, "key %q", key)
			require.Equal(t, ws, seg, "key %q", key)
			_, dup := out[string(key)]
			require.False(t, dup, "key %q indexed twice", key)
			out[string(key)] = v
			return nil
		}))
	}
	return out
}

// dataVersions returns every key's stored version.
func dataVersions(t *testing.T, s *Store) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	it, err := s.NewIter(nil, nil)
	require.NoError(t, err)
	for it.Next() {
		out[string(it.Key())] = it.Record().Version
	}
	require.NoError(t, it.Err())
	require.NoError(t, it.Close())
	return out
}

// TestSummaryOrderIndependent: two stores given the same writes in
// different orders (older versions after newer ones, tombstones, batches
// and single writes) index exactly the versions their data keys hold and
// agree on every hash; one differing write changes its segment's hash and
// only that one.
func TestSummaryOrderIndependent(t *testing.T) {
	type w struct {
		key string
		rec record.Record
	}
	var writes []w
	for i := range 3000 {
		for v := range 1 + i%3 {
			rec := record.Record{Version: uint64(10*i + v + 1), Value: []byte("v")}
			if v == 2 {
				rec = record.Record{Version: rec.Version, Tombstone: true}
			}
			writes = append(writes, w{fmt.Sprintf("k%05d", i), rec})
		}
	}
	a, b := openTemp(t), openTemp(t)
	for _, x := range writes {
		require.NoError(t, a.Apply([]byte(x.key), &x.rec))
	}
	r := rand.New(rand.NewPCG(1, 2))
	r.Shuffle(len(writes), func(i, j int) { writes[i], writes[j] = writes[j], writes[i] })
	for len(writes) > 0 {
		n := min(len(writes), 1+r.IntN(50))
		batch := make([]Write, n)
		for i := range batch {
			batch[i] = Write{Key: []byte(writes[i].key), Rec: &writes[i].rec}
		}
		require.NoError(t, b.ApplyBatch(batch))
		writes = writes[n:]
	}
	for _, s := range []*Store{a, b} {
		require.Equal(t, dataVersions(t, s), indexOf(t, s))
	}
	ha, hb := allHashes(t, a), allHashes(t, b)
	require.Equal(t, ha, hb)

	key := []byte("k00042")
	require.NoError(t, b.Apply(key, &record.Record{Version: 1 << 40, Value: []byte("newer")}))
	part, seg := partition.Of(key)
	hb = allHashes(t, b)
	for p, segs := range ha {
		for s := range segs {
			if p == part && s == int(seg) {
				require.NotEqual(t, segs[s], hb[p][s], "the written segment")
			} else {
				require.Equal(t, segs[s], hb[p][s], "partition %d segment %d", p, s)
			}
		}
	}
}

// TestSummaryConcurrentWrites: summaries computed while writes commit are
// never ahead of the store and catch up with it: once the writers stop,
// every cached hash equals one computed afresh after a reopen.
func TestSummaryConcurrentWrites(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	s, err := Open(dir, Options{})
	require.NoError(t, err)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				key := []byte(fmt.Sprintf("k%d", i%300))
				_ = s.Apply(key, &record.Record{Version: uint64(i*4 + g + 1), Value: key})
			}
		}()
	}
	stop := make(chan struct{})
	var hasher sync.WaitGroup
	hasher.Add(1)
	go func() {
		defer hasher.Done()
		var segs [partition.Segments]uint64
		for p := 0; ; p = (p + 1) % partition.Count {
			select {
			case <-stop:
				return
			default:
			}
			_ = s.SegmentHashes(partition.ID(p), &segs)
		}
	}()
	wg.Wait()
	close(stop)
	hasher.Wait()
	cached := allHashes(t, s)
	require.NoError(t, s.Close())
	s, err = Open(dir, Options{})
	require.NoError(t, err)
	defer s.Close()
	require.Equal(t, cached, allHashes(t, s))
}

// TestUpgradeLayout1: a directory written by a release without the index
// (layout 1) is upgraded at Open: the index is built from the data keys,
// and the layout recorded, so the next Open does nothing more.
func TestUpgradeLayout1(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	db, err := pebble.Open(dir, &pebble.Options{FormatMajorVersion: FormatMajorVersion, Merger: lwwMerger})
	require.NoError(t, err)
	want := map[string]uint64{}
	for i := range 10000 {
		key := fmt.Sprintf("key%d", i)
		rec := record.Record{Version: uint64(i + 1), Tombstone: i%7 == 0}
		require.NoError(t, db.Merge(append([]byte{dataPrefix}, key...), rec.Encode(), nil))
		want[key] = rec.Version
	}
	require.NoError(t, db.Set([]byte(layoutKey), []byte(layout1), nil))
	require.NoError(t, db.Close())

	s, err := Open(dir, Options{})
	require.NoError(t, err)
	require.Equal(t, want, indexOf(t, s))
	require.NoError(t, s.Close())

	s, err = Open(dir, Options{})
	require.NoError(t, err)
	defer s.Close()
	v, closer, err := s.db.Get([]byte(layoutKey))
	require.NoError(t, err)
	require.Equal(t, layoutVersion, string(v))
	closer.Close()
	require.Equal(t, want, indexOf(t, s))
}

// TestRefuseUnknownLayout: a directory of an unknown (newer) layout is
// refused with a message naming both.
func TestRefuseUnknownLayout(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	s, err := Open(dir, Options{})
	require.NoError(t, err)
	require.NoError(t, s.db.Set([]byte(layoutKey), []byte("dhtkv-layout-9"), pebble.Sync))
	require.NoError(t, s.Close())
	_, err = Open(dir, Options{})
	require.ErrorContains(t, err, `layout "dhtkv-layout-9"`)
}

// BenchmarkSegmentHashes: recomputing one stale partition of 256 keys (a
// 1M-key store's share) from the index.
func BenchmarkSegmentHashes(b *testing.B) {
	s, err := Open(filepath.Join(b.TempDir(), "db"), Options{})
	require.NoError(b, err)
	defer s.Close()
	var ws []Write
	for i := range 1 << 20 {
		key := []byte(fmt.Sprintf("key%08d", i))
		if p, _ := partition.Of(key); p == 7 {
			ws = append(ws, Write{Key: key, Rec: &record.Record{Version: uint64(i + 1), Value: key}})
		}
	}
	require.NoError(b, s.ApplyBatch(ws))
	var segs [partition.Segments]uint64
	b.ReportAllocs()
	for b.Loop() {
		s.summary.touch(7)
		if err := s.SegmentHashes(7, &segs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(ws)), "keys/partition")
}

// A SegmentReader lists what SegmentEntries lists, segment after segment
// through one iterator, reads the store as it was when its iterator was
// opened, sees later writes once that iterator is segmentReaderFresh old,
// and stays usable after fn's error.
func TestSegmentReader(t *testing.T) {
	s := openTemp(t)
	for i := range 3000 {
		rec := record.Record{Version: uint64(i + 1), Value: []byte("v")}
		require.NoError(t, s.Apply(fmt.Appendf(nil, "key-%d", i), &rec))
	}
	list := func(each func(part partition.ID, seg int, fn func(uint8, []byte, IndexEntry) error) error, part partition.ID, seg int) []string {
		var out []string
		require.NoError(t, each(part, seg, func(sg uint8, key []byte, e IndexEntry) error {
			out = append(out, fmt.Sprintf("%d/%s@%d", sg, key, e.Version))
			return nil
		}))
		return out
	}
	r := s.NewSegmentReader()
	defer r.Close()
	listed := 0
	for part := range partition.ID(64) {
		for seg := -1; seg < partition.Segments; seg += 7 { // the whole partition, then every 7th segment
			want := list(s.SegmentEntries, part, seg)
			require.Equal(t, want, list(r.Entries, part, seg), "partition %d segment %d", part, seg)
			listed += len(want)
		}
	}
	require.Positive(t, listed)

	// A write after the iterator opened: not seen until it is fresh again.
	key := []byte("written-later")
	part, seg := partition.Of(key)
	before := list(r.Entries, part, int(seg))
	rec := record.Record{Version: 99_999, Value: []byte("v")}
	require.NoError(t, s.Apply(key, &rec))
	require.Equal(t, before, list(r.Entries, part, int(seg)))
	r.opened = r.opened.Add(-segmentReaderFresh)
	after := list(r.Entries, part, int(seg))
	require.Contains(t, after, fmt.Sprintf("%d/%s@%d", seg, key, rec.Version))
	require.Equal(t, list(s.SegmentEntries, part, int(seg)), after)

	// fn's error stops the walk and is returned; the reader goes on.
	stop := fmt.Errorf("stop")
	require.ErrorIs(t, r.Entries(part, -1, func(uint8, []byte, IndexEntry) error { return stop }), stop)
	require.Equal(t, after, list(r.Entries, part, int(seg)))
	require.NoError(t, r.Close())
	require.NoError(t, r.Close())
	require.Equal(t, after, list(r.Entries, part, int(seg)), "usable after Close")
}

// A recomputation reports the index entries it read, for a caller that
// paces its walks: every entry of a stale partition, none once its
// hashes are current, all of them again after a write touches it.
func TestSegmentHashesWalked(t *testing.T) {
	s := openTemp(t)
	perPart := map[partition.ID]int{}
	for i := range 300 {
		key := []byte(fmt.Sprintf("k%d", i))
		require.NoError(t, s.Apply(key, &record.Record{Version: uint64(1000 + i), Value: []byte("v")}))
		p, _ := partition.Of(key)
		perPart[p]++
	}
	total := 0
	for p := range partition.Count {
		_, walked, err := s.PartitionHash(partition.ID(p))
		require.NoError(t, err)
		require.Equal(t, perPart[partition.ID(p)], walked, "partition %d", p)
		total += walked
	}
	require.Equal(t, 300, total, "a store opens with every partition stale")

	key := []byte("k7")
	part, _ := partition.Of(key)
	var segs [partition.Segments]uint64
	walked, err := s.SegmentHashesWalked(part, &segs)
	require.NoError(t, err)
	require.Zero(t, walked, "current hashes are not read again")
	require.NoError(t, s.Apply(key, &record.Record{Version: 5000, Value: []byte("w")}))
	walked, err = s.SegmentHashesWalked(part, &segs)
	require.NoError(t, err)
	require.Equal(t, perPart[part], walked, "a write makes its partition stale: every entry read again")
}

package store

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/record"
)

// msVersion is a version issued at Unix millisecond ms.
func msVersion(ms int64) uint64 { return hlc.VersionAt(time.UnixMilli(ms)) + 1 }

// candidatesOf lists every candidate of the store.
func candidatesOf(t *testing.T, s *Store, collectBefore, arrivedBefore uint64) []Candidate {
	t.Helper()
	var out []Candidate
	for p := range partition.Count {
		_, err := s.Candidates(partition.ID(p), collectBefore, arrivedBefore, func(key []byte, e IndexEntry) error {
			out = append(out, Candidate{Key: append([]byte(nil), key...), Version: e.Version})
			return nil
		})
		require.NoError(t, err)
	}
	return out
}

// TestCandidates: tombstones (by version time) and expiring values (by
// expiry) are candidates once collectable before the cut-off and arrived
// before the given time; live values never are.
func TestCandidates(t *testing.T) {
	s := openTemp(t)
	apply := func(key string, rec record.Record) { require.NoError(t, s.Apply([]byte(key), &rec)) }
	apply("live", record.Record{Version: msVersion(1000), Value: []byte("v")})
	apply("tomb-old", record.Record{Version: msVersion(1000), Tombstone: true})
	apply("tomb-new", record.Record{Version: msVersion(5000), Tombstone: true})
	apply("exp-old", record.Record{Version: msVersion(500), ExpiresAt: 2000, Value: []byte("v")})
	apply("exp-new", record.Record{Version: msVersion(500), ExpiresAt: 9000, Value: []byte("v")})
	arrived := uint64(time.Now().UnixMilli())
	keys := func(cs []Candidate) (out []string) {
		for _, c := range cs {
			out = append(out, string(c.Key))
		}
		return out
	}
	require.ElementsMatch(t, []string{"tomb-old", "exp-old"}, keys(candidatesOf(t, s, 3000, arrived+1000)))
	require.ElementsMatch(t, []string{"tomb-old", "exp-old", "tomb-new", "exp-new"}, keys(candidatesOf(t, s, 10000, arrived+1000)))
	require.Empty(t, candidatesOf(t, s, 10000, arrived-1000), "arrived after the last exchange")
}

// TestCollect: a candidate is removed only if its key still holds the
// version found; its partition's horizon rises, persists, and from then
// on writes below it of the key removed are dropped, while newer ones
// are stored.
func TestCollect(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	s, err := Open(dir, Options{})
	require.NoError(t, err)
	apply := func(key string, rec record.Record) { require.NoError(t, s.Apply([]byte(key), &rec)) }
	apply("a", record.Record{Version: msVersion(1000), Tombstone: true})
	apply("b", record.Record{Version: msVersion(1000), Tombstone: true})
	apply("b", record.Record{Version: msVersion(1500), Value: []byte("rewritten")}) // since found
	horizon := msVersion(2000)
	removed, err := s.Collect([]Candidate{{[]byte("a"), msVersion(1000)}, {[]byte("b"), msVersion(1000)}}, horizon, nil)
	require.NoError(t, err)
	require.Equal(t, [][]byte{[]byte("a")}, removed)
	_, found, err := s.Version([]byte("a"))
	require.NoError(t, err)
	require.False(t, found)
	require.Empty(t, candidatesOf(t, s, 1<<62, 1<<62), "index entry gone too")
	require.Equal(t, horizon, s.Horizon(partOf("a")))

	apply("a", record.Record{Version: msVersion(900), Value: []byte("zombie")}) // below: dropped
	_, found, err = s.Version([]byte("a"))
	require.NoError(t, err)
	require.False(t, found, "a write below the horizon is dropped")
	apply("c", record.Record{Version: msVersion(3000), Value: []byte("new")})
	v, found, err := s.Version([]byte("c"))
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, msVersion(3000), v)

	_, err = s.Collect([]Candidate{{[]byte("c"), msVersion(3000)}}, horizon, nil)
	require.ErrorContains(t, err, "not below the horizon")

	require.NoError(t, s.Close())
	s, err = Open(dir, Options{})
	require.NoError(t, err)
	defer s.Close()
	require.Equal(t, horizon, s.Horizon(partOf("a")), "persisted")
}

func partOf(key string) partition.ID {
	p, _ := partition.Of([]byte(key))
	return p
}

// keyIn returns a key of partition part other than those named.
func keyIn(part partition.ID, not ...string) string {
	for i := 0; ; i++ {
		k := fmt.Sprintf("k%d", i)
		if partOf(k) == part && !slices.Contains(not, k) {
			return k
		}
	}
}

// TestHorizonIsAPartitions: a collection raises the horizon of the
// partitions it removed records of, and no other. Below it, a write of a
// key that holds nothing is dropped (its delete may have been removed
// here), and one of a key that holds an older record is stored (no delete
// of that key newer than its record was removed here: the tombstone of a
// delete this replica missed, which it must not refuse); another
// partition takes any version (a partition a membership change gives the
// node). ResetHorizons puts a partition's back to 0; both persist.
func TestHorizonIsAPartitions(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	s, err := Open(dir, Options{})
	require.NoError(t, err)
	a := "a"
	p := partOf(a)
	older := keyIn(p, a)
	other := "b"
	for partOf(other) == p {
		other += "b"
	}
	q := partOf(other)
	apply := func(key string, v int64, tomb bool) {
		rec := record.Record{Version: msVersion(v), Tombstone: tomb}
		if !tomb {
			rec.Value = []byte("v")
		}
		require.NoError(t, s.Apply([]byte(key), &rec))
	}
	holds := func(key string) int64 {
		v, found, err := s.Version([]byte(key))
		require.NoError(t, err)
		if !found {
			return 0
		}
		return hlc.TimeOf(v).UnixMilli()
	}
	apply(a, 1000, true)
	apply(older, 500, false)
	removed, err := s.Collect([]Candidate{{[]byte(a), msVersion(1000)}}, msVersion(2000), nil)
	require.NoError(t, err)
	require.Len(t, removed, 1)
	require.Equal(t, msVersion(2000), s.Horizon(p))
	require.Zero(t, s.Horizon(q), "nothing of it was removed")
	require.Equal(t, msVersion(2000), s.HighestHorizon())

	apply(a, 900, false)
	require.Zero(t, holds(a), "below the horizon, of a key that holds nothing: dropped")
	apply(older, 1500, true)
	require.EqualValues(t, 1500, holds(older), "below the horizon, newer than the key's record: stored")
	apply(older, 1200, false)
	require.EqualValues(t, 1500, holds(older), "older than the key's record: last-write-wins")
	apply(other, 100, false)
	require.EqualValues(t, 100, holds(other), "another partition's horizon is 0")

	require.NoError(t, s.Close())
	s, err = Open(dir, Options{})
	require.NoError(t, err)
	require.Equal(t, msVersion(2000), s.Horizon(p), "persisted")
	require.Zero(t, s.Horizon(q))

	require.NoError(t, s.ResetHorizons(func(part partition.ID) bool { return part == p }))
	require.Zero(t, s.Horizon(p))
	require.Zero(t, s.HighestHorizon())
	apply(a, 900, false)
	require.EqualValues(t, 900, holds(a), "the partition's old records are taken again")
	require.NoError(t, s.Close())
	s, err = Open(dir, Options{})
	require.NoError(t, err)
	defer s.Close()
	require.Zero(t, s.Horizon(p), "the reset persisted")
}

// An earlier release's one horizon becomes the horizon of every partition
// the store holds records of, and is removed.
func TestHorizonMigrates(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	s, err := Open(dir, Options{})
	require.NoError(t, err)
	held, empty := partOf("a"), partition.ID(0)
	for empty == held {
		empty++
	}
	require.NoError(t, s.Apply([]byte("a"), &record.Record{Version: msVersion(5000), Value: []byte("v")}))
	legacy := binary.BigEndian.AppendUint64(nil, msVersion(2000))
	require.NoError(t, s.db.Set([]byte(legacyHorizonKey), legacy, pebble.Sync))
	require.NoError(t, s.Close())

	s, err = Open(dir, Options{})
	require.NoError(t, err)
	defer s.Close()
	require.Equal(t, msVersion(2000), s.Horizon(held))
	for part := range partition.Count {
		if partition.ID(part) != held {
			require.Zero(t, s.Horizon(partition.ID(part)), "partition %d holds nothing", part)
		}
	}
	_, closer, err := s.db.Get([]byte(legacyHorizonKey))
	require.ErrorIs(t, err, pebble.ErrNotFound, "migrated")
	if closer != nil {
		closer.Close()
	}
}

// TestCollectRacesWrites: writers rewrite keys while they are collected;
// every write at or above the horizon that returned is still there
// afterwards (a Pebble Delete between a re-read and a write would remove
// it), and keys no one rewrote are gone.
func TestCollectRacesWrites(t *testing.T) {
	s := openTemp(t)
	const n = 2000
	for i := range n {
		rec := record.Record{Version: msVersion(1000), Tombstone: true}
		require.NoError(t, s.Apply([]byte(fmt.Sprintf("k%d", i)), &rec))
	}
	horizon := msVersion(2000)
	var wg sync.WaitGroup
	rewritten := make([]bool, n)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < n; i += 3 {
			rec := record.Record{Version: msVersion(5000), Value: []byte("live")}
			if s.Apply([]byte(fmt.Sprintf("k%d", i)), &rec) == nil {
				rewritten[i] = true
			}
		}
	}()
	cands := candidatesOf(t, s, 1<<62, 1<<62)
	for len(cands) > 0 {
		chunk := cands[:min(len(cands), 100)]
		cands = cands[len(chunk):]
		_, err := s.Collect(chunk, horizon, nil)
		require.NoError(t, err)
	}
	wg.Wait()
	for i := range n {
		v, found, err := s.Version([]byte(fmt.Sprintf("k%d", i)))
		require.NoError(t, err)
		if rewritten[i] {
			require.True(t, found, "k%d was rewritten", i)
			require.Equal(t, msVersion(5000), v)
		} else {
			require.False(t, found, "k%d", i)
		}
	}
}

// Collect reads the candidates' versions without the lock: a write that
// lands between those reads and the locked deletion, to a key it read as
// a candidate, is seen (its partition's count moved) and kept, and the
// other candidates of that partition and of the others are removed.
func TestCollectWriteBetweenReadAndDelete(t *testing.T) {
	s := openTemp(t)
	// a and c in one partition, b in another.
	keyIn := func(part partition.ID, not string) string {
		for i := 0; ; i++ {
			k := fmt.Sprintf("k%d", i)
			if p, _ := partition.Of([]byte(k)); p == part && k != not {
				return k
			}
		}
	}
	a := "a"
	pa, _ := partition.Of([]byte(a))
	c := keyIn(pa, a)
	b := "b"
	for p, _ := partition.Of([]byte(b)); p == pa; p, _ = partition.Of([]byte(b)) {
		b += "b"
	}
	dead := msVersion(1000)
	for _, k := range []string{a, b, c} {
		require.NoError(t, s.Apply([]byte(k), &record.Record{Version: dead, Tombstone: true}))
	}
	live := msVersion(1500) // below the horizon to come, above the current one
	s.gc.read = func() {
		require.NoError(t, s.Apply([]byte(a), &record.Record{Version: live, Value: []byte("back")}))
	}
	removed, err := s.Collect([]Candidate{{[]byte(a), dead}, {[]byte(b), dead}, {[]byte(c), dead}}, msVersion(2000), nil)
	require.NoError(t, err)
	require.ElementsMatch(t, [][]byte{[]byte(b), []byte(c)}, removed)
	v, found, err := s.Version([]byte(a))
	require.NoError(t, err)
	require.True(t, found, "the write that landed meanwhile is kept")
	require.Equal(t, live, v)
}

// BenchmarkCollectWriteStall measures what a collection of 1024 records
// costs the writes that arrive meanwhile: the longest and the mean write
// while Collect runs (a write waits while Collect holds the lock).
func BenchmarkCollectWriteStall(b *testing.B) {
	b.ReportAllocs()
	s, err := Open(filepath.Join(b.TempDir(), "db"), Options{Sync: true})
	require.NoError(b, err)
	defer s.Close()
	const n = 1024
	value := make([]byte, 1024)
	var worst, sum time.Duration
	var writes int
	for iter := range b.N {
		b.StopTimer()
		cands := make([]Candidate, 0, n)
		for i := range 20 * n { // data beyond the memtable, most of it cold
			k := fmt.Sprintf("i%d-k%d", iter, i)
			rec := record.Record{Version: msVersion(1000), Value: value}
			if i%20 == 0 {
				rec = record.Record{Version: msVersion(1000), Tombstone: true}
				cands = append(cands, Candidate{Key: []byte(k), Version: rec.Version})
			}
			require.NoError(b, s.Apply([]byte(k), &rec))
		}
		require.NoError(b, s.db.Flush())
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				rec := record.Record{Version: msVersion(5000), Value: value}
				require.NoError(b, s.Apply(fmt.Appendf(nil, "w%d-%d", iter, i), &rec))
				d := time.Since(start)
				worst, sum, writes = max(worst, d), sum+d, writes+1
			}
		}()
		b.StartTimer()
		_, err := s.Collect(cands, msVersion(2000), nil)
		b.StopTimer()
		require.NoError(b, err)
		close(stop)
		<-done
	}
	b.ReportMetric(float64(worst.Microseconds()), "worst-write-µs")
	if writes > 0 {
		b.ReportMetric(float64(sum.Microseconds())/float64(writes), "mean-write-µs")
	}
}

// BenchmarkCandidates: a collector's scan of the whole index (every
// partition, as a pass reads it) on a store of 100k records flushed to
// disk, none of them collectable; the cost per index entry read, which is
// what --gc-rate paces.
func BenchmarkCandidates(b *testing.B) {
	b.ReportAllocs()
	const n = 100_000
	s := benchStore(b, n)
	b.ResetTimer()
	read := 0
	for range b.N {
		for p := range partition.Count {
			r, err := s.Candidates(partition.ID(p), msVersion(2000), msVersion(2000), func([]byte, IndexEntry) error {
				return nil
			})
			require.NoError(b, err)
			read += r
		}
	}
	b.StopTimer()
	require.Equal(b, n*b.N, read)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(read), "ns/entry")
}

// benchStore opens a store of n records of 1 KiB (keys k0...), flushed to
// disk, closed when b ends.
func benchStore(b *testing.B, n int) *Store {
	s, err := Open(filepath.Join(b.TempDir(), "db"), Options{})
	require.NoError(b, err)
	b.Cleanup(func() { s.Close() })
	value := make([]byte, 1024)
	for i := range n {
		rec := record.Record{Version: msVersion(1000), Value: value}
		require.NoError(b, s.Apply(fmt.Appendf(nil, "k%d", i), &rec))
	}
	require.NoError(b, s.db.Flush())
	return s
}

// heldSync is a store on a file system that, while hold is set, holds
// the next WAL sync until releaseSync, and says when it holds one (held).
type heldSync struct {
	*Store
	hold        atomic.Bool
	held        chan struct{}
	releaseSync func()
}

// openHeldSync opens a heldSync store, closed (its sync released first)
// at the test's end.
func openHeldSync(t *testing.T) *heldSync {
	t.Helper()
	h := &heldSync{held: make(chan struct{}, 1)}
	release := make(chan struct{})
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		isSync := op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData || op.Kind == errorfs.OpFileSyncTo
		if isSync && h.hold.Load() && strings.HasSuffix(op.Path, ".log") {
			select {
			case h.held <- struct{}{}:
			default:
			}
			<-release
		}
		return nil
	})
	s, err := Open("db", Options{FS: errorfs.Wrap(vfs.NewMem(), inj), Sync: true})
	require.NoError(t, err)
	h.Store = s
	h.releaseSync = sync.OnceFunc(func() { close(release) })
	t.Cleanup(func() {
		h.releaseSync() // before Close, which waits for the write
		s.Close()
	})
	return h
}

// AwaitCommits waits for a write that took its arrival time before the
// call and whose commit waits for its WAL's sync: an exchange that hashed
// without it would be counted by garbage collection for that record.
func TestAwaitCommitsWaitsForAWriteInFlight(t *testing.T) {
	h := openHeldSync(t)
	s, held, releaseSync := h.Store, h.held, h.releaseSync
	hold := &h.hold

	hold.Store(true)
	applied := make(chan error, 1)
	go func() { applied <- s.Apply([]byte("k"), &record.Record{Version: msVersion(1000), Tombstone: true}) }()
	<-held // the write took its arrival time and waits for the WAL's sync
	hold.Store(false)
	awaited := make(chan struct{})
	go func() {
		s.AwaitCommits()
		close(awaited)
	}()
	select {
	case <-awaited:
		t.Fatal("AwaitCommits returned while a write that arrived before it was not committed")
	case <-time.After(200 * time.Millisecond): // the behaviour under test: it waits, however long the sync
	}
	releaseSync()
	<-awaited
	require.NoError(t, <-applied)
	_, found, err := s.Version([]byte("k"))
	require.NoError(t, err)
	require.True(t, found)
}

// TestAwaitCommitsWaitsForACollectInFlightOnAFailedStore: a store can
// fail without parking anything inside Pebble: an EIO on an sstable (a
// compaction's or a flush's output, fileError) fails it while Pebble goes
// on, and the commits already past Store.write's check complete. A
// Collect whose synced commit is under way when that happens finishes
// (its summary touched, its lock released) after AwaitCommits returned,
// which AwaitCommits promises against ("every Collect under way has
// committed or withdrawn"): an exchange that starts then hashes the
// partition from a summary that still holds the removed record, and
// package membership's barrier (no removal decided under the old map
// completes after the node acknowledges the new one) does not hold.
func TestAwaitCommitsWaitsForACollectInFlightOnAFailedStore(t *testing.T) {
	hs := openHeldSync(t)
	s, held, releaseSync := hs.Store, hs.held, hs.releaseSync
	hold := &hs.hold

	v := msVersion(1000)
	key := []byte("k")
	part, _ := partition.Of(key)
	require.NoError(t, s.Apply(key, rec(v, "")))
	withK, _, err := s.PartitionHash(part) // the summary is current
	require.NoError(t, err)

	hold.Store(true)
	collected := make(chan error, 1)
	go func() {
		_, err := s.Collect([]Candidate{{Key: key, Version: v}}, v+1, nil)
		collected <- err
	}()
	<-held // the Collect holds the lock, its commit waits for the WAL's sync
	hold.Store(false)
	// An sstable's write fails with EIO: the store fails, Pebble goes on.
	s.fileError("db/000042.sst", &os.PathError{Op: "write", Path: "db/000042.sst", Err: syscall.EIO})
	require.ErrorIs(t, s.Failure(), ErrStoreFailed)

	awaited := make(chan uint64, 1)
	go func() {
		s.AwaitCommits()
		h, _, _ := s.PartitionHash(part) // an exchange's first hash
		awaited <- h
	}()
	var h uint64
	early := false
	select {
	case h = <-awaited:
		early = true
	case <-time.After(200 * time.Millisecond): // the sync, however long
	}
	releaseSync()
	require.NoError(t, <-collected, "the Collect's commit was past the failure check: it commits")
	_, found, err := s.Version(key)
	require.NoError(t, err)
	require.False(t, found)
	if !early {
		select {
		case h = <-awaited:
		case <-time.After(5 * time.Second):
			t.Fatal("AwaitCommits did not return")
		}
	}
	assert.False(t, early, "AwaitCommits returned while a Collect under way had not committed")
	assert.NotEqual(t, withK, h, "the exchange hashed the removed record")
}

package store

import (
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/record"
)

func open(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir, Options{BlockCacheBytes: 1 << 20, MemTableBytes: 1 << 20})
	require.NoError(t, err)
	return s
}

func TestLastWriteWinsAnyOrder(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	key := []byte("k")
	recs := []record.Record{
		{Version: 5, Value: []byte("five")},
		{Version: 9, Tombstone: true},
		{Version: 7, Value: []byte("seven")},
		{Version: 1, Value: []byte("one")},
	}
	for _, r := range recs {
		require.NoError(t, s.Apply(key, &r))
	}
	got, found, err := get(s, key)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, uint64(9), got.Version)
	require.True(t, got.Tombstone)

	r := record.Record{Version: 10, Value: []byte("ten")}
	require.NoError(t, s.Apply(key, &r))
	got, _, _ = get(s, key)
	require.Equal(t, "ten", string(got.Value))
}

// The merge operator must keep the newest version through flushes and
// compactions, whichever subset of operands each one sees.
func TestLastWriteWinsSurvivesCompaction(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	rng := rand.New(rand.NewPCG(1, 2))
	want := map[string]uint64{}
	for i := 0; i < 20000; i++ {
		k := fmt.Sprintf("k%03d", rng.IntN(200))
		v := rng.Uint64N(1 << 40)
		r := record.Record{Version: v, Value: []byte(fmt.Sprint(v)), Tombstone: v%7 == 0}
		if r.Tombstone {
			r.Value = nil
		}
		require.NoError(t, s.Apply([]byte(k), &r))
		if v > want[k] {
			want[k] = v
		}
		if i%5000 == 4999 {
			require.NoError(t, s.db.Flush())
		}
	}
	require.NoError(t, s.db.Compact(t.Context(), []byte{0}, []byte{0xff}, true))
	require.NoError(t, s.Close())
	s = open(t, dir)
	defer s.Close()
	for k, v := range want {
		got, found, err := get(s, []byte(k))
		require.NoError(t, err)
		require.True(t, found)
		require.Equal(t, v, got.Version, k)
	}
}

func TestConcurrentWritersConverge(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				r := record.Record{Version: uint64(i*8 + g + 1), Value: []byte{byte(g)}}
				require.NoError(t, s.Apply([]byte("hot"), &r))
			}
		}()
	}
	wg.Wait()
	got, _, err := get(s, []byte("hot"))
	require.NoError(t, err)
	require.Equal(t, uint64(499*8+7+1), got.Version)
}

func TestAbsentAndBinaryKeys(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	_, found, err := get(s, []byte("nope"))
	require.NoError(t, err)
	require.False(t, found)
	k := []byte{0, 1, 0xff, '\n'}
	r := record.Record{Version: 1, Value: []byte{}}
	require.NoError(t, s.Apply(k, &r))
	got, found, err := get(s, k)
	require.NoError(t, err)
	require.True(t, found)
	require.Empty(t, got.Value)
}

func TestRefusesForeignLayout(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	require.NoError(t, s.db.Set([]byte(layoutKey), []byte("other-layout"), nil))
	require.NoError(t, s.Close())
	_, err := Open(dir, Options{})
	require.ErrorContains(t, err, "layout")
}

// Write stalls are counted and timed from Pebble's events.
func TestStallAccounting(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	l := s.eventListener(slog.New(slog.DiscardHandler))
	n, total := s.Stalls()
	require.Zero(t, n)
	require.Zero(t, total)
	l.WriteStallEnd() // an end without a begin counts nothing
	l.WriteStallBegin(pebble.WriteStallBeginInfo{Reason: "memtable count limit reached"})
	time.Sleep(20 * time.Millisecond) // a stall of a known length is the behaviour under test
	l.WriteStallEnd()
	n, total = s.Stalls()
	require.Equal(t, uint64(1), n)
	require.GreaterOrEqual(t, total, 20*time.Millisecond)
}

// get reads key's record the way the read cache does.
func get(s *Store, key []byte) (record.Record, bool, error) {
	buf, found, err := s.AppendEnvelope(nil, key)
	if err != nil || !found {
		return record.Record{}, found, err
	}
	rec, err := record.Decode(buf)
	return rec, true, err
}

// A store on an in-memory file system keeps everything it persists across
// a Close and an Open of the same FS, as a directory does: what lets the
// in-process test clusters restart a node without a disk.
func TestMemFSSurvivesReopen(t *testing.T) {
	fs := vfs.NewMem()
	o := Options{BlockCacheBytes: 1 << 20, MemTableBytes: 1 << 20, FS: fs}
	s, err := Open("node1", o)
	require.NoError(t, err)
	require.NoError(t, s.Apply([]byte("k"), &record.Record{Version: 7, Value: []byte("v")}))
	require.NoError(t, s.SetIdentity(Identity{Cluster: 42, Node: 1, Formed: true}))
	require.NoError(t, s.SetClockBound(99))
	require.NoError(t, s.Close())

	s, err = Open("node1", o)
	require.NoError(t, err)
	defer s.Close()
	got, found, err := get(s, []byte("k"))
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, "v", string(got.Value))
	id, ok, err := s.Identity()
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, Identity{Cluster: 42, Node: 1, Formed: true}, id)
	bound, err := s.ClockBound()
	require.NoError(t, err)
	require.Equal(t, uint64(99), bound)
	_, err = os.Stat("node1")
	require.True(t, os.IsNotExist(err), "nothing reaches the disk")
}

// Flushes and compactions are timed: a real flush, and a compaction event,
// each show in their histogram as the collector exports it.
func TestJobTimes(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	require.NoError(t, s.Apply([]byte("k"), &record.Record{Version: 1 << 20, Value: []byte("v")}))
	require.NoError(t, s.db.Flush())
	s.eventListener(slog.New(slog.DiscardHandler)).CompactionEnd(pebble.CompactionInfo{TotalDuration: 1500 * time.Millisecond})
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.Collector())
	families, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]uint64{}
	for _, f := range families {
		if h := f.GetMetric()[0].GetHistogram(); h != nil {
			got[f.GetName()] = h.GetSampleCount()
		}
	}
	require.GreaterOrEqual(t, got["dhtkv_pebble_flush_duration_seconds"], uint64(1), "the flush")
	require.Equal(t, uint64(1), got["dhtkv_pebble_compaction_duration_seconds"], "the compaction")
}

// BenchmarkApplyBatch applies batches of random 1 KiB records to a store
// without fsync (the CPU of a commit: building the batch, the WAL's write,
// the memtable inserts of each record's data and index keys), as a replica
// applies a coordinator's batch (replica.ApplyRemote).
func BenchmarkApplyBatch(b *testing.B) {
	for _, size := range []int{1, 12, 64, 1024} {
		b.Run(fmt.Sprintf("records=%d", size), func(b *testing.B) {
			o := DefaultOptions()
			o.Sync = false
			o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
			s, err := Open(filepath.Join(b.TempDir(), "db"), o)
			require.NoError(b, err)
			b.Cleanup(func() { s.Close() })
			value := make([]byte, 1024)
			rng := rand.New(rand.NewPCG(1, 2))
			ws := make([]Write, size)
			recs := make([]record.Record, size)
			b.ReportAllocs()
			b.SetBytes(int64(size * len(value)))
			for i := 0; b.Loop(); i++ {
				for j := range ws {
					recs[j] = record.Record{Version: msVersion(1000 + int64(i)), Value: value}
					ws[j] = Write{Key: fmt.Appendf(nil, "k%d", rng.IntN(1_000_000)), Rec: &recs[j]}
				}
				if err := s.ApplyBatch(ws); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// An identity reads back as written, its times to the millisecond; one
// written by a release before the times (identityKey alone) reads with
// zero times; its 10 bytes are what every release reads.
func TestIdentityEncoding(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	created, formed := time.UnixMilli(1_790_000_000_123), time.UnixMilli(1_790_000_100_456)
	for _, id := range []Identity{
		{Cluster: 42, Node: 7},
		{Cluster: 1 << 63, Node: 255, Rebuilding: true, Formed: true, Unconfirmed: true, Created: created, FormedAt: formed},
		{Cluster: 3, Node: 1, Unconfirmed: true, Created: created},
	} {
		require.NoError(t, s.SetIdentity(id))
		got, ok, err := s.Identity()
		require.NoError(t, err)
		require.True(t, ok)
		require.True(t, got.Created.Equal(id.Created) && got.FormedAt.Equal(id.FormedAt), "%+v", got)
		got.Created, got.FormedAt = id.Created, id.FormedAt
		require.Equal(t, id, got)
		v, err := s.meta(identityKey)
		require.NoError(t, err)
		require.Len(t, v, 10, "what a release before the times reads")
	}
	require.NoError(t, s.db.Delete([]byte(identityTimesKey), pebble.Sync))
	require.NoError(t, s.db.Set([]byte(identityKey), []byte{0, 0, 0, 0, 0, 0, 0, 42, 3, flagFormed}, pebble.Sync))
	got, ok, err := s.Identity()
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, Identity{Cluster: 42, Node: 3, Formed: true}, got, "a release before the times")
	require.NoError(t, s.db.Set([]byte(identityKey), []byte{1, 2, 3}, pebble.Sync))
	_, _, err = s.Identity()
	require.ErrorContains(t, err, "3 bytes, want 10")
}

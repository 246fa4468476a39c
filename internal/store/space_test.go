package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/sizeflag"
)

// volume is a data volume whose free space the test sets: its statfs is
// Options.StatFS.
type volume struct {
	mu          sync.Mutex
	free, total uint64
	reads       int
}

func newVolume(free, total uint64) *volume { return &volume{free: free, total: total} }

func (v *volume) statfs(string) (vfs.DiskUsage, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.reads++
	return vfs.DiskUsage{AvailBytes: v.free, TotalBytes: v.total, UsedBytes: v.total - v.free}, nil
}

func (v *volume) setFree(free uint64) {
	v.mu.Lock()
	v.free = free
	v.mu.Unlock()
}

func (v *volume) readCount() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.reads
}

// guarded opens a store on fs (a MemFS, or one wrapping it) whose volume
// is vol, with the options edit changes.
func guarded(t *testing.T, fs vfs.FS, vol *volume, edit func(*Options)) *Store {
	t.Helper()
	o := Options{
		Sync: true, BlockCacheBytes: 1 << 20, MemTableBytes: 1 << 20, FS: fs, StatFS: vol.statfs,
		MinFreeSpace:       sizeflag.Amount{Percent: 10},
		SpaceCheckInterval: time.Nanosecond, // every write reads the volume
		Logger:             slog.New(slog.DiscardHandler),
	}
	if edit != nil {
		edit(&o)
	}
	s, err := Open("/data", o)
	require.NoError(t, err)
	return s
}

func rec(v uint64, value string) *record.Record {
	return &record.Record{Version: v, Value: []byte(value)}
}

const mib = 1 << 20

// Below --min-free-space the store refuses the writes that grow it, and
// takes them again, without a restart, once free space is back above the
// threshold by a quarter of it: between the two it keeps the state it was
// in (hysteresis). Reads go on throughout, and a refused write stores
// nothing.
func TestSpaceGuardHysteresis(t *testing.T) {
	vol := newVolume(500*mib, 1000*mib) // 10%: refuse below 100 MiB, resume at 125 MiB
	s := guarded(t, vfs.NewMem(), vol, nil)
	defer s.Close()
	require.NoError(t, s.Apply([]byte("before"), rec(1, "kept")))
	version := uint64(10)
	for _, step := range []struct {
		free     uint64
		writable bool
	}{
		{500 * mib, true},
		{101 * mib, true},
		{99 * mib, false},  // below the threshold
		{110 * mib, false}, // back above it, not above the resume mark
		{124 * mib, false},
		{125 * mib, true}, // at the resume mark
		{110 * mib, true}, // between the two: still writable
		{100 * mib, true},
		{99 * mib, false},
		{0, false},
		{400 * mib, true},
	} {
		vol.setFree(step.free)
		version++
		key := []byte(fmt.Sprintf("k%d", version))
		err := s.Apply(key, rec(version, "v"))
		_, found, gerr := get(s, key)
		require.NoError(t, gerr)
		hint := s.AddHint(Hint{Target: 1, Key: key, Envelope: rec(version, "v").Encode()})
		if step.writable {
			require.NoError(t, err, "free %d MiB", step.free/mib)
			require.NoError(t, hint, "free %d MiB", step.free/mib)
			require.True(t, found)
			require.NoError(t, s.CheckWrite())
		} else {
			require.ErrorIs(t, err, ErrInsufficientStorage, "free %d MiB", step.free/mib)
			require.ErrorIs(t, hint, ErrInsufficientStorage, "free %d MiB", step.free/mib)
			require.False(t, found, "a refused write stores nothing")
			require.ErrorIs(t, s.CheckWrite(), ErrInsufficientStorage)
			require.Contains(t, err.Error(), "below --min-free-space 10% (100 MiB): writes are refused until 125 MiB are free")
		}
		sp := s.Space()
		require.Equal(t, !step.writable, sp.Full)
		require.Equal(t, step.free, sp.Free)
		require.Equal(t, uint64(100*mib), sp.MinFree)
		require.Equal(t, uint64(125*mib), sp.ResumeAt)
		// What a full volume still takes: the control writes, and
		// deletions, which free space.
		require.NoError(t, s.SetClockBound(version))
		require.NoError(t, s.DeleteHints([]Hint{{Target: 1, Key: key, Envelope: rec(version, "v").Encode()}}))
		got, found, err := get(s, []byte("before"))
		require.NoError(t, err)
		require.True(t, found)
		require.Equal(t, "kept", string(got.Value))
	}
}

// The threshold is a size or a percentage of the volume, and 0 turns the
// guard off.
func TestSpaceGuardThreshold(t *testing.T) {
	for _, tc := range []struct {
		min      sizeflag.Amount
		free     uint64
		writable bool
	}{
		{sizeflag.Amount{Percent: 5}, 51 * mib, true},
		{sizeflag.Amount{Percent: 5}, 50 * mib, true}, // 5% of 1000 MiB is 50 MiB: at it, not below
		{sizeflag.Amount{Percent: 5}, 49 * mib, false},
		{sizeflag.Amount{Bytes: 200 * mib}, 201 * mib, true},
		{sizeflag.Amount{Bytes: 200 * mib}, 199 * mib, false},
		{sizeflag.Amount{}, 0, true},
	} {
		t.Run(fmt.Sprintf("%v at %d MiB free", tc.min, tc.free/mib), func(t *testing.T) {
			s := guarded(t, vfs.NewMem(), newVolume(tc.free, 1000*mib), func(o *Options) { o.MinFreeSpace = tc.min })
			defer s.Close()
			err := s.Apply([]byte("k"), rec(1, "v"))
			if tc.writable {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, ErrInsufficientStorage)
			}
		})
	}
}

// The guard does not wait for its interval when the writes since its last
// reading would take the volume below the threshold: it reads it again
// then, and refuses at once once it is below.
func TestSpaceGuardCountsBytesWritten(t *testing.T) {
	vol := newVolume(100*mib+256<<10, 1000*mib) // 256 KiB above 10%
	s := guarded(t, vfs.NewMem(), vol, func(o *Options) { o.SpaceCheckInterval = time.Hour })
	defer s.Close()
	require.NoError(t, s.Apply([]byte("first"), rec(1, "v")))
	reads := vol.readCount()
	value := strings.Repeat("x", 64<<10)
	for i := range 3 { // 192 KiB of 256: no reading needed
		require.NoError(t, s.Apply([]byte(fmt.Sprintf("k%d", i)), rec(uint64(i+2), value)))
	}
	require.Equal(t, reads, vol.readCount(), "within the estimate: the hour-old reading is used")
	// The volume filled meanwhile (another writer, a compaction): the
	// write that the estimate takes below the threshold reads it again.
	vol.setFree(90 * mib)
	err := s.Apply([]byte("k3"), rec(10, value))
	require.ErrorIs(t, err, ErrInsufficientStorage)
	require.Greater(t, vol.readCount(), reads)
}

// An ENOSPC that reaches Pebble despite the guard (a volume filled by
// another process between two readings) neither crashes the node nor
// fails the store: Pebble's write waits while the store removes the
// emergency ballast, then is tried again and succeeds (vfs.OnDiskFull),
// and the guard refuses writes from then on, until a reading finds the
// volume back above the resume mark.
func TestENOSPCSpendsTheBallast(t *testing.T) {
	var full atomic.Bool
	var enospc atomic.Int32
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		switch {
		case op.Kind == errorfs.OpRemove && strings.HasSuffix(op.Path, BallastFile):
			full.Store(false) // the ballast's space is back
		case full.Load() && op.Kind.ReadOrWrite() == errorfs.OpIsWrite && strings.HasSuffix(op.Path, ".log"):
			enospc.Add(1)
			return &os.PathError{Op: "write", Path: op.Path, Err: syscall.ENOSPC}
		}
		return nil
	})
	vol := newVolume(500*mib, 1000*mib)
	s := guarded(t, errorfs.Wrap(vfs.NewMem(), inj), vol, func(o *Options) {
		o.Ballast = sizeflag.Amount{Bytes: 256 << 10}
		o.SpaceCheckInterval = time.Hour // the test's volume is read when the test says
	})
	defer s.Close()
	require.Equal(t, uint64(256<<10), s.Space().BallastBytes)
	require.NoError(t, s.Apply([]byte("a"), rec(1, "before")))

	full.Store(true)
	require.NoError(t, s.Apply([]byte("b"), rec(2, "through the full disk")), "the retried write succeeds")
	require.Positive(t, enospc.Load(), "Pebble met ENOSPC")
	require.NoError(t, s.Failure())
	got, found, err := get(s, []byte("b"))
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, "through the full disk", string(got.Value))

	err = s.Apply([]byte("c"), rec(3, "refused"))
	require.ErrorIs(t, err, ErrInsufficientStorage)
	require.Contains(t, err.Error(), "the emergency ballast was removed, freeing 256 KiB")
	sp := s.Space()
	require.True(t, sp.Full)
	require.Zero(t, sp.BallastBytes)
	ws := s.Warnings()
	require.Len(t, ws, 1)
	require.Contains(t, ws[0], "the emergency ballast is spent")

	// Space comes back: the next reading resumes writes.
	vol.setFree(200 * mib)
	stale := *s.guard.cur.Load()
	stale.at = time.Time{}
	s.guard.cur.Store(&stale)
	require.NoError(t, s.Apply([]byte("c"), rec(4, "after")))
	require.Empty(t, s.Warnings())
}

// The ballast is made at Open, sized as --ballast-size says (a percentage
// of the volume at most 1 GiB), kept across restarts, resized or removed
// when the flag changes, and not made where it would leave the volume
// below the resume mark. Pebble ignores it.
func TestBallast(t *testing.T) {
	require.Equal(t, uint64(10*mib), ballastBytes(sizeflag.Amount{Percent: 1}, 1000*mib))
	require.Equal(t, uint64(1<<30), ballastBytes(sizeflag.Amount{Percent: 1}, 1<<40), "1% of 1 TiB: capped at 1 GiB")
	require.Equal(t, uint64(3<<30), ballastBytes(sizeflag.Amount{Bytes: 3 << 30}, 1<<40), "a size is taken as given")

	fs := vfs.NewMem()
	vol := newVolume(50*mib, 100*mib) // 1% is 1 MiB
	reopen := func(ballast sizeflag.Amount) *Store {
		return guarded(t, fs, vol, func(o *Options) { o.Ballast = ballast })
	}
	size := func() int64 {
		fi, err := fs.Stat("/data/" + BallastFile)
		if err != nil {
			return 0
		}
		return fi.Size()
	}
	s := reopen(sizeflag.Amount{Percent: 1})
	require.NoError(t, s.Apply([]byte("k"), rec(1, "v")))
	require.Equal(t, int64(mib), size())
	require.Equal(t, "/data/"+BallastFile, s.Space().Ballast)
	require.NoError(t, s.Close())

	s = reopen(sizeflag.Amount{Percent: 1})
	require.Equal(t, int64(mib), size(), "kept")
	_, found, err := get(s, []byte("k"))
	require.NoError(t, err)
	require.True(t, found)
	require.NoError(t, s.Close())

	s = reopen(sizeflag.Amount{Bytes: 64 << 10})
	require.Equal(t, int64(64<<10), size(), "resized")
	require.NoError(t, s.Close())

	s = reopen(sizeflag.Amount{})
	require.Zero(t, size(), "--ballast-size 0 removes it")
	require.NoError(t, s.Close())

	vol.setFree(12 * mib) // 10% of 100 MiB: resume at 12.5 MiB
	s = reopen(sizeflag.Amount{Percent: 1})
	require.Zero(t, size(), "not made on a volume it would take below the resume mark")
	require.NoError(t, s.Close())
}

// On the operating system's file system the ballast is allocated at once
// (fallocate), and a data directory holding it opens as before.
func TestBallastOnDisk(t *testing.T) {
	dir := t.TempDir()
	o := Options{BlockCacheBytes: 1 << 20, MemTableBytes: 1 << 20, Ballast: sizeflag.Amount{Bytes: 2 * mib}, Logger: slog.New(slog.DiscardHandler)}
	s, err := Open(dir, o)
	require.NoError(t, err)
	require.NoError(t, s.Apply([]byte("k"), rec(1, "v")))
	require.NoError(t, s.Close())
	fi, err := os.Stat(filepath.Join(dir, BallastFile))
	require.NoError(t, err)
	require.Equal(t, int64(2*mib), fi.Size())
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		require.GreaterOrEqual(t, st.Blocks*512, int64(2*mib), "its blocks are allocated, not a sparse file")
	}
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	s, err = Open(dir, o)
	require.NoError(t, err)
	defer s.Close()
	_, found, err := get(s, []byte("k"))
	require.NoError(t, err)
	require.True(t, found)
}

// walFault fails the WAL's writes or syncs with err while on.
type walFault struct {
	on   atomic.Bool
	sync bool // syncs, else writes
	err  error
	hits atomic.Int32
}

func (f *walFault) MaybeError(op errorfs.Op) error {
	if !f.on.Load() || !strings.HasSuffix(op.Path, ".log") {
		return nil
	}
	switch op.Kind {
	case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
		if !f.sync {
			return nil
		}
	case errorfs.OpFileWrite, errorfs.OpFileWriteAt:
		if f.sync {
			return nil
		}
	default:
		return nil
	}
	f.hits.Add(1)
	return f.err
}

func (f *walFault) String() string { return "walFault" }

// A WAL write or sync that fails (EIO, or an ENOSPC the ballast could not
// cure) is Pebble's "fatal commit error", which used to end the process.
// Now it fails that write and the store: every later write is refused at
// once with ErrInsufficientStorage and ErrStoreFailed, nothing panics,
// reads go on, the collector still answers, Close returns. And nothing
// acknowledged is lost: after a crash that keeps only what was synced,
// every write acknowledged before the failure is there.
func TestWALErrorFailsTheStore(t *testing.T) {
	for _, tc := range []struct {
		name string
		sync bool
		err  error
	}{
		{"write EIO", false, syscall.EIO},
		{"sync EIO", true, syscall.EIO},
		{"write ENOSPC without ballast", false, syscall.ENOSPC},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := vfs.NewCrashableMem()
			fault := &walFault{sync: tc.sync, err: &os.PathError{Op: "write", Path: "wal", Err: tc.err}}
			s := guarded(t, errorfs.Wrap(mem, fault), newVolume(500*mib, 1000*mib), nil)
			s.closeWait = 2 * time.Second
			acked := map[string]string{}
			for i := range 50 {
				k, v := fmt.Sprintf("k%02d", i), fmt.Sprintf("v%d", i)
				require.NoError(t, s.Apply([]byte(k), rec(uint64(i+1), v)))
				acked[k] = v
			}
			fault.on.Store(true)
			err := s.Apply([]byte("failed"), rec(100, "never acknowledged"))
			require.ErrorIs(t, err, ErrInsufficientStorage)
			require.ErrorIs(t, err, ErrStoreFailed)
			require.Positive(t, fault.hits.Load())
			require.ErrorIs(t, s.Failure(), ErrStoreFailed)
			require.ErrorIs(t, s.Failure(), tc.err)

			hits := fault.hits.Load()
			err = s.Apply([]byte("later"), rec(101, "refused"))
			require.ErrorIs(t, err, ErrStoreFailed)
			require.Equal(t, hits, fault.hits.Load(), "a later write does not reach Pebble")
			require.ErrorIs(t, s.CheckWrite(), ErrStoreFailed)
			require.ErrorIs(t, s.SetClockBound(1<<40), ErrStoreFailed)
			require.ErrorIs(t, s.Checkpoint("/snap", time.Time{}, 0), ErrStoreFailed)
			for k, v := range acked {
				got, found, err := get(s, []byte(k))
				require.NoError(t, err)
				require.True(t, found, k)
				require.Equal(t, v, string(got.Value))
			}
			ws := s.Warnings()
			require.NotEmpty(t, ws)
			require.Contains(t, ws[0], "store failed a write")
			refused := scrape(t, s)
			require.Equal(t, 1.0, refused["dhtkv_store_failed"])
			require.GreaterOrEqual(t, refused[`dhtkv_store_writes_refused_total{reason="store_failed"}`], 3.0)
			_ = s.Close() // may report the WAL's error; must return

			// A crash now keeps what was synced: every acknowledged write.
			fault.on.Store(false)
			after, err := Open("/data", Options{FS: mem.CrashClone(vfs.CrashCloneCfg{}), BlockCacheBytes: 1 << 20, MemTableBytes: 1 << 20, Logger: slog.New(slog.DiscardHandler)})
			require.NoError(t, err)
			defer after.Close()
			for k, v := range acked {
				got, found, err := get(after, []byte(k))
				require.NoError(t, err)
				require.True(t, found, "acknowledged %s lost", k)
				require.Equal(t, v, string(got.Value))
			}
			require.NoError(t, after.Apply([]byte("new"), rec(200, "v")), "reopened, it takes writes")
		})
	}
}

// With --sync=false no commit waits for the WAL: Pebble's WAL writer
// keeps its error to itself for many commits, and the memtable rotation
// that meets it then cannot be recovered (db.go's rotateWAL panics with
// its mutex unlocked: the process dies). The store notices the failed
// write as the WAL writer meets it (watchFS), and refuses the next
// commit before it reaches Pebble.
func TestWALErrorFailsTheStoreUnsynced(t *testing.T) {
	fault := &walFault{err: &os.PathError{Op: "write", Path: "wal", Err: syscall.EIO}}
	s := guarded(t, errorfs.Wrap(vfs.NewMem(), fault), newVolume(500*mib, 1000*mib), func(o *Options) { o.Sync = false })
	s.closeWait = 2 * time.Second
	defer s.Close()
	require.NoError(t, s.Apply([]byte("before"), rec(1, "v")))
	fault.on.Store(true)
	value := strings.Repeat("x", 4<<10)
	// The WAL writer writes a 32 KiB block once it is full: 16 writes of
	// 4 KiB fill two (the memtable, 1 MiB, would rotate after 250). The
	// store may fail before the 16th.
	for i := range 16 {
		if err := s.Apply([]byte(fmt.Sprintf("k%d", i)), rec(uint64(i+2), value)); err != nil {
			require.ErrorIs(t, err, ErrStoreFailed)
			break
		}
	}
	require.Eventually(t, func() bool { return s.Failure() != nil }, 10*time.Second, time.Millisecond)
	require.Positive(t, fault.hits.Load())
	require.ErrorIs(t, s.Failure(), syscall.EIO)
	require.ErrorIs(t, s.Apply([]byte("after"), rec(1000, value)), ErrStoreFailed)
	_, found, err := get(s, []byte("before"))
	require.NoError(t, err)
	require.True(t, found)
}

// A MANIFEST write that fails during a flush is Pebble's Fatalf on its
// own goroutine: the store fails, that goroutine is parked (its locks
// held), and the node goes on serving reads; a scrape does not hang on
// Pebble's metrics, and Close gives up after closeWait.
func TestManifestErrorFailsTheStore(t *testing.T) {
	var on atomic.Bool
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if on.Load() && strings.Contains(op.Path, "MANIFEST") && op.Kind.ReadOrWrite() == errorfs.OpIsWrite {
			return &os.PathError{Op: "write", Path: op.Path, Err: syscall.EIO}
		}
		return nil
	})
	s := guarded(t, errorfs.Wrap(vfs.NewMem(), inj), newVolume(500*mib, 1000*mib), nil)
	s.closeWait = 100 * time.Millisecond
	require.NoError(t, s.Apply([]byte("k"), rec(1, "v")))
	on.Store(true)
	_, err := s.db.AsyncFlush()
	require.NoError(t, err)
	require.Eventually(t, func() bool { return s.Failure() != nil }, 10*time.Second, time.Millisecond)
	require.Contains(t, s.Failure().Error(), "MANIFEST")
	got, found, err := get(s, []byte("k"))
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, "v", string(got.Value))
	require.ErrorIs(t, s.Apply([]byte("k2"), rec(2, "v")), ErrStoreFailed)
	require.Equal(t, 1.0, scrape(t, s)["dhtkv_store_failed"])
	err = s.Close()
	require.Error(t, err)
	require.Contains(t, err.Error(), "left to the process's exit")
}

// Pebble's background errors are counted, and logged at most once per
// backgroundLogEvery; an EIO among them fails the store, an ENOSPC does
// not (the guard has it).
func TestBackgroundErrors(t *testing.T) {
	s := guarded(t, vfs.NewMem(), newVolume(500*mib, 1000*mib), nil)
	defer s.Close()
	var logged atomic.Int32
	log := slog.New(countHandler{&logged})
	for range 5 {
		s.backgroundError(log, fmt.Errorf("flush: %w", syscall.ENOSPC))
	}
	require.Equal(t, int32(1), logged.Load())
	require.NoError(t, s.Failure())
	s.backgroundError(log, fmt.Errorf("compaction: %w", syscall.EIO))
	require.ErrorIs(t, s.Failure(), syscall.EIO)
	require.Equal(t, 6.0, scrape(t, s)["dhtkv_pebble_background_errors_total"])
}

// countHandler counts the records logged through it.
type countHandler struct{ n *atomic.Int32 }

func (h countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countHandler) Handle(context.Context, slog.Record) error {
	h.n.Add(1)
	return nil
}
func (h countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countHandler) WithGroup(string) slog.Handler      { return h }

// scrape gathers the store's collector: metric name (with its labels)
// to value.
func scrape(t *testing.T, s *Store) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.Collector())
	families, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			name := f.GetName()
			if len(m.GetLabel()) > 0 {
				var ls []string
				for _, l := range m.GetLabel() {
					ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
				}
				name += "{" + strings.Join(ls, ",") + "}"
			}
			switch {
			case m.Gauge != nil:
				out[name] = m.GetGauge().GetValue()
			case m.Counter != nil:
				out[name] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// The collector exports the volume and the guard's state.
func TestSpaceMetrics(t *testing.T) {
	vol := newVolume(500*mib, 1000*mib)
	s := guarded(t, vfs.NewMem(), vol, func(o *Options) { o.Ballast = sizeflag.Amount{Bytes: 64 << 10} })
	defer s.Close()
	m := scrape(t, s)
	assert.Equal(t, float64(500*mib), m["dhtkv_disk_free_bytes"])
	assert.Equal(t, float64(1000*mib), m["dhtkv_disk_total_bytes"])
	assert.Equal(t, float64(100*mib), m["dhtkv_disk_min_free_bytes"])
	assert.Equal(t, 0.0, m["dhtkv_disk_full"])
	assert.Equal(t, float64(64<<10), m["dhtkv_disk_ballast_bytes"])
	assert.Equal(t, 0.0, m["dhtkv_store_failed"])
	vol.setFree(mib)
	require.Error(t, s.Apply([]byte("k"), rec(1, "v")))
	require.Error(t, s.CheckWrite())
	m = scrape(t, s)
	assert.Equal(t, 1.0, m["dhtkv_disk_full"])
	assert.Equal(t, 2.0, m[`dhtkv_store_writes_refused_total{reason="disk_full"}`])
	assert.Equal(t, 0.0, m[`dhtkv_store_writes_refused_total{reason="store_failed"}`])
	ws := s.Warnings()
	require.Len(t, ws, 1)
	assert.Contains(t, ws[0], "deleting the emergency ballast /data/"+BallastFile+" frees 64 KiB at once")
}

// A volume whose space cannot be read is not guarded, and says so.
func TestSpaceUnknown(t *testing.T) {
	s := guarded(t, vfs.NewMem(), nil, func(o *Options) {
		o.StatFS = func(string) (vfs.DiskUsage, error) { return vfs.DiskUsage{}, errors.New("statfs broke") }
	})
	defer s.Close()
	require.NoError(t, s.Apply([]byte("k"), rec(1, "v")))
	require.Equal(t, []string{"free space unknown, writes not guarded: free space of /data: statfs broke"}, s.Warnings())
	// A file system without statfs (a test's MemFS) is not guarded, silently.
	plain := guarded(t, vfs.NewMem(), nil, func(o *Options) { o.StatFS = nil })
	defer plain.Close()
	require.NoError(t, plain.Apply([]byte("k"), rec(1, "v")))
	require.Empty(t, plain.Warnings())
	require.False(t, plain.Space().Known)
}

// A write stalled inside Pebble (its memtables full, waiting for a flush)
// when that flush's MANIFEST write fails waits for good: Pebble's Fatalf
// parks the flush holding the database's mutex, which the stalled commit
// needs (docs/storage.md). It holds its share of the collection lock with
// it, so every exclusive taker of that lock waited for good too: an
// anti-entropy exchange's start (AwaitCommits), a collection, a reset of
// the horizons, a drop of leftovers, and the node's stop behind them.
// They give up once the store failed.
func TestStalledWriteHoldsNoExclusiveTakerOfAFailedStore(t *testing.T) {
	var holding atomic.Bool
	release := make(chan struct{})
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if holding.Load() && strings.Contains(op.Path, "MANIFEST") && op.Kind.ReadOrWrite() == errorfs.OpIsWrite {
			<-release
			return &os.PathError{Op: "write", Path: op.Path, Err: syscall.EIO}
		}
		return nil
	})
	s := guarded(t, errorfs.Wrap(vfs.NewMem(), inj), newVolume(500*mib, 1000*mib), func(o *Options) {
		o.MemTableBytes = 256 << 10
		o.Sync = false
	})
	s.closeWait = 100 * time.Millisecond
	require.NoError(t, s.Apply([]byte("k"), rec(1, "v")))
	holding.Store(true)
	var written atomic.Int64
	value := strings.Repeat("x", 64<<10)
	go func() { // stalls for good: left behind
		for i := 0; ; i++ {
			if s.Apply([]byte(fmt.Sprintf("w%d", i)), rec(uint64(i+2), value)) != nil {
				return
			}
			written.Add(1)
		}
	}()
	// Stalled: no write for a while.
	last, since := written.Load(), time.Now()
	require.Eventually(t, func() bool {
		if n := written.Load(); n != last {
			last, since = n, time.Now()
		}
		return last > 0 && time.Since(since) > 200*time.Millisecond
	}, 10*time.Second, 5*time.Millisecond)
	close(release)
	require.Eventually(t, func() bool { return s.Failure() != nil }, 10*time.Second, time.Millisecond)

	returned := func(what string, fn func() error) error {
		done := make(chan error, 1)
		go func() { done <- fn() }()
		select {
		case err := <-done:
			return err
		case <-time.After(5 * time.Second):
			t.Fatalf("%s waits for the stalled write", what)
			return nil
		}
	}
	require.NoError(t, returned("AwaitCommits", func() error { s.AwaitCommits(); return nil }))
	require.ErrorIs(t, returned("Collect", func() error {
		_, err := s.Collect([]Candidate{{Key: []byte("k"), Version: 1}}, 10, nil)
		return err
	}), ErrStoreFailed)
	require.ErrorIs(t, returned("ResetHorizons", func() error {
		return s.ResetHorizons(func(partition.ID) bool { return true })
	}), ErrStoreFailed)
	part, _ := partition.Of([]byte("k"))
	require.ErrorIs(t, returned("DropHeld", func() error {
		_, err := s.DropHeld(context.Background(), part, nil, nil, uint64(time.Now().Add(time.Hour).UnixMilli()))
		return err
	}), ErrStoreFailed)
	// Retried for as long as the node runs (every exchange, every
	// collection pass), they leave no goroutine behind each.
	before := runtime.NumGoroutine()
	for range 100 {
		s.AwaitCommits()
	}
	require.LessOrEqual(t, runtime.NumGoroutine(), before)
	got, found, err := get(s, []byte("k"))
	require.NoError(t, err)
	require.True(t, found, "reads go on")
	require.Equal(t, "v", string(got.Value))
}

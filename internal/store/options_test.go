package store

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/sizeflag"
)

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Options)
		err  string
	}{
		{"defaults", func(*Options) {}, ""},
		{"no memtable", func(o *Options) { o.MemTableBytes = 0 }, "--memtable-bytes must be positive"},
		{"no L0 threshold", func(o *Options) { o.L0CompactionThreshold = 0 }, "--l0-compaction-threshold must be at least 1"},
		{"sync interval off", func(o *Options) { o.WALMinSyncInterval = 0 }, ""},
		{"sync interval 100ms", func(o *Options) { o.WALMinSyncInterval = 100 * time.Millisecond }, ""},
		{"negative sync interval", func(o *Options) { o.WALMinSyncInterval = -time.Microsecond }, "--wal-min-sync-interval -1µs: must be between 0 and 100ms"},
		{"sync interval too long", func(o *Options) { o.WALMinSyncInterval = time.Second }, "--wal-min-sync-interval 1s: must be between 0 and 100ms"},
		{"no free-space guard", func(o *Options) { o.MinFreeSpace = sizeflag.Amount{} }, ""},
		{"free space as a size", func(o *Options) { o.MinFreeSpace = sizeflag.Amount{Bytes: 1 << 40} }, ""},
		{"free space most of the volume", func(o *Options) { o.MinFreeSpace = sizeflag.Amount{Percent: 80} }, "--min-free-space 80%: a percentage must be below 80%"},
		{"no ballast", func(o *Options) { o.Ballast = sizeflag.Amount{} }, ""},
		{"ballast 10%", func(o *Options) { o.Ballast = sizeflag.Amount{Percent: 10} }, ""},
		{"ballast 11%", func(o *Options) { o.Ballast = sizeflag.Amount{Percent: 11} }, "--ballast-size 11%: a percentage must be at most 10%"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := DefaultOptions()
			tc.edit(&o)
			err := o.Validate()
			if tc.err == "" {
				require.NoError(t, err)
			} else {
				require.EqualError(t, err, tc.err)
			}
		})
	}
}

// The WAL's sync interval defaults on only where the process runs on one
// P (see WALMinSyncInterval).
func TestWALMinSyncIntervalDefault(t *testing.T) {
	prev := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(prev)
	require.Equal(t, onePSyncInterval, DefaultOptions().WALMinSyncInterval)
	runtime.GOMAXPROCS(2)
	require.Zero(t, DefaultOptions().WALMinSyncInterval)
}

// With a sync interval, concurrent synced writers all return, each with
// its write readable, and share fsyncs: fewer fsyncs than writes.
func TestWALMinSyncIntervalSharesSyncs(t *testing.T) {
	o := Options{Sync: true, BlockCacheBytes: 1 << 20, MemTableBytes: 1 << 20, FS: vfs.NewMem(), WALMinSyncInterval: 20 * time.Millisecond}
	s, err := Open("node", o)
	require.NoError(t, err)
	defer s.Close()
	const writers = 32
	syncs0 := fsyncs(t, s)
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() {
			require.NoError(t, s.Apply([]byte{byte(i)}, &record.Record{Version: 1, Value: []byte("v")}))
		})
	}
	wg.Wait()
	// Each write's fsync waits at least 20ms after the one before it, in
	// which the other writers queue: a handful of fsyncs for all 32.
	require.Less(t, fsyncs(t, s)-syncs0, uint64(writers/2))
	for i := range writers {
		_, found, err := get(s, []byte{byte(i)})
		require.NoError(t, err)
		require.True(t, found)
	}
}

// fsyncs is how many WAL fsyncs s has made.
func fsyncs(t *testing.T, s *Store) uint64 {
	t.Helper()
	var d dto.Metric
	require.NoError(t, s.db.Metrics().LogWriter.FsyncLatency.Write(&d))
	return d.Histogram.GetSampleCount()
}

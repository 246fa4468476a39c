package settle

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/leakcheck"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/store"
)

func TestDue(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name         string
		quiet, after time.Duration
		above, total uint64
		want         bool
	}{
		{"quiet, half above the bottom", 3 * time.Minute, 2 * time.Minute, 50 * mib, 100 * mib, true},
		{"quiet exactly After", 2 * time.Minute, 2 * time.Minute, 50 * mib, 100 * mib, true},
		{"a quarter above is worth it", time.Hour, time.Minute, 25 * mib, 100 * mib, true},
		{"a flush within After", time.Minute, 2 * time.Minute, 50 * mib, 100 * mib, false},
		{"Pebble's steady state: a tenth above", time.Hour, time.Minute, 10 * mib, 100 * mib, false},
		{"too little above to matter", time.Hour, time.Minute, mib - 1, 2 * mib, false},
		{"settled", time.Hour, time.Minute, 0, 100 * mib, false},
		{"off", time.Hour, 0, 50 * mib, 100 * mib, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, due(tc.quiet, tc.after, store.Shape{Above: tc.above, Total: tc.total}))
		})
	}
}

// TestSettleStore settles a real store: written with small memtables
// (flushes below --l0-compaction-threshold, which Pebble leaves in L0),
// then left quiet, it ends with every table in the bottom level, its
// records unchanged, and later quiet periods do nothing more.
func TestSettleStore(t *testing.T) {
	leakcheck.Register(t)
	o := store.DefaultOptions()
	o.FS, o.Sync, o.MemTableBytes, o.Ballast.Percent = vfs.NewMem(), false, 256<<10, 0
	o.L0CompactionThreshold = 64 // Pebble leaves the flushes in L0
	s, err := store.Open("db", o)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	const keys = 2200 // about nine flushes of 1 KiB records
	rng := rand.New(rand.NewPCG(1, 2))
	noise := make([]byte, keys*1024) // incompressible, as values mostly are
	for i := range noise {
		noise[i] = byte(rng.Uint32())
	}
	valueOf := func(i int) []byte { return fmt.Appendf(nil, "v%d-%s", i, noise[i*1024:(i+1)*1024]) }
	for _, i := range rng.Perm(keys) {
		rec := record.Record{Version: uint64(i + 1), Value: valueOf(i)}
		require.NoError(t, s.Apply(fmt.Appendf(nil, "k%06d", i), &rec))
	}
	before := s.Shape()
	require.True(t, before.Above >= minAbove && before.Above*4 >= before.Total,
		"the writes should leave a quarter of the store above its bottom level: %+v", before)

	st := New(s, Options{After: 50 * time.Millisecond, Interval: 5 * time.Millisecond, SliceBytes: 256 << 10}, slog.New(slog.DiscardHandler))
	reg := prometheus.NewRegistry()
	st.Register(reg)
	st.Start()
	defer st.Close()
	require.Eventually(t, func() bool { return testutil.ToFloat64(st.m.settles.WithLabelValues("done")) == 1 },
		20*time.Second, 10*time.Millisecond)
	sh := s.Shape()
	assert.Zero(t, sh.Above, "every table in the bottom level: %+v", sh)
	assert.Positive(t, testutil.ToFloat64(st.m.bytes))
	for i := range keys {
		env, found, err := s.AppendEnvelope(nil, fmt.Appendf(nil, "k%06d", i))
		require.NoError(t, err)
		require.True(t, found)
		rec, err := record.Decode(env)
		require.NoError(t, err)
		require.Equal(t, string(valueOf(i)), string(rec.Value))
	}
	// Quiet for ever after: nothing is above the bottom, so nothing more
	// is done (the loop stopped, its checks made by hand).
	st.Close()
	now := time.Now()
	st.now = func() time.Time { return now }
	for range 3 {
		now = now.Add(time.Hour)
		st.check(t.Context(), s.Shape())
	}
	assert.Equal(t, 1.0, testutil.ToFloat64(st.m.settles.WithLabelValues("done")))
	assert.Zero(t, testutil.ToFloat64(st.m.settles.WithLabelValues("stopped")))
}

// fakeStore plays a store of three slices whose writes come back while
// the first is compacted.
type fakeStore struct {
	writable  error
	shape     store.Shape
	compacted []store.KeyRange
	onCompact func(f *fakeStore)
}

func (f *fakeStore) Writable() error    { return f.writable }
func (f *fakeStore) Shape() store.Shape { return f.shape }
func (f *fakeStore) Slices(uint64) ([]store.KeyRange, error) {
	return []store.KeyRange{{End: []byte("b"), Bytes: 1}, {Start: []byte("b"), End: []byte("c"), Bytes: 1}, {Start: []byte("c"), End: []byte{0xff}, Bytes: 1}}, nil
}
func (f *fakeStore) CompactRange(_ context.Context, r store.KeyRange) error {
	f.compacted = append(f.compacted, r)
	if f.onCompact != nil {
		f.onCompact(f)
	}
	return nil
}

func TestSettleStopsWhenWritesComeBack(t *testing.T) {
	for _, tc := range []struct {
		name    string
		written uint64 // WAL bytes written during the first slice
		full    bool   // the volume goes below --min-free-space during the first slice
		slices  int
		done    bool
	}{
		{"quiet throughout", 0, false, 3, true},
		{"a write", 100, false, 1, false},
		{"the store refuses writes", 0, true, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeStore{shape: store.Shape{WALBytes: 100, Above: 50 << 20, Total: 100 << 20}}
			f.onCompact = func(f *fakeStore) {
				if len(f.compacted) == 1 {
					f.shape.WALBytes += tc.written
					if tc.full {
						f.writable = store.ErrInsufficientStorage
					}
				}
			}
			now := time.Unix(1000, 0)
			st := New(f, Options{After: time.Minute, Interval: time.Second}, slog.New(slog.DiscardHandler))
			st.now = func() time.Time { return now }
			st.check(t.Context(), f.Shape()) // first sight of the WAL
			now = now.Add(59 * time.Second)
			st.check(t.Context(), f.Shape())
			require.Empty(t, f.compacted, "quiet for less than After")
			now = now.Add(time.Second)
			st.check(t.Context(), f.Shape())
			assert.Len(t, f.compacted, tc.slices)
			result := map[bool]string{true: "done", false: "stopped"}
			assert.Equal(t, 1.0, testutil.ToFloat64(st.m.settles.WithLabelValues(result[tc.done])))
			assert.Zero(t, testutil.ToFloat64(st.m.settles.WithLabelValues(result[!tc.done])))
			// Done or stopped, the next settle waits for another quiet
			// period: After once done, twice After once stopped.
			f.writable = nil
			f.onCompact = nil
			st.check(t.Context(), f.Shape())
			now = now.Add(time.Minute)
			st.check(t.Context(), f.Shape())
			if tc.done {
				assert.Len(t, f.compacted, tc.slices+3, "After again")
				return
			}
			assert.Len(t, f.compacted, tc.slices, "twice After after a stop")
			now = now.Add(time.Minute)
			st.check(t.Context(), f.Shape())
			assert.Len(t, f.compacted, tc.slices+3)
		})
	}
}

// TestBackoff: a store written between every two slices stops every
// settle; the quiet period doubles each time up to maxBackoff times After.
func TestBackoff(t *testing.T) {
	f := &fakeStore{shape: store.Shape{Above: 50 << 20, Total: 100 << 20}}
	f.onCompact = func(f *fakeStore) { f.shape.WALBytes++ }
	now := time.Unix(1000, 0)
	st := New(f, Options{After: time.Minute}, slog.New(slog.DiscardHandler))
	st.now = func() time.Time { return now }
	st.check(t.Context(), f.Shape())
	var waits []time.Duration
	for range 8 {
		began := now
		for len(f.compacted) == len(waits) {
			now = now.Add(time.Minute)
			st.check(t.Context(), f.Shape())
		}
		waits = append(waits, now.Sub(began))
	}
	assert.Equal(t, []time.Duration{1, 2, 4, 8, 16, 32, 32, 32}, func() []time.Duration {
		out := make([]time.Duration, len(waits))
		for i, w := range waits {
			out[i] = w / time.Minute
		}
		return out
	}())
}

func TestNoSettleWhileTheStoreRefusesWrites(t *testing.T) {
	f := &fakeStore{writable: store.ErrInsufficientStorage, shape: store.Shape{Above: 50 << 20, Total: 100 << 20}}
	now := time.Unix(1000, 0)
	st := New(f, Options{After: time.Minute}, slog.New(slog.DiscardHandler))
	st.now = func() time.Time { return now }
	st.check(t.Context(), f.Shape())
	now = now.Add(time.Hour)
	st.check(t.Context(), f.Shape())
	assert.Empty(t, f.compacted)
	f.writable = nil // space freed: the quiet period already passed
	st.check(t.Context(), f.Shape())
	assert.Len(t, f.compacted, 3)
}

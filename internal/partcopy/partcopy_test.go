package partcopy_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/partcopy"
	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/scan"
	"github.com/dhtkv/dhtkv/internal/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// entry is one record a fake sender streams.
type entry struct {
	key string
	rec record.Record
}

// sliceIter streams entries, which must be in key order, as another node's
// stream does; after fail records it ends with err.
type sliceIter struct {
	es    []entry
	i     int
	env   []byte
	fail  int
	err   error
	close func()
}

func (s *sliceIter) Next() bool {
	if s.err != nil || s.i >= len(s.es) {
		return false
	}
	if s.fail > 0 && s.i == s.fail {
		s.err = io.ErrUnexpectedEOF
		return false
	}
	s.env = s.es[s.i].rec.Encode()
	s.i++
	return true
}
func (s *sliceIter) Key() []byte           { return []byte(s.es[s.i-1].key) }
func (s *sliceIter) Envelope() []byte      { return s.env }
func (s *sliceIter) Record() record.Record { r, _ := record.Decode(s.env); return r }
func (s *sliceIter) Err() error            { return s.err }
func (s *sliceIter) Close() error {
	if s.close != nil {
		s.close()
	}
	return nil
}

// sender is a fake node: it streams its entries, filtered by the
// partitions asked for unless it is of a release that does not filter.
type sender struct {
	es       []entry
	noFilter bool
	fail     int // the stream breaks after this many records (0: never)
	mu       sync.Mutex
	opened   int
}

func (s *sender) OpenParts(ctx context.Context, url string, epoch uint64, parts *partition.Set, _ bool) (scan.Iterator, error) {
	s.mu.Lock()
	s.opened++
	s.mu.Unlock()
	var es []entry
	for _, e := range s.es {
		if s.noFilter || parts.HasKey([]byte(e.key)) {
			es = append(es, e)
		}
	}
	return &sliceIter{es: es, fail: s.fail}, nil
}

// gate admits epochs at or above its own, as membership's does.
type gate struct {
	mu    sync.Mutex
	epoch uint64
}

func (g *gate) Admit(epoch uint64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return epoch >= g.epoch
}
func (g *gate) Release() {}

// newReplica is a replica on an in-memory store whose clock reads wall.
func newReplica(t *testing.T, wall func() time.Time) *replica.Replica {
	t.Helper()
	st, err := store.Open("db", store.Options{FS: vfs.NewMem()})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	clock, err := hlc.New(1, wall)
	require.NoError(t, err)
	return &replica.Replica{Store: st, Clock: clock, Versions: replica.NewVersionFilter(1<<10, 0)}
}

// keysOf returns n keys and the partitions of every other one.
func keysOf(n int) (keys []string, half *partition.Set) {
	half = &partition.Set{}
	for i := range n {
		k := fmt.Sprintf("k%05d", i)
		keys = append(keys, k)
		if i%2 == 0 {
			p, _ := partition.Of([]byte(k))
			half.Add(p)
		}
	}
	slices.Sort(keys)
	return keys, half
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestCopy walks what a copy keeps and leaves, one case a row: only the
// partitions asked for are stored, also from a sender that streams
// everything; a record older than what the key holds (a write that
// arrived during the copy) does not replace it; a version too far ahead
// is left out; a broken stream is an error, and what came before it
// stays; a newer map stops the copy before anything is stored.
func TestCopy(t *testing.T) {
	wall := time.UnixMilli(1_800_000_000_000)
	now := func() time.Time { return wall }
	old := hlc.VersionAt(wall.Add(-time.Hour)) | 2
	keys, half := keysOf(200)
	for _, tc := range []struct {
		name string
		// sender's setup
		noFilter bool
		fail     int
		ahead    bool // the first key's version is a minute ahead
		newer    bool // the first key holds a newer version here already
		stale    bool // this node installed a newer map
		// expectations
		err     error
		foreign bool
	}{
		{name: "filtered by the sender"},
		{name: "a sender that does not filter", noFilter: true, foreign: true},
		{name: "newer here", newer: true},
		{name: "too far ahead", ahead: true},
		{name: "stream breaks", fail: 50, err: io.ErrUnexpectedEOF},
		{name: "newer map", stale: true, err: partcopy.ErrStale},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newReplica(t, now)
			var es []entry
			for _, k := range keys {
				es = append(es, entry{k, record.Record{Version: old, Value: []byte("copied " + k)}})
			}
			first := -1 // the first key of the partitions asked for
			for i, e := range es {
				if half.HasKey([]byte(e.key)) {
					first = i
					break
				}
			}
			if tc.ahead {
				es[first].rec.Version = hlc.VersionAt(wall.Add(time.Minute)) | 2
			}
			if tc.newer {
				require.NoError(t, r.Apply([]byte(es[first].key), &record.Record{Version: old + 1<<20, Value: []byte("written meanwhile")}))
			}
			g := &gate{epoch: 7}
			if tc.stale {
				g.epoch = 8
			}
			c := partcopy.New(r, &sender{es: es, noFilter: tc.noFilter, fail: tc.fail}, g, partcopy.Options{Rate: 1 << 30}, quiet())
			st, err := c.Copy(t.Context(), "http://peer", 7, half)
			if tc.err != nil {
				require.ErrorIs(t, err, tc.err)
			} else {
				require.NoError(t, err)
			}

			asked := 0
			for _, k := range keys {
				if half.HasKey([]byte(k)) {
					asked++
				}
			}
			held := map[string]string{}
			it, err := r.NewIter(nil, nil)
			require.NoError(t, err)
			for it.Next() {
				held[string(it.Key())] = string(it.Record().Value)
			}
			require.NoError(t, it.Err())
			require.NoError(t, it.Close())
			for k := range held {
				require.True(t, half.HasKey([]byte(k)), "key %s of a partition not asked for", k)
			}
			if tc.foreign {
				require.Equal(t, len(keys)-asked, st.Foreign)
			} else {
				require.Zero(t, st.Foreign)
			}
			switch {
			case tc.stale:
				require.Empty(t, held)
				require.Zero(t, st.Applied)
			case tc.fail > 0:
				require.NotEmpty(t, held, "what came before the break stays")
				require.Less(t, len(held), asked)
				require.Equal(t, len(held), st.Applied)
			case tc.newer:
				require.Equal(t, "written meanwhile", held[es[first].key])
				require.Len(t, held, asked)
				require.Equal(t, asked-1, st.Applied)
				require.Equal(t, 1, st.Older)
			case tc.ahead:
				require.NotContains(t, held, es[first].key)
				require.Len(t, held, asked-1)
				require.Equal(t, 1, st.Refused)
			default:
				require.Len(t, held, asked)
				require.Equal(t, asked, st.Records)
				require.Equal(t, asked, st.Applied)
				for k, v := range held {
					require.Equal(t, "copied "+k, v)
				}
			}
		})
	}
}

// TestCopyThrottle: copies take the rate they are given, together, on a
// synctest bubble's clock: 4 MiB at MinRate (1 MiB/s) take 4 s less the
// burst the limiter starts with (a batch, 64 KiB at this rate), and two
// such copies at once take twice as long, since the rate is the node's.
func TestCopyThrottle(t *testing.T) {
	const records, value = 4096, 1000
	synctest.Test(t, func(t *testing.T) {
		r := newReplica(t, time.Now)
		keys, _ := keysOf(records)
		all := &partition.Set{}
		for p := range partition.Count {
			all.Add(partition.ID(p))
		}
		v := hlc.VersionAt(time.Now().Add(-time.Hour)) | 2
		var es []entry
		var bytes int64
		for _, k := range keys {
			rec := record.Record{Version: v, Value: make([]byte, value)}
			es = append(es, entry{k, rec})
			bytes += int64(len(k) + rec.EncodedSize())
		}
		c := partcopy.New(r, &sender{es: es}, &gate{}, partcopy.Options{Rate: partcopy.MinRate}, quiet())
		const burst = 64 << 10
		rate := float64(partcopy.MinRate)

		start := time.Now()
		st, err := c.Copy(t.Context(), "http://peer", 1, all)
		require.NoError(t, err)
		took := time.Since(start)
		require.Equal(t, bytes, st.Bytes)
		want := time.Duration(float64(bytes-burst) / rate * float64(time.Second))
		t.Logf("one copy of %d bytes at %d B/s: %v (want %v)", bytes, partcopy.MinRate, took, want)
		require.InDelta(t, want.Seconds(), took.Seconds(), 0.01)

		// Two at once share the rate: the limiter is empty now.
		start = time.Now()
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				_, err := c.Copy(t.Context(), "http://peer", 1, all)
				require.NoError(t, err)
			})
		}
		wg.Wait()
		took = time.Since(start)
		want = time.Duration(float64(2*bytes) / rate * float64(time.Second))
		t.Logf("two copies at once: %v (want %v)", took, want)
		require.InDelta(t, want.Seconds(), took.Seconds(), 0.01)
	})
}

// TestCopyCancel: a copy whose context ends stops reading and applying,
// and leaves no goroutine behind (TestMain checks).
func TestCopyCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newReplica(t, time.Now)
		keys, _ := keysOf(4096)
		all := &partition.Set{}
		for p := range partition.Count {
			all.Add(partition.ID(p))
		}
		v := hlc.VersionAt(time.Now().Add(-time.Hour)) | 2
		var es []entry
		for _, k := range keys {
			es = append(es, entry{k, record.Record{Version: v, Value: make([]byte, 1000)}})
		}
		c := partcopy.New(r, &sender{es: es}, &gate{}, partcopy.Options{Rate: partcopy.MinRate}, quiet())
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		st, err := c.Copy(ctx, "http://peer", 1, all)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Less(t, st.Applied, len(keys))
	})
}

func TestOptions(t *testing.T) {
	o := partcopy.DefaultOptions()
	require.EqualValues(t, partcopy.DefaultRate, o.Rate)
	require.NoError(t, o.Validate())
	o.Rate = partcopy.MinRate - 1
	require.Error(t, o.Validate())
}

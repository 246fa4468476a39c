package replica_test

import (
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/dhtkv/dhtkv/internal/cache"
	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/store"
)

// TestDropPartitionPaced: a drop paced by a rate.Limiter of pace records a
// second and a burst of a chunk keeps the pace on a synctest bubble's
// clock (the partition takes its records less the burst over the pace),
// and the records it dropped are gone from the cache too, while those of
// a partition kept are still served from it.
func TestDropPartitionPaced(t *testing.T) {
	const (
		victim = partition.ID(0x0123)
		kept   = partition.ID(0x0456)
		size   = 2*store.DropChunk + 300
		pace   = 1000 // records a second
	)
	synctest.Test(t, func(t *testing.T) {
		st, err := store.Open("db", store.Options{FS: vfs.NewMem()})
		require.NoError(t, err)
		defer st.Close()
		c, err := cache.New(64 << 20)
		require.NoError(t, err)
		defer c.Close()
		r := &replica.Replica{Store: st, Cache: c}
		keys := map[partition.ID][]string{}
		buf := []byte("k")
		for i := 0; len(keys[victim]) < size || len(keys[kept]) < 10; i++ {
			buf = strconv.AppendInt(buf[:1], int64(i), 10)
			if p, _ := partition.Of(buf); p == victim || p == kept {
				keys[p] = append(keys[p], string(buf))
			}
		}
		keys[victim] = keys[victim][:size]
		var ws []store.Write
		for _, ks := range keys {
			for _, k := range ks {
				ws = append(ws, store.Write{Key: []byte(k), Rec: &record.Record{Version: 1 << 20, Value: []byte(k)}})
			}
		}
		require.NoError(t, r.ApplyBatch(ws))
		for _, ks := range keys {
			for _, k := range ks {
				e, err := r.Get([]byte(k)) // cached now
				require.NoError(t, err)
				require.True(t, e.Found)
			}
		}

		lim := rate.NewLimiter(pace, store.DropChunk)
		start := time.Now()
		removed, err := r.DropPartition(t.Context(), victim, lim)
		took := time.Since(start)
		require.NoError(t, err)
		require.Equal(t, size, removed)
		want := time.Duration(float64(size-store.DropChunk) / pace * float64(time.Second))
		t.Logf("%d records at %d a second, burst %d: %v (want %v)", size, pace, store.DropChunk, took, want)
		require.InDelta(t, want.Seconds(), took.Seconds(), 0.01)

		for _, k := range keys[victim] {
			e, err := r.Get([]byte(k))
			require.NoError(t, err)
			require.False(t, e.Found, "%s dropped from the store and the cache", k)
		}
		hits := c.Metrics().Hits
		for _, k := range keys[kept] {
			e, err := r.Get([]byte(k))
			require.NoError(t, err)
			require.True(t, e.Found, "%s of a partition kept", k)
		}
		require.Equal(t, hits+uint64(len(keys[kept])), c.Metrics().Hits, "the partition kept is still served from the cache")
	})
}

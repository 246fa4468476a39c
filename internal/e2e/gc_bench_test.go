package e2e_test

import (
	"io/fs"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// dirBytes is the size of every file under dir.
func dirBytes(t testing.TB, dir string) int64 {
	var n int64
	require.NoError(t, filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err == nil {
			n += info.Size()
		}
		return err
	}))
	return n
}

// BenchmarkGCReclaimsSpace: a node's store of 1M keys (values of about
// 100 bytes) in which 90% were deleted past the grace; the node starts,
// garbage collection removes the tombstones, and Pebble's compactions
// reclaim the space. Reports the data directory's size before the deletes,
// with them, and after collection and compaction, and the time each took.
//
//	go test ./internal/e2e -run '^$' -bench GCReclaimsSpace -benchtime 1x
func BenchmarkGCReclaimsSpace(b *testing.B) {
	const keys, valueSize = 1_000_000, 300 // GenValue: 50 to 300 bytes, ~175 on average
	for range b.N {
		b.StopTimer()
		dir := filepath.Join(b.TempDir(), "node")
		testcluster.FillStore(b, dir, keys, valueSize)
		st, err := store.Open(dir, store.Options{})
		require.NoError(b, err)
		require.NoError(b, st.Close())
		filled := dirBytes(b, dir)
		st, err = store.Open(dir, store.Options{})
		require.NoError(b, err)
		del := hlc.VersionAt(time.Now().Add(-time.Minute))
		var ws []store.Write
		for i := range keys {
			if i%10 == 0 {
				continue
			}
			ws = append(ws, store.Write{Key: testcluster.GenKey(i), Rec: &record.Record{Version: del + uint64(i), Tombstone: true}})
			if len(ws) == 10000 {
				require.NoError(b, st.ApplyBatch(ws))
				ws = ws[:0]
			}
		}
		require.NoError(b, st.ApplyBatch(ws))
		require.NoError(b, st.Close())
		deleted := dirBytes(b, dir)

		b.StartTimer()
		start := time.Now()
		c := testcluster.Start(b, 1, withGC(), func(_ int, cfg *node.Config) { cfg.DataDir = dir })
		for c.Metric(b, 0, "dhtkv_gc_removed_total") < keys*9/10 {
			time.Sleep(100 * time.Millisecond) // polling the collector's progress
		}
		collected := time.Since(start)
		var after int64
		for prev := int64(-1); ; prev = after {
			time.Sleep(2 * time.Second) // polling Pebble's compactions until the size settles
			after = dirBytes(b, dir)
			if after == prev || time.Since(start) > 5*time.Minute {
				break
			}
		}
		settled := time.Since(start)
		b.StopTimer()
		c.StopAll()
		b.ReportMetric(float64(filled)/(1<<20), "MiB-filled")
		b.ReportMetric(float64(deleted)/(1<<20), "MiB-deleted")
		b.ReportMetric(float64(after)/(1<<20), "MiB-after")
		b.ReportMetric(collected.Seconds(), "s-collect")
		b.ReportMetric(settled.Seconds(), "s-settled")
	}
}

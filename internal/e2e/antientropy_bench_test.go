package e2e_test

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// BenchmarkAntiEntropyDifference measures what one exchange costs when two
// replicas of `keys` keys differ in 1% of them (half newer on each side):
// the bytes exchanged per differing key, summaries and records apart, and
// the time. Then the same for two replicas in step. Run it with
//
//	go test ./internal/e2e -run '^$' -bench AntiEntropyDifference -benchtime 1x
//
// Each iteration prepares both stores anew (not timed).
func BenchmarkAntiEntropyDifference(b *testing.B) {
	for _, keys := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			const valueSize = 300 // values of 50 to 300 bytes (GenValue)
			var diff, summary, records, insync int
			var secs float64
			for range b.N {
				b.StopTimer()
				dirs := []string{filepath.Join(b.TempDir(), "a"), filepath.Join(b.TempDir(), "b")}
				for _, d := range dirs {
					testcluster.FillStore(b, d, keys, valueSize)
				}
				diff = 0
				for side, d := range dirs {
					st, err := store.Open(d, store.Options{})
					require.NoError(b, err)
					for i := side * 100; i < keys; i += 200 {
						rec := record.Record{Version: uint64(10 * keys), Value: []byte(fmt.Sprintf("newer on %d", side))}
						require.NoError(b, st.Apply(testcluster.GenKey(i), &rec))
						diff++
					}
					require.NoError(b, st.Close())
				}
				c := testcluster.Start(b, 2, func(i int, cfg *node.Config) {
					cfg.DataDir = dirs[i]
					cfg.AntiEntropy.Rate = 1 << 30 // not the limit measured here
				})
				b.StartTimer()
				st := c.Repair(b, 0)[0]
				b.StopTimer()
				require.Empty(b, st.Error)
				require.Equal(b, diff, st.Pulled+st.Pushed)
				summary, records, secs = st.SummaryBytes, st.RecordBytes, st.DurationSeconds
				again := c.Repair(b, 0)[0]
				require.Zero(b, again.PartitionsDiffering)
				insync = again.SummaryBytes
				c.StopAll()
			}
			b.ReportMetric(float64(summary+records)/float64(diff), "bytes/diffkey")
			b.ReportMetric(float64(summary)/float64(diff), "summarybytes/diffkey")
			b.ReportMetric(float64(records)/float64(diff), "recordbytes/diffkey")
			b.ReportMetric(float64(diff), "diffkeys")
			b.ReportMetric(secs, "exchange-s")
			b.ReportMetric(float64(insync), "insync-bytes")
		})
	}
}

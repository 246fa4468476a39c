package store

import (
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
)

// Pebble's fsync histogram (nanoseconds, fine buckets) is exported in
// seconds over fsyncBuckets; no observation lands below its true bucket.
func TestRebucket(t *testing.T) {
	bucket := func(le float64, cum uint64) *dto.Bucket {
		return &dto.Bucket{UpperBound: &le, CumulativeCount: &cum}
	}
	count, sum := uint64(10), 5e6 // 5 ms in ns
	h := &dto.Histogram{
		SampleCount: &count,
		SampleSum:   &sum,
		Bucket: []*dto.Bucket{
			bucket(50e3, 1),  // 50 µs
			bucket(100e3, 4), // 100 µs
			bucket(150e3, 6), // 150 µs
			bucket(300e3, 9), // 300 µs
			bucket(1e9, 10),  // 1 s
		},
	}
	gotCount, gotSum, buckets := rebucket(h, 1e-9)
	require.Equal(t, uint64(10), gotCount)
	require.InDelta(t, 5e-3, gotSum, 1e-12)
	require.Len(t, buckets, len(fsyncBuckets))
	require.Equal(t, uint64(4), buckets[100e-6], "<= 100 µs")
	require.Equal(t, uint64(6), buckets[200e-6], "150 µs is below 200 µs")
	require.Equal(t, uint64(9), buckets[400e-6])
	require.Equal(t, uint64(9), buckets[0.8192], "1 s is above 819 ms")
	require.Equal(t, uint64(10), buckets[fsyncBuckets[len(fsyncBuckets)-1]])
}

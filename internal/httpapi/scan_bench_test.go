package httpapi_test

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/httpapi"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/scan"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// Range scan throughput, in-process: the nodes and the reading client share
// the machine. Each node's store holds benchRecords records of
// benchValueSize bytes (every record on every node, as with from=3).
//
//	go test -run '^$' -bench BenchmarkScan -benchtime 10x ./internal/httpapi/

const (
	benchRecords   = 50000
	benchValueSize = 1024
)

func benchCluster(b *testing.B, nodes int, opts ...testcluster.Option) *testcluster.Cluster {
	b.Helper()
	dirs := make([]string, nodes)
	for i := range dirs {
		dirs[i] = filepath.Join(b.TempDir(), fmt.Sprintf("node%d", i))
		testcluster.FillStore(b, dirs[i], benchRecords, benchValueSize)
	}
	return testcluster.Start(b, nodes, append([]testcluster.Option{func(i int, cfg *node.Config) {
		cfg.DataDir = dirs[i]
		cfg.Store.BlockCacheBytes = 64 << 20 // the data set is read from cache after the first pass
	}}, opts...)...)
}

// benchScan reads the range once per iteration and reports MB/s of keys and
// values (SetBytes) and records/s.
func benchScan(b *testing.B, c *testcluster.Cluster, query string) {
	client := &http.Client{Timeout: time.Minute}
	b.SetBytes(benchPayload())
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		resp, err := client.Get(c.URL(0) + "/v0/entities?" + query)
		require.NoError(b, err)
		require.Equal(b, 200, resp.StatusCode)
		d := scan.NewDecoder(resp.Body, 1024, 1<<20)
		for d.Next() {
		}
		require.NoError(b, d.Err())
		require.Equal(b, uint64(benchRecords), d.Count())
		resp.Body.Close()
	}
	b.ReportMetric(float64(benchRecords)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

func BenchmarkScanLocalBinary(b *testing.B) {
	benchScan(b, benchCluster(b, 1), "start=key&format=binary")
}

// BenchmarkScanLocalChunks is the chunks framing: one chunk, and so one
// write to the socket, per record. Read with net/http, which undoes the
// chunking; the body is then read as raw bytes.
func BenchmarkScanLocalChunks(b *testing.B) {
	benchChunks(b, benchCluster(b, 1))
}

// BenchmarkScanReleaseCost is what arming the stall release costs a
// stream whose client keeps up: BenchmarkScanLocalChunks (one write, so
// one timer Reset and Stop, per record: the worst case) without the
// release and with it, on two nodes of the same data. Compare with
// -count and benchstat.
func BenchmarkScanReleaseCost(b *testing.B) {
	for _, v := range []struct {
		name  string
		after time.Duration
	}{{"never", -1}, {"100ms", httpapi.DefaultScanReleaseAfter}} {
		c := benchCluster(b, 1, func(_ int, cfg *node.Config) { cfg.ScanReleaseAfter = v.after })
		b.Run(v.name, func(b *testing.B) { benchChunks(b, c) })
	}
}

// benchChunks reads the whole range in the chunks framing per iteration.
func benchChunks(b *testing.B, c *testcluster.Cluster) {
	client := &http.Client{Timeout: time.Minute}
	b.SetBytes(benchPayload())
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		resp, err := client.Get(c.URL(0) + "/v0/entities?start=key")
		require.NoError(b, err)
		n, err := io.Copy(io.Discard, resp.Body)
		require.NoError(b, err)
		require.Equal(b, benchPayload()+benchRecords, n) // one '\n' per record
		resp.Body.Close()
	}
	b.ReportMetric(float64(benchRecords)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

func BenchmarkScanClusterBinary(b *testing.B) {
	benchScan(b, benchCluster(b, 3), "start=key&format=binary&scope=cluster")
}

// benchPayload is the bytes of keys and values in the benchmark range.
func benchPayload() int64 {
	var payload int64
	for i := range benchRecords {
		payload += int64(len(testcluster.GenKey(i)) + benchValueSize - i%251)
	}
	return payload
}

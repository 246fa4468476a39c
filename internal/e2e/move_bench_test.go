package e2e_test

import (
	"flag"
	"net/http"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

var joinKeys = flag.Int("join.keys", 100_000, "BenchmarkJoinStream: records of 1 KiB on each of the 3 nodes before the join")

// BenchmarkJoinStream measures the stream stage of a join without client
// load: 3 nodes (3 replicas) each holding -join.keys records of about
// 1 KiB, written into their directories before they start, take a 4th
// node, which streams the 3/4 of the partitions it gains from one of them
// (then compares them with the two others). It reports the record bytes
// the streams carried (keys and envelopes, dhtkv_copy_bytes_total) over
// the stream stage's time, with --move-rate out of the way (1 GiB/s), and
// the CPU the process spent over the stage per GB streamed:
//
//	go test -run '^$' -bench JoinStream -benchtime 1x ./internal/e2e/                        # 100k records, seconds
//	go test -run '^$' -bench JoinStream -benchtime 1x -timeout 30m ./internal/e2e/ -join.keys 1000000
//
// Every node is in this process, on loopback HTTP, and the join begins
// once the fill's compactions have ended, so it measures the copy's own
// cost; loadtest/membership.sh measures it between processes, under
// client load.
func BenchmarkJoinStream(b *testing.B) {
	n := *joinKeys
	c := testcluster.Start(b, 3, func(_ int, cfg *node.Config) {
		testcluster.FillStore(b, cfg.DataDir, n, 1024)
		cfg.Move.Rate = 1 << 30
		cfg.AdminListen = "127.0.0.1:0"
	})
	cl := testcluster.NewClient(b)
	metric := func(i int, name string) float64 {
		code, body := cl.Do(b, http.MethodGet, "http://"+c.Node(i).AdminAddr()+"/metrics", nil)
		require.Equal(b, http.StatusOK, code)
		match := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindSubmatch(body)
		require.NotNil(b, match, name)
		v, err := strconv.ParseFloat(string(match[1]), 64)
		require.NoError(b, err)
		return v
	}
	// The fill's compactions end first (no flush or compaction on any node
	// for a second): they are not the copy's cost.
	quiet := 0
	testcluster.Eventually(b, 10*time.Minute, "the nodes' compactions settle", func() bool {
		for i := range 3 {
			if metric(i, "dhtkv_pebble_background_jobs") > 0 {
				quiet = 0
				return false
			}
		}
		quiet++
		time.Sleep(100 * time.Millisecond) // sampling the quiet second
		return quiet >= 10
	})
	b.ResetTimer()
	for b.Loop() {
		joiner := c.AddNode(b, 0)
		c.Join(b, 0, joiner)
		var start, end time.Time
		var cpuStart, cpuEnd time.Duration
		testcluster.Eventually(b, 30*time.Minute, "the joiner's stream stage ends", func() bool {
			m, _ := c.Node(joiner).Members().Map()
			stream := m.Change != nil && m.Change.Stage == clustermap.Stream
			switch {
			case stream && start.IsZero():
				start, cpuStart = time.Now(), processCPU(b)
			case !stream && !start.IsZero():
				end, cpuEnd = time.Now(), processCPU(b)
				return true
			}
			return false
		})
		c.AwaitStable(b, 30*time.Minute)
		bytes := metric(joiner, "dhtkv_copy_bytes_total")
		secs, cpu := end.Sub(start).Seconds(), (cpuEnd - cpuStart).Seconds()
		b.ReportMetric(bytes/1e6/secs, "MB/s")
		b.ReportMetric(bytes/1e6, "MB")
		b.ReportMetric(secs, "stream-s")
		b.ReportMetric(cpu/(bytes/1e9), "cpu-s/GB")
		b.Logf("%d records a node: the joiner streamed %.0f MB in %.2f s, %.2f s of CPU (every node, this process)", n, bytes/1e6, secs, cpu)
	}
}

// processCPU is the CPU time (user and system) this process has used: on
// a machine shared with other work, the cost of a copy that the wall
// clock does not show.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

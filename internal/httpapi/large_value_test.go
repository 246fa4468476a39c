package httpapi_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/httpapi"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// GETs of a large cached value reference the cache's bytes instead of
// copying them per connection (httpapi.RawValueMinBytes).

const largeValue = 1 << 20

// startWithLargeValue starts a node holding a 1 MiB value under "big",
// read once so that the read cache holds it.
func startWithLargeValue(t testing.TB, opts ...testcluster.Option) (*testcluster.Cluster, []byte) {
	c := testcluster.Start(t, 1, opts...)
	value := bytes.Repeat([]byte("0123456789abcdef"), largeValue/16)
	cl := testcluster.NewClient(t)
	require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), "big", value, 1, 1))
	for range 2 {
		code, got := cl.Get(t, c.URL(0), "big", 1, 1)
		require.Equal(t, http.StatusOK, code)
		require.True(t, bytes.Equal(value, got))
	}
	require.Positive(t, c.Metric(t, 0, "dhtkv_cache_hits_total"), "the value is cached")
	return c, value
}

// settledHeap is the live heap once collections stop changing it: the
// collector run until five readings in a row, 20 ms apart, are within
// 1 MiB of each other (which also empties sync.Pools, whose victim caches
// survive one collection), so that memory an earlier test's goroutines
// were still letting go of (a closed cluster's stores, on a loaded
// machine) is not counted in a reading and freed before the next one.
// Two readings in a row were not enough: on a loaded machine a reading
// once held 64 MiB that was freed during the measurement after it.
func settledHeap() uint64 {
	runtime.GC()
	lo, hi := heapInUse(), heapInUse()
	for steady, polls := 1, 0; steady < 5 && polls < 150; polls++ { // 3 s at most
		time.Sleep(20 * time.Millisecond) // between polls: the goroutines letting go run
		runtime.GC()
		h := heapInUse()
		lo, hi, steady = min(lo, h), max(hi, h), steady+1
		if hi-lo >= 1<<20 {
			lo, hi, steady = h, h, 1
		}
	}
	return lo
}

// sendQueues is how many bytes the node's established connections on
// port have sent but their clients not yet taken, and how many of them
// hold some.
func sendQueues(t *testing.T, port int) (busy int, queued int64) {
	t.Helper()
	for _, q := range serverQueues(t, port) {
		if q.tx > 0 {
			busy++
			queued += q.tx
		}
	}
	return busy, queued
}

// TestLargeValueSlowReadersShareTheCachedBytes: 32 connections each send
// 8 pipelined GETs of a cached 1 MiB value and read nothing. The node
// writes answers until the sockets are full and then waits, each
// connection in the middle of an answer. Answered by reference, the
// waiting answers share the cache's bytes: the heap grows by far less
// than one value per connection. Copied (the behaviour before, measured
// in the same run for the ratio), each connection holds its own copy.
//
// The heap is the process's, so the test measures in a process of its
// own (this test binary run for this test alone): in the package's run,
// the teardown of earlier tests freed tens of MiB during a measurement,
// and the growth came out negative.
func TestLargeValueSlowReadersShareTheCachedBytes(t *testing.T) {
	const alone = "DHTKV_TEST_HEAP_ALONE"
	if os.Getenv(alone) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), alone+"=1")
		out, err := cmd.CombinedOutput()
		t.Logf("the test in a process of its own:\n%s", out)
		require.NoError(t, err)
		require.Contains(t, string(out), "--- PASS: "+t.Name(), "it ran")
		return
	}
	const conns, pipelined = 32, 8
	measure := func(t *testing.T, rawFrom int) float64 {
		c, _ := startWithLargeValue(t, func(_ int, cfg *node.Config) { cfg.RawValueMinBytes = rawFrom })
		addr := c.Config(0).Listen
		port, err := strconv.Atoi(addr[strings.LastIndexByte(addr, ':')+1:])
		require.NoError(t, err)
		before := settledHeap()
		req := strings.Repeat("GET /v0/entity?id=big HTTP/1.1\r\nHost: x\r\n\r\n", pipelined)
		for range conns {
			_, err := io.WriteString(testcluster.Dial(t, addr, 4096), req)
			require.NoError(t, err)
		}
		// Every connection's answers have filled its socket buffers: the
		// bytes queued stop growing.
		var last int64
		since := time.Now()
		require.Eventually(t, func() bool {
			busy, queued := sendQueues(t, port)
			if busy < conns || queued != last {
				last, since = queued, time.Now()
				return false
			}
			return time.Since(since) > 300*time.Millisecond
		}, 20*time.Second, 20*time.Millisecond, "the node's writes did not settle")
		growth := float64(settledHeap()) - float64(before)
		t.Logf("%d connections stalled in a 1 MiB answer (%.0f MiB queued in their sockets): heap grew by %.1f MiB",
			conns, float64(last)/(1<<20), growth/(1<<20))
		return growth
	}
	var copied, raw float64
	t.Run("copied", func(t *testing.T) { copied = measure(t, -1) })
	t.Run("by reference", func(t *testing.T) { raw = measure(t, httpapi.RawValueMinBytes) })
	t.Logf("heap growth with %d slow readers: copied %.1f MiB, by reference %.1f MiB", conns, copied/(1<<20), raw/(1<<20))
	require.Greater(t, copied, float64(conns/2*largeValue), "copied, every waiting connection holds a copy")
	require.Less(t, raw, float64(conns/8*largeValue), "by reference, the waiting connections share the cached bytes")
}

// BenchmarkGetLargeCached: GETs of a cached 1 MiB value over real
// loopback connections, the body read and discarded, copied into each
// response (the behaviour before) and answered by reference. The
// allocations are the whole process's: node and client, which allocates
// nothing per request. conns connections read in parallel.
//
//	go test -run '^$' -bench BenchmarkGetLargeCached -benchmem ./internal/httpapi/
func BenchmarkGetLargeCached(b *testing.B) {
	for _, v := range []struct {
		name    string
		rawFrom int
	}{{"copied", -1}, {"by-reference", httpapi.RawValueMinBytes}} {
		c, _ := startWithLargeValue(b, func(_ int, cfg *node.Config) { cfg.RawValueMinBytes = v.rawFrom })
		addr := c.Config(0).Listen
		for _, conns := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/conns=%d", v.name, conns), func(b *testing.B) {
				clients := make([]*rawClient, conns)
				for i := range clients {
					clients[i] = dialRaw(b, addr)
				}
				b.SetBytes(largeValue)
				b.ReportAllocs()
				b.ResetTimer()
				var wg sync.WaitGroup
				per := b.N / conns
				for i, rc := range clients {
					n := per
					if i == 0 {
						n += b.N % conns
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range n {
							if err := rc.get(); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
			})
		}
	}
}

// rawClient sends GET big on one keep-alive connection and discards the
// answer's body without allocating.
type rawClient struct {
	conn net.Conn
	br   *bufio.Reader
}

var getBig = []byte("GET /v0/entity?id=big HTTP/1.1\r\nHost: x\r\n\r\n")

func dialRaw(b *testing.B, addr string) *rawClient {
	conn := testcluster.Dial(b, addr, 0)
	return &rawClient{conn: conn, br: bufio.NewReaderSize(conn, 64<<10)}
}

func (c *rawClient) get() error {
	if _, err := c.conn.Write(getBig); err != nil {
		return err
	}
	length := -1
	for first := true; ; first = false {
		line, err := c.br.ReadSlice('\n')
		if err != nil {
			return err
		}
		if first && !bytes.HasPrefix(line, []byte("HTTP/1.1 200")) {
			return fmt.Errorf("status line %q", line)
		}
		if len(line) <= 2 {
			break
		}
		if v, ok := bytes.CutPrefix(bytes.ToLower(line), []byte("content-length:")); ok {
			if length, err = strconv.Atoi(string(bytes.TrimSpace(v))); err != nil {
				return err
			}
		}
	}
	if length != largeValue {
		return fmt.Errorf("content-length %d", length)
	}
	_, err := c.br.Discard(length)
	return err
}

package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// attacker dials from 127.0.0.2, so that the per-address cap applies to
// the attack and not to the well-behaved client on 127.0.0.1.
var attacker = net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 5 * time.Second}

// scrape returns the samples of the unlabelled metrics names from the
// node's /metrics.
func scrape(t *testing.T, admin string, names ...string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && slices.Contains(names, f[0]) {
			v, err := strconv.ParseFloat(f[1], 64)
			require.NoError(t, err)
			out[f[0]] = v
		}
	}
	return out
}

// TestSoak: a node under GOMEMLIMIT and a low descriptor limit is hit by
// these hostile patterns at once, from one address, while a well-behaved
// client on another keeps writing and reading:
//
//   - idle connections, past the per-address cap;
//   - requests announcing 16 MiB bodies that send 100 bytes and stall;
//   - internal batches of 256 reads of a 1 MiB value;
//   - range scans whose client reads nothing.
//
// The client sees no error and a bounded p99; once the attack ends, the
// node's descriptors, goroutines and heap return to about what they were.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary under attack for seconds: a soak test; runs without -short")
	}
	t.Setenv("GOMEMLIMIT", "128MiB")
	admin := fmt.Sprintf("127.0.0.1:%d", testcluster.FreePorts(t, 1)[0])
	_, addr, _ := startLimited(t, "1024", "1024", "--admin-listen", admin,
		"--max-connections-per-ip", "100", "--write-timeout", "5s", "--read-timeout", "5s")
	base := "http://" + addr
	cl := &http.Client{Timeout: 10 * time.Second}
	put := func(key string, body []byte) error {
		req, _ := http.NewRequest(http.MethodPut, base+"/v0/entity?id="+key, strings.NewReader(string(body)))
		resp, err := cl.Do(req)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("PUT %s: %d", key, resp.StatusCode)
		}
		return nil
	}
	require.NoError(t, put("big", make([]byte, 1<<20)))
	for i := range 2000 {
		require.NoError(t, put(fmt.Sprintf("s%04d", i), make([]byte, 512)))
	}
	metrics := []string{"process_open_fds", "go_goroutines", "go_memstats_heap_inuse_bytes", "process_resident_memory_bytes"}
	before := scrape(t, admin, metrics...)

	stop := make(chan struct{})
	var attacks sync.WaitGroup
	var conns sync.Map // every attacking connection, closed at the end
	dial := func() net.Conn {
		c, err := attacker.Dial("tcp", addr)
		if err != nil {
			return nil // refused past the caps: what the caps are for
		}
		conns.Store(c, true)
		return c
	}
	attack := func(f func()) {
		attacks.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				f()
			}
		})
	}
	// Idle connections, 150 of them: past the cap of 100 per address.
	for range 150 {
		dial()
	}
	// Announced bodies that never come.
	attack(func() {
		if c := dial(); c != nil {
			fmt.Fprintf(c, "PUT /v0/entity?id=x HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", 16<<20, strings.Repeat("a", 100))
		}
		time.Sleep(50 * time.Millisecond) // the attack's pace
	})
	// Batches of reads of a large value.
	var batch []byte
	for range 256 {
		batch = rpc.AppendBatchOp(batch, rpc.OpRead, []byte("big"), nil)
	}
	for range 2 {
		attack(func() {
			c := dial()
			if c == nil {
				time.Sleep(50 * time.Millisecond) // refused: the attack's pace
				return
			}
			fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n", rpc.BatchPath, len(batch))
			c.Write(batch)
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			io.Copy(io.Discard, io.LimitReader(c, 8<<20))
			c.Close()
		})
	}
	// Scans nobody reads.
	attack(func() {
		if c := dial(); c != nil {
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetReadBuffer(4096)
			}
			fmt.Fprintf(c, "GET /v0/entities?start=s HTTP/1.1\r\nHost: x\r\n\r\n")
		}
		time.Sleep(200 * time.Millisecond) // the attack's pace
	})

	// The well-behaved client, meanwhile.
	var lat []time.Duration
	var errs atomic.Int64
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		start := time.Now()
		key := fmt.Sprintf("c%d", i%100)
		if err := put(key, []byte(key)); err != nil {
			errs.Add(1)
			t.Logf("client: %v", err)
		}
		resp, err := cl.Get(base + "/v0/entity?id=" + key)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("GET %s: %d", key, resp.StatusCode)
			}
		}
		if err != nil {
			errs.Add(1)
			t.Logf("client: %v", err)
		}
		lat = append(lat, time.Since(start))
	}
	during := scrape(t, admin, metrics...)
	close(stop)
	attacks.Wait()
	conns.Range(func(c, _ any) bool { c.(net.Conn).Close(); return true })

	slices.Sort(lat)
	p99 := lat[len(lat)*99/100]
	t.Logf("client: %d PUT+GET pairs, p50 %v, p99 %v; node during the attack: %v; before: %v", len(lat), lat[len(lat)/2], p99, during, before)
	require.Zero(t, errs.Load(), "the well-behaved client's errors")
	require.Less(t, p99, time.Second, "the well-behaved client's p99")
	require.Less(t, during["go_memstats_heap_inuse_bytes"], before["go_memstats_heap_inuse_bytes"]+64<<20, "heap under attack")
	require.Less(t, during["process_resident_memory_bytes"], float64(256<<20), "RSS under attack")

	var after map[string]float64
	require.Eventually(t, func() bool {
		after = scrape(t, admin, metrics...)
		return after["process_open_fds"] <= before["process_open_fds"]+8 &&
			after["go_goroutines"] <= before["go_goroutines"]+8 &&
			after["go_memstats_heap_inuse_bytes"] <= before["go_memstats_heap_inuse_bytes"]+16<<20
	}, 30*time.Second, 200*time.Millisecond, "the node's resources back to about where they were: before %v, now %v", before, after)
}

package httpapi_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/httpapi"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/scan"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// Flow control and the client going away, on a node-local stream.

const (
	flowRecords   = 16384
	flowValueSize = 2048 // 32 MiB of values in all
)

// startFilled starts a one-node cluster on a store prefilled with
// flowRecords records; writeTimeout > 0 overrides the node's.
func startFilled(t *testing.T, writeTimeout time.Duration) *testcluster.Cluster {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "filled")
	testcluster.FillStore(t, dir, flowRecords, flowValueSize)
	return testcluster.Start(t, 1, func(_ int, cfg *node.Config) {
		cfg.DataDir = dir
		if writeTimeout > 0 {
			cfg.WriteTimeout = writeTimeout
		}
	})
}

// producedSettles waits until node 0's count of records produced by range
// streams stops growing, as it does once a stream's writes block on a
// client that does not read, and returns it. Stopped means unchanged for
// 300 ms; a node that goes on producing fails the test after 10 s.
func producedSettles(t *testing.T, c *testcluster.Cluster) float64 {
	t.Helper()
	const quiet, limit = 300 * time.Millisecond, 10 * time.Second
	last, since, start := c.Metric(t, 0, "dhtkv_scan_records_total"), time.Now(), time.Now()
	for time.Since(since) < quiet {
		require.Less(t, time.Since(start), limit, "range streams still producing (%v records)", last)
		time.Sleep(20 * time.Millisecond) // the polling interval
		if n := c.Metric(t, 0, "dhtkv_scan_records_total"); n != last {
			last, since = n, time.Now()
		}
	}
	return last
}

// TestScanSlowClientBoundsProduction reads with a 4 KiB receive buffer,
// stalls, and checks that the node stops producing while the client does
// not read: the records produced stay a small fraction of the range and do
// not grow during the stall. Then it reads everything and checks every
// record, so the stall cost nothing but time.
func TestScanSlowClientBoundsProduction(t *testing.T) {
	c := startFilled(t, 0)
	base := testcluster.NewBase(flowValueSize)
	for _, format := range []string{"chunks", "binary"} {
		t.Run(format, func(t *testing.T) {
			before := c.Metric(t, 0, "dhtkv_scan_records_total")
			rc := testcluster.RawGet(t, c.Config(0).Listen, "/v0/entities?start=key&format="+format, 4096)
			require.Equal(t, 200, rc.Status)
			small := make([]byte, 4096)
			_, err := io.ReadFull(rc.Wire, small)
			require.NoError(t, err)

			stalled := producedSettles(t, c) - before
			// The client stays stalled (the behaviour under test): the
			// node must not produce more meanwhile.
			time.Sleep(500 * time.Millisecond)
			stalledLater := c.Metric(t, 0, "dhtkv_scan_records_total") - before
			t.Logf("%s: %v of %d records produced while the client is stalled (%.1f MiB)",
				format, stalled, flowRecords, stalled*flowValueSize/(1<<20))
			require.Equal(t, stalled, stalledLater, "production went on while the client did not read")
			require.Less(t, stalled, float64(flowRecords)/4, "production is not bounded by the client")

			// Resume: read the rest a few KB at a time and check it all.
			r := io.MultiReader(bytes.NewReader(small), rc.Wire)
			var want []byte
			n := 0
			if format == "chunks" {
				// Re-parse from the start: the raw bytes read so far
				// are the head of the chunked encoding.
				cr := testcluster.NewChunkedReader(r)
				for {
					chunk, err := cr.Chunk()
					if err == io.EOF {
						break
					}
					require.NoError(t, err)
					want = testcluster.GenValue(want, base, n)
					require.Equal(t, append(append(testcluster.GenKey(n), '\n'), want...), chunk, "record %d", n)
					n++
				}
			} else {
				d := scan.NewDecoder(testcluster.NewChunkedReader(r), 1024, 1<<20)
				for d.Next() {
					want = testcluster.GenValue(want, base, n)
					require.Equal(t, testcluster.GenKey(n), d.Key())
					require.True(t, bytes.Equal(want, d.Value()), "record %d", n)
					n++
				}
				require.NoError(t, d.Err())
			}
			require.Equal(t, flowRecords, n)
			require.Equal(t, float64(flowRecords), c.Metric(t, 0, "dhtkv_scan_records_total")-before)
		})
	}
}

// TestScanClientGoneStopsAndCounts closes the connection mid-stream: the
// stream stops, releases its iterator (the node's store closes cleanly at
// the end of the test, which Pebble refuses with a leaked iterator) and is
// counted as an abort.
func TestScanClientGoneStopsAndCounts(t *testing.T) {
	c := startFilled(t, 0)
	gone := func() float64 { return c.Metric(t, 0, "dhtkv_scan_aborts_total", "reason", scan.AbortClientGone) }
	rc := testcluster.RawGet(t, c.Config(0).Listen, "/v0/entities?start=key&format=binary", 4096)
	require.Equal(t, 200, rc.Status)
	_, err := io.ReadFull(rc.Wire, make([]byte, 10000))
	require.NoError(t, err)
	rc.Conn.Close()
	require.Eventually(t, func() bool { return gone() == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Less(t, c.Metric(t, 0, "dhtkv_scan_records_total"), float64(flowRecords))
	// The node still serves scans.
	resp := testcluster.HTTPGet(t, c.URL(0)+"/v0/entities?start=key00000000&end=key00000010&format=binary")
	require.Len(t, testcluster.ReadBinary(t, resp.Body), 10)
	c.StopNode(0) // fails if the aborted stream leaked its iterator
}

// TestScanIdleTimeout: a stream may run longer than the write timeout as
// long as the client keeps reading, and is aborted when the client stalls
// for longer than it.
func TestScanIdleTimeout(t *testing.T) {
	// Ten times the reader's pauses below, so that a busy machine cannot
	// stretch a pause into a stall.
	const writeTimeout = time.Second
	c := startFilled(t, writeTimeout)

	// A client that keeps reading, slowly: the whole stream takes well
	// over the write timeout and completes.
	rc := testcluster.RawGet(t, c.Config(0).Listen, "/v0/entities?start=key&format=binary", 4096)
	require.Equal(t, 200, rc.Status)
	d := scan.NewDecoder(rc.ChunkedReader, 1024, 1<<20)
	start := time.Now()
	for d.Next() {
		if d.Count()%1000 == 0 {
			time.Sleep(100 * time.Millisecond) // a slow reader is the behaviour under test
		}
	}
	require.NoError(t, d.Err())
	require.Equal(t, uint64(flowRecords), d.Count())
	// 16 pauses of 100 ms: a lower bound, which load cannot break.
	require.Greater(t, time.Since(start), writeTimeout, "the stream outlived the write timeout")

	// A client that stops reading is cut off.
	timeouts := func() float64 { return c.Metric(t, 0, "dhtkv_scan_aborts_total", "reason", scan.AbortClientTimeout) }
	rc = testcluster.RawGet(t, c.Config(0).Listen, "/v0/entities?start=key&format=binary", 4096)
	require.Equal(t, 200, rc.Status)
	require.Eventually(t, func() bool { return timeouts() == 1 }, 10*time.Second, 20*time.Millisecond)
}

// TestScanShutdownAbortsStreams: stopping a node does not wait for a
// stalled range stream (a scan may run for any time); the stream ends
// truncated, and the store closes cleanly (no leaked iterator).
func TestScanShutdownAbortsStreams(t *testing.T) {
	c := startFilled(t, 0)
	rc := testcluster.RawGet(t, c.Config(0).Listen, "/v0/entities?start=key", 4096)
	require.Equal(t, 200, rc.Status)
	_, err := rc.Chunk()
	require.NoError(t, err)
	producedSettles(t, c)       // the stream is now blocked on the stalled client
	reg := c.Node(0).Registry() // still readable once the node stopped
	start := time.Now()
	c.StopNode(0)
	// Only a loose bound: waiting for the stream would take the 30 s
	// write timeout (and StopNode gives up after 10 s).
	require.Less(t, time.Since(start), 3*time.Second, "Shutdown waited for the stalled stream")
	for err == nil {
		_, err = rc.Chunk()
	}
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	require.Equal(t, float64(1), testcluster.Metric(t, reg, "dhtkv_scan_aborts_total", "reason", scan.AbortShutdown))
}

// TestScanShutdownAbortsHTTP10Stream: the same for a stream to an HTTP/1.0
// client, served on a hijacked connection that fasthttp's shutdown does
// not wait for: the node's Close does, and the store still closes
// cleanly after the stream's iterator.
func TestScanShutdownAbortsHTTP10Stream(t *testing.T) {
	c := startFilled(t, 0)
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		return errors.Join(err, serr)
	}}
	conn, err := d.Dial("tcp", c.Config(0).Listen)
	require.NoError(t, err)
	defer conn.Close()
	_, err = io.WriteString(conn, "GET /v0/entities?start=key&format=binary HTTP/1.0\r\n\r\n")
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode)
	producedSettles(t, c) // the stream is now blocked on the stalled client
	reg := c.Node(0).Registry()
	c.StopNode(0) // fails if the stream's iterator was still open
	dec := scan.NewDecoder(resp.Body, 1024, 1<<20)
	for dec.Next() {
	}
	require.ErrorIs(t, dec.Err(), scan.ErrTruncated, "the client sees a truncated stream, never a complete one")
	require.Equal(t, float64(1), testcluster.Metric(t, reg, "dhtkv_scan_aborts_total", "reason", scan.AbortShutdown))
}

// TestScanMinRate: a client that keeps reading, but trickles below
// --scan-min-rate, is cut off within the allowance (5 s plus a piece at
// the rate), long before the write timeout would.
func TestScanMinRate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "filled")
	testcluster.FillStore(t, dir, flowRecords, flowValueSize)
	c := testcluster.Start(t, 1, func(_ int, cfg *node.Config) {
		cfg.DataDir = dir
		cfg.ScanMinRate = 1 << 30 // a piece's allowance: 5 s and a few µs
	})
	timeouts := func() float64 { return c.Metric(t, 0, "dhtkv_scan_aborts_total", "reason", scan.AbortClientTimeout) }
	rc := testcluster.RawGet(t, c.Config(0).Listen, "/v0/entities?start=key&format=binary", 4096)
	require.Equal(t, 200, rc.Status)
	start := time.Now()
	buf := make([]byte, 512)
	for timeouts() == 0 {
		require.Less(t, time.Since(start), 20*time.Second, "a trickling client was not cut off")
		_ = rc.Conn.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := rc.Wire.Read(buf); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			break // cut off: the connection closed
		}
		time.Sleep(200 * time.Millisecond) // the trickle: 2.5 KiB/s is the behaviour under test
	}
	require.Eventually(t, func() bool { return timeouts() == 1 }, 10*time.Second, 20*time.Millisecond)
	require.Less(t, time.Since(start), 20*time.Second, "cut off by the rate, not the 30 s write timeout")
}

// TestMaxScans: past --max-scans streams in flight a range request gets
// 429 with the reason; once one ends, a new one is served.
func TestMaxScans(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "filled")
	testcluster.FillStore(t, dir, flowRecords, flowValueSize)
	c := testcluster.Start(t, 1, func(_ int, cfg *node.Config) {
		cfg.DataDir = dir
		cfg.MaxScans = 2
	})
	addr := c.Config(0).Listen
	first := testcluster.RawGet(t, addr, "/v0/entities?start=key&format=binary", 4096)
	second := testcluster.RawGet(t, addr, "/v0/entities?start=key&format=binary", 4096)
	require.Equal(t, 200, first.Status)
	require.Equal(t, 200, second.Status)
	cl := testcluster.NewClient(t)
	code, body := cl.Do(t, http.MethodGet, "http://"+addr+"/v0/entities?start=key&limit=1", nil)
	require.Equal(t, http.StatusTooManyRequests, code)
	require.Contains(t, string(body), "too many range scans in flight (--max-scans 2)")
	first.Conn.Close()
	require.Eventually(t, func() bool {
		code, _ := cl.Do(t, http.MethodGet, "http://"+addr+"/v0/entities?start=key&limit=1", nil)
		return code == http.StatusOK
	}, 10*time.Second, 20*time.Millisecond, "a slot freed by the first stream's end")
}

// TestScanMinRateKeepsAFastEnoughClient: a client reading at five times
// --scan-min-rate (its default, 16 KiB/s) keeps its stream. A write
// blocked on a full socket returns only once the kernel has freed a third
// of the send buffer, which Linux grows to tcp_wmem's maximum (4 MiB
// here): such a client had to read about 1.3 MiB within one piece's
// allowance (5 s + 64 KiB at the rate: 9 s), and was cut off as a
// trickler; a stream's send buffer is now capped (scanSendBuffer).
func TestScanMinRateKeepsAFastEnoughClient(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "filled")
	testcluster.FillStore(t, dir, flowRecords, flowValueSize)
	c := testcluster.Start(t, 1, func(_ int, cfg *node.Config) { cfg.DataDir = dir })
	require.EqualValues(t, httpapi.DefaultScanMinRate, c.Config(0).ScanMinRate)
	timeouts := func() float64 { return c.Metric(t, 0, "dhtkv_scan_aborts_total", "reason", scan.AbortClientTimeout) }
	rc := testcluster.RawGet(t, c.Config(0).Listen, "/v0/entities?start=key&format=binary", 4096)
	require.Equal(t, 200, rc.Status)
	start := time.Now()
	buf := make([]byte, 8<<10)
	read := 0
	for time.Since(start) < 15*time.Second && timeouts() == 0 { // cut at about 9 s before the cap
		_ = rc.Conn.SetReadDeadline(time.Now().Add(time.Second))
		n, err := io.ReadFull(rc.Wire, buf)
		read += n
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			break // cut off: the connection closed
		}
		time.Sleep(100 * time.Millisecond) // at most 80 KiB/s: five times the minimum
	}
	rate := float64(read) / time.Since(start).Seconds()
	t.Logf("read %d bytes in %v: %.1f KiB/s", read, time.Since(start), rate/1024)
	require.Greater(t, rate, 3.0*httpapi.DefaultScanMinRate, "the client reads well above the minimum")
	require.Zero(t, timeouts(), "a client reading %.1f KiB/s was cut off as slower than %d B/s", rate/1024, httpapi.DefaultScanMinRate)
}

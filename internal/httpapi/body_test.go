package httpapi_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// tcpQueue is one server-side socket's queues in /proc/net/tcp: bytes
// sent but not yet taken by the client (tx), and received but not yet read
// by the node (rx).
type tcpQueue struct{ tx, rx int64 }

// serverQueues lists the queues of the node's established connections on
// port.
func serverQueues(t *testing.T, port int) []tcpQueue {
	t.Helper()
	b, err := os.ReadFile("/proc/net/tcp")
	require.NoError(t, err)
	suffix := fmt.Sprintf(":%04X", port)
	var qs []tcpQueue
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 5 || !strings.HasSuffix(f[1], suffix) || f[3] != "01" { // 01: ESTABLISHED
			continue
		}
		tx, rx, _ := strings.Cut(f[4], ":")
		var q tcpQueue
		q.tx, err = strconv.ParseInt(tx, 16, 64)
		require.NoError(t, err)
		q.rx, err = strconv.ParseInt(rx, 16, 64)
		require.NoError(t, err)
		qs = append(qs, q)
	}
	return qs
}

// unreadBytes is how many bytes the kernel holds, received but not yet
// read by the node, on the node's established connections on port: 0
// once the node has read everything its clients sent.
func unreadBytes(t *testing.T, port int) (sockets int, unread int64) {
	t.Helper()
	qs := serverQueues(t, port)
	for _, q := range qs {
		unread += q.rx
	}
	return len(qs), unread
}

// heapInUse is the process's live heap after a collection: the node runs
// in this process.
func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// stall opens n connections that each send head, the first bytes of a
// body, and then nothing, and waits until the node has read all of it.
func stall(t *testing.T, addr string, n int, head string, sent int) []net.Conn {
	t.Helper()
	port, err := strconv.Atoi(addr[strings.LastIndexByte(addr, ':')+1:])
	require.NoError(t, err)
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		_, err = io.WriteString(c, fmt.Sprintf(head, i)+strings.Repeat("v", sent))
		require.NoError(t, err)
		conns[i] = c
	}
	require.Eventually(t, func() bool {
		sockets, unread := unreadBytes(t, port)
		return sockets >= n && unread == 0
	}, 10*time.Second, 5*time.Millisecond, "the node read what was sent")
	return conns
}

// Memory held for a request body grows with the bytes received, not with
// the length announced: 16 connections announcing a largest body (16 MiB,
// by Content-Length or by a first chunk that size) and sending 100 bytes
// cost the node kilobytes. fasthttp alone allocates the announced length
// (rounded up to a power of two, 32 MiB) before reading: 512 MiB here.
func TestBodyMemoryFollowsBytesReceived(t *testing.T) {
	const maxValue = 16 << 20
	_, base := testcluster.Single(t, func(_ int, cfg *node.Config) {
		cfg.MaxValueBytes = maxValue
		cfg.MaxConnectionsPerIP = 0
	})
	addr := strings.TrimPrefix(base, "http://")
	for _, tc := range []struct{ name, head string }{
		{"content-length", "PUT /v0/entity?id=big%d HTTP/1.1\r\nHost: x\r\nContent-Length: " + strconv.Itoa(maxValue) + "\r\n\r\n"},
		{"chunked", "PUT /v0/entity?id=big%d HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + strconv.FormatInt(maxValue, 16) + "\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := heapInUse()
			conns := stall(t, addr, 16, tc.head, 100)
			grown := int64(heapInUse()) - int64(before)
			t.Logf("heap in use grew by %d KiB for 16 stalled bodies of %d MiB announced", grown>>10, maxValue>>20)
			assert.Less(t, grown, int64(4<<20), "16 × 100 bytes received must not cost 16 × %d MiB", maxValue>>20)
			for _, c := range conns {
				c.Close()
			}
		})
	}
	code, _ := testcluster.NewClient(t).Get(t, base, "big0", 0, 0)
	require.Equal(t, 404, code)
}

// Bodies in flight share --max-inflight-body-bytes: a body that would take
// the node past it is refused with 503 and its connection closed, and
// the budget is back once the bodies in flight end.
func TestInflightBodyBudget(t *testing.T) {
	const maxValue = 1 << 20
	_, base := testcluster.Single(t, func(_ int, cfg *node.Config) {
		cfg.MaxValueBytes = maxValue
		cfg.MaxInflightBodyBytes = 2 * maxValue
	})
	addr := strings.TrimPrefix(base, "http://")
	head := "PUT /v0/entity?id=k%d HTTP/1.1\r\nHost: x\r\nContent-Length: " + strconv.Itoa(maxValue) + "\r\n\r\n"
	// Two bodies 700 KiB along hold a buffer of 1 MiB each: the budget.
	held := stall(t, addr, 2, head, 700<<10)
	// The third is refused before the node reads a byte of it beyond the
	// 8 KiB fasthttp reads ahead of the handler (readBodyWithStreaming):
	// it sends just that, so the refusal is read back whole, not lost to
	// a reset over unread bytes.
	third, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer third.Close()
	require.NoError(t, third.SetDeadline(time.Now().Add(5*time.Second)))
	_, err = io.WriteString(third, fmt.Sprintf(head, 3)+strings.Repeat("v", 8<<10))
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(third), nil)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, 503, resp.StatusCode, "%s", body)
	require.Equal(t, "request bodies in flight exceed this node's budget (--max-inflight-body-bytes); retry later\n", string(body))
	require.True(t, resp.Close, "the rest of the body is never read: the connection ends")
	for _, c := range held {
		c.Close()
	}
	cl := testcluster.NewClient(t)
	value := strings.Repeat("w", maxValue)
	require.Eventually(t, func() bool { return cl.Put(t, base, "after", []byte(value), 0, 0) == 201 },
		10*time.Second, 10*time.Millisecond, "the budget is free again once the bodies in flight ended")
	code, got := cl.Get(t, base, "after", 0, 0)
	require.Equal(t, 200, code)
	require.Equal(t, value, string(got))
}

// onlyReader hides the length of the reader it wraps: net/http then sends
// the body chunked.
type onlyReader struct{ io.Reader }

// Bodies of every size around the read-ahead (8 KiB) and the first buffer
// (16 KiB), sent with a length and chunked, are stored exactly; a chunked
// body over the limit is refused with 413.
func TestBodySizes(t *testing.T) {
	const maxValue = 1 << 20
	_, base := testcluster.Single(t, func(_ int, cfg *node.Config) { cfg.MaxValueBytes = maxValue })
	cl := testcluster.NewClient(t)
	for _, size := range []int{0, 1, 8191, 8192, 8193, 16<<10 + 1, 100 << 10, maxValue} {
		value := make([]byte, size)
		for i := range value {
			value[i] = byte(i * 7)
		}
		for _, chunked := range []bool{false, true} {
			key := fmt.Sprintf("size-%d-%v", size, chunked)
			var body io.Reader = bytes.NewReader(value)
			if chunked {
				body = onlyReader{body}
			}
			req, err := http.NewRequest(http.MethodPut, testcluster.EntityURL(base, key, 0, 0), body)
			require.NoError(t, err)
			resp, err := cl.HTTP.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, 201, resp.StatusCode, key)
			code, got := cl.Get(t, base, key, 0, 0)
			require.Equal(t, 200, code, key)
			require.True(t, bytes.Equal(value, got), "%s: %d bytes back", key, len(got))
		}
	}
	req, err := http.NewRequest(http.MethodPut, testcluster.EntityURL(base, "over", 0, 0), onlyReader{bytes.NewReader(make([]byte, maxValue+1))})
	require.NoError(t, err)
	resp, err := cl.HTTP.Do(req)
	if err == nil { // the node may close before it took every byte
		reason, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, 413, resp.StatusCode)
		require.Equal(t, fmt.Sprintf("value too large: limit is %d bytes\n", maxValue), string(reason))
	}
	code, _ := cl.Get(t, base, "over", 0, 0)
	require.Equal(t, 404, code)
}

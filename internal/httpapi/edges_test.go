package httpapi_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// Request bodies cut short or framed past the limit, and bodies on
// requests that take none (docs/http.md, "Request bodies"), against a real
// node over raw sockets.

// halfClosed writes req on a fresh connection, closes the connection's
// write side (the client sends FIN: its body ends there), and returns all
// the node sends until it closes.
func halfClosed(t *testing.T, base, req string) string {
	t.Helper()
	return rawExchange(t, base, req, true)
}

// A body that ends before its framing says it does is incomplete (RFC
// 9112 §6.3, §7.1): 400 with the reason, the connection closed, nothing
// stored, an older value left as it was. fasthttp v1.74.0's body stream
// ends a chunked body cut at a chunk boundary with a plain io.EOF, as if
// its last chunk had come: the node stored "abc".
func TestTruncatedBodyNotStored(t *testing.T) {
	_, base := testcluster.Single(t)
	cl := testcluster.NewClient(t)
	const head = "PUT /v0/entity?id=%s HTTP/1.1\r\nHost: x\r\n"
	chunked := head + "Transfer-Encoding: chunked\r\n\r\n"
	big := strings.Repeat("b", 20<<10) // past the 8 KiB fasthttp reads before the handler
	for _, c := range []struct{ name, req, reason string }{
		{"chunked, cut after a chunk", chunked + "3\r\nabc\r\n", "incomplete body"},
		{"chunked, cut after two chunks", chunked + "3\r\nabc\r\n2\r\nde\r\n", "incomplete body"},
		{"chunked, cut after a large chunk", chunked + strconv.FormatInt(int64(len(big)), 16) + "\r\n" + big + "\r\n", "incomplete body"},
		{"chunked, cut within a chunk", chunked + "5\r\nabc", "incomplete body"},
		{"chunked, cut within a chunk size", chunked + "3\r\nabc\r\n1", "incomplete or malformed body"},
		{"chunked, cut before the chunk's CRLF", chunked + "3\r\nabc", "incomplete or malformed body"},
		{"chunked, nothing sent", chunked, "incomplete body"},
		{"Content-Length, cut within the read-ahead", head + "Content-Length: 10\r\n\r\nabc", "malformed request"},
		{"Content-Length, cut past the read-ahead", head + "Content-Length: " + strconv.Itoa(2*len(big)) + "\r\n\r\n" + big, "incomplete body"},
	} {
		t.Run(c.name, func(t *testing.T) {
			// A key never written, and one holding an older value.
			for _, key := range []string{"absent", "older"} {
				if key == "older" {
					require.Equal(t, 201, cl.Put(t, base, key, []byte("old"), 0, 0))
				} else {
					require.Equal(t, 202, cl.Delete(t, base, key, 0, 0))
				}
				resp := halfClosed(t, base, strings.Replace(c.req, "%s", key, 1))
				require.Regexp(t, `^HTTP/1.1 400 `, resp)
				assert.Contains(t, resp, "\r\nConnection: close\r\n")
				assert.Contains(t, resp, c.reason)
				assert.Equal(t, 1, strings.Count(resp, "HTTP/1.1 "), "one answer only: %q", resp)
				code, got := cl.Get(t, base, key, 0, 0)
				if key == "absent" {
					assert.Equal(t, 404, code, "nothing stored: %d bytes", len(got))
				} else {
					assert.Equal(t, 200, code)
					assert.Equal(t, "old", string(got), "the older value is unchanged")
				}
			}
		})
	}
	// The same bodies whole are stored, the client half-closing after its
	// last chunk or its last byte.
	for _, c := range []struct{ name, req, want string }{
		{"chunked", chunked + "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", "abcde"},
		{"chunked with a trailer", chunked + "3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n", "abc"},
		{"Content-Length", head + "Content-Length: 3\r\n\r\nabc", "abc"},
	} {
		t.Run("whole, "+c.name, func(t *testing.T) {
			resp := halfClosed(t, base, strings.Replace(c.req, "%s", "whole", 1))
			require.Regexp(t, `^HTTP/1.1 201 `, resp)
			code, got := cl.Get(t, base, "whole", 0, 0)
			require.Equal(t, 200, code)
			require.Equal(t, c.want, string(got))
		})
	}
}

// A chunk whose size alone takes the body over --max-value-bytes is
// refused at once with 413, as a Content-Length over it is, whether or
// not any of the chunk's bytes arrived: the node does not wait for bytes
// it would refuse (it answered 408 once --read-timeout passed).
func TestOversizedChunkRefusedAtOnce(t *testing.T) {
	_, base := testcluster.Single(t, func(_ int, c *node.Config) {
		c.MaxValueBytes = 100
		c.ReadTimeout = time.Minute // far past the test's deadline
	})
	const head = "PUT /v0/entity?id=big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
	for _, c := range []struct{ name, body string }{
		{"huge chunk, some bytes", "7fffffff\r\nabc"},
		{"huge chunk, no bytes", "7fffffff\r\n"},
		{"just over", "65\r\nabc"},
		{"second chunk over", "60\r\n" + strings.Repeat("a", 96) + "\r\n5\r\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			resp := exchange(t, base, head+c.body) // the client keeps its side open
			require.Regexp(t, `^HTTP/1.1 413 `, resp)
			assert.Contains(t, resp, "\r\nConnection: close\r\n")
			assert.True(t, strings.HasSuffix(resp, "\r\n\r\nvalue too large: limit is 100 bytes\n"), "%q", resp)
			assert.Less(t, time.Since(start), 5*time.Second)
		})
	}
	code, _ := testcluster.NewClient(t).Get(t, base, "big", 0, 0)
	require.Equal(t, 404, code)
}

// A body on a request that takes none (GET, DELETE, a bad PUT's) is read
// and discarded by its framing, and the connection carries on: a
// pipelined request after it is answered too, and the body's bytes are
// never read as a request.
func TestIgnoredBodyDiscarded(t *testing.T) {
	_, base := testcluster.Single(t, func(_ int, c *node.Config) { c.MaxValueBytes = 64 << 10 })
	cl := testcluster.NewClient(t)
	require.Equal(t, 201, cl.Put(t, base, "k", []byte("v"), 0, 0))
	smuggled := "PUT /v0/entity?id=smuggled HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx"
	big := strings.Repeat("g", 40<<10) // past fasthttp's 8 KiB read-ahead
	for _, c := range []struct{ name, first string }{
		{"GET with Content-Length", "GET /v0/entity?id=k HTTP/1.1\r\nHost: x\r\nContent-Length: " + strconv.Itoa(len(smuggled)) + "\r\n\r\n" + smuggled},
		{"GET with a large Content-Length", "GET /v0/entity?id=k HTTP/1.1\r\nHost: x\r\nContent-Length: " + strconv.Itoa(len(big)) + "\r\n\r\n" + big},
		{"GET chunked", "GET /v0/entity?id=k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + strconv.FormatInt(int64(len(smuggled)), 16) + "\r\n" + smuggled + "\r\n0\r\n\r\n"},
		{"DELETE with Content-Length", "DELETE /v0/entity?id=gone HTTP/1.1\r\nHost: x\r\nContent-Length: " + strconv.Itoa(len(smuggled)) + "\r\n\r\n" + smuggled},
		{"PUT with a bad key", "PUT /v0/entity?id= HTTP/1.1\r\nHost: x\r\nContent-Length: " + strconv.Itoa(len(smuggled)) + "\r\n\r\n" + smuggled},
		{"status with Content-Length", "GET /v0/status HTTP/1.1\r\nHost: x\r\nContent-Length: " + strconv.Itoa(len(smuggled)) + "\r\n\r\n" + smuggled},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
			require.NoError(t, err)
			defer conn.Close()
			require.NoError(t, conn.SetDeadline(time.Now().Add(5*time.Second)))
			_, err = io.WriteString(conn, c.first+"GET /v0/entity?id=k HTTP/1.1\r\nHost: x\r\n\r\n")
			require.NoError(t, err)
			br := bufio.NewReader(conn)
			first, err := http.ReadResponse(br, nil)
			require.NoError(t, err)
			_, err = io.Copy(io.Discard, first.Body)
			require.NoError(t, err)
			assert.False(t, first.Close, "the connection carries on")
			second, err := http.ReadResponse(br, nil)
			require.NoError(t, err, "the pipelined request is answered")
			body, err := io.ReadAll(second.Body)
			require.NoError(t, err)
			assert.Equal(t, 200, second.StatusCode)
			assert.Equal(t, "v", string(body))
		})
	}
	// A body over the limit (64 KiB here) is not read through: the
	// answer is the connection's last.
	resp := exchange(t, base, "GET /v0/entity?id=k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n7fffffff\r\n"+smuggled)
	require.Regexp(t, `^HTTP/1.1 200 `, resp)
	assert.Contains(t, resp, "\r\nConnection: close\r\n")
	assert.Equal(t, 1, strings.Count(resp, "HTTP/1.1 "), "one answer only: %q", resp)
	code, _ := cl.Get(t, base, "smuggled", 0, 0)
	require.Equal(t, 404, code, "a body is never read as a request")
}

// A value over --max-value-bytes sent with its body, as most clients send
// it (without Expect: 100-continue), gets a 413 that the client can read:
// the node answers at once, then half-closes and reads and drops what the
// client still sends (lingering close) instead of closing with bytes
// unread, which resets the connection and makes the client lose the
// answer. 16 MiB, the default limit, is more than loopback's socket
// buffers hold: before, the client's write failed with "connection reset
// by peer", and net/http's client returned that error most times.
func TestOverLimitAnswerReadable(t *testing.T) {
	const limit = 16 << 20
	_, base := testcluster.Single(t, func(_ int, c *node.Config) { c.MaxValueBytes = limit })
	addr := strings.TrimPrefix(base, "http://")
	reason := fmt.Sprintf("value too large: limit is %d bytes\n", limit)
	value := bytes.Repeat([]byte("v"), limit+1)
	for _, c := range []struct{ name, head, body string }{
		{"Content-Length", "Content-Length: " + strconv.Itoa(limit+1) + "\r\n", string(value)},
		{"chunked", "Transfer-Encoding: chunked\r\n", strconv.FormatInt(limit+1, 16) + "\r\n" + string(value) + "\r\n0\r\n\r\n"},
	} {
		t.Run("raw, whole request then the answer, "+c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			defer conn.Close()
			require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
			// A client that sends its whole request before it reads.
			_, err = io.WriteString(conn, "PUT /v0/entity?id=big HTTP/1.1\r\nHost: x\r\n"+c.head+"\r\n"+c.body)
			require.NoError(t, err, "the node reads what the client sends: no reset")
			resp, err := io.ReadAll(conn)
			require.NoError(t, err, "the answer, then the end of the connection: %q", resp)
			require.Regexp(t, `^HTTP/1.1 413 `, string(resp))
			assert.Contains(t, string(resp), "\r\nConnection: close\r\n")
			assert.True(t, strings.HasSuffix(string(resp), "\r\n\r\n"+reason), "%q", resp)
		})
	}
	t.Run("net/http", func(t *testing.T) {
		cl := testcluster.NewClient(t)
		for i := range 3 {
			req, err := http.NewRequest(http.MethodPut, testcluster.EntityURL(base, "big", 0, 0), bytes.NewReader(value))
			require.NoError(t, err)
			resp, err := cl.HTTP.Do(req)
			require.NoError(t, err, "try %d: the answer, not a reset", i)
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.NoError(t, err)
			require.Equal(t, 413, resp.StatusCode)
			require.Equal(t, reason, string(got))
		}
	})
	code, _ := testcluster.NewClient(t).Get(t, base, "big", 0, 0)
	require.Equal(t, 404, code)
}

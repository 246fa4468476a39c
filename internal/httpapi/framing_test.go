package httpapi_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// exchange writes req on a fresh connection and returns everything the
// node sends until it closes the connection. A node that keeps the
// connection open fails the test when the read deadline passes.
func exchange(t *testing.T, base, req string) string {
	t.Helper()
	return rawExchange(t, base, req, false)
}

// rawExchange is exchange, closing the connection's write side after req
// when closeWrite (the client sends FIN: a body ends there).
func rawExchange(t *testing.T, base, req string, closeWrite bool) string {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(5*time.Second)))
	_, err = io.WriteString(conn, req)
	require.NoError(t, err)
	if closeWrite {
		require.NoError(t, conn.(*net.TCPConn).CloseWrite())
	}
	resp, err := io.ReadAll(conn)
	require.NoError(t, err, "the node answers and closes the connection; got %q", resp)
	return string(resp)
}

// Message framing the node cannot trust is refused with 400, and the
// connection is closed: whatever follows the headers is never read as
// another request (request smuggling behind a proxy that frames the
// message the other way). Every case carries a second request after what
// this node would take as the body; it must not be served.
func TestAmbiguousFramingRefused(t *testing.T) {
	_, base := testcluster.Single(t)
	const next = "PUT /v0/entity?id=smuggled2 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx"
	for _, c := range []struct {
		name, head, body, reason string
	}{
		{"chunked and Content-Length", "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", "0\r\n\r\n", "both Transfer-Encoding and Content-Length"},
		{"Content-Length and chunked", "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n", "both Transfer-Encoding and Content-Length"},
		{"chunked in capitals and Content-Length", "Content-Length: 5\r\ntransfer-encoding: CHUNKED\r\n", "0\r\n\r\n", "both Transfer-Encoding and Content-Length"},
		{"identity", "Transfer-Encoding: identity\r\n", "", "Transfer-Encoding other than chunked"},
		{"identity and Content-Length", "Transfer-Encoding: identity\r\nContent-Length: 5\r\n", "hello", "Transfer-Encoding"},
		{"gzip", "Transfer-Encoding: gzip\r\n", "", "malformed request"},
		{"gzip, chunked", "Transfer-Encoding: gzip, chunked\r\n", "0\r\n\r\n", "malformed request"},
		{"two Transfer-Encodings", "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n", "malformed request"},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp := exchange(t, base, "PUT /v0/entity?id=smuggled HTTP/1.1\r\nHost: x\r\n"+c.head+"\r\n"+c.body+next)
			require.Regexp(t, `^HTTP/1.1 400 `, resp)
			assert.Equal(t, 1, strings.Count(resp, "HTTP/1.1 "), "one answer only: %q", resp)
			assert.Contains(t, resp, "\r\nConnection: close\r\n")
			assert.Contains(t, resp, c.reason)
		})
	}
	cl := testcluster.NewClient(t)
	for _, k := range []string{"smuggled", "smuggled2"} {
		code, _ := cl.Get(t, base, k, 0, 0)
		assert.Equal(t, 404, code, "%s was never written", k)
	}
	// Plain chunked bodies are fine.
	resp := exchange(t, base, "PUT /v0/entity?id=chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
	require.Regexp(t, `^HTTP/1.1 201 `, resp)
	code, body := cl.Get(t, base, "chunked", 0, 0)
	require.Equal(t, 200, code)
	require.Equal(t, "abcde", string(body))
}

// A request line of an HTTP version other than 1.1 and 1.0 is a 505 with
// its reason, the connection closed; 1.0 and 1.1 are served.
func TestHTTPVersionRefused(t *testing.T) {
	_, base := testcluster.Single(t)
	for _, version := range []string{"HTTP/2.0", "HTTP/1.2", "HTTP/3.0"} {
		t.Run(version, func(t *testing.T) {
			resp := exchange(t, base, "GET /v0/status "+version+"\r\nHost: x\r\n\r\n")
			require.Regexp(t, `^HTTP/1.1 505 `, resp)
			assert.Contains(t, resp, "\r\nConnection: close\r\n")
			assert.Contains(t, resp, "HTTP version not supported: dhtkv speaks HTTP/1.1 (and HTTP/1.0)\n")
		})
	}
	for _, version := range []string{"HTTP/1.1", "HTTP/1.0"} {
		resp := exchange(t, base, "GET /v0/status "+version+"\r\nHost: x\r\nConnection: close\r\n\r\n")
		require.Regexp(t, `^HTTP/1.. 200 `, resp, version)
	}
}

// A request fasthttp cannot read is a 400 whose one line says what was
// wrong with it, fasthttp's reason without its dump of the read buffer,
// and the connection is closed. Nothing is stored.
func TestMalformedRequestReasons(t *testing.T) {
	_, base := testcluster.Single(t)
	for _, c := range []struct{ name, req, reason string }{
		{"no HTTP version", "GET /v0/entity?id=a\r\n\r\n", `cannot find whitespace in the first line of request "GET /v0/entity?id=a\r\n\r\n"`},
		{"no Host", "GET /v0/entity?id=a HTTP/1.1\r\n\r\n", "missing required host header in request"},
		{"negative Content-Length", "PUT /v0/entity?id=m1 HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", "cannot parse content-length"},
		{"two Content-Lengths", "PUT /v0/entity?id=m2 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", "duplicate content-length header"},
		{"a header without a colon", "GET /v0/entity?id=a HTTP/1.1\r\nHost: x\r\nNoColon\r\n\r\n", `missing colon: "NoColon"`},
		{"gzip", "PUT /v0/entity?id=m3 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", `unsupported transfer-encoding: "gzip"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp := exchange(t, base, c.req)
			require.Regexp(t, `^HTTP/1.1 400 `, resp)
			assert.Contains(t, resp, "\r\nConnection: close\r\n")
			_, body, ok := strings.Cut(resp, "\r\n\r\n")
			require.True(t, ok, "%q", resp)
			assert.True(t, strings.HasPrefix(body, "malformed request: "), "%q", body)
			assert.Contains(t, body, c.reason)
			assert.NotContains(t, body, "buffer size=", "without fasthttp's dump of its buffer")
			assert.Equal(t, 1, strings.Count(body, "\n"), "one line: %q", body)
		})
	}
	cl := testcluster.NewClient(t)
	for _, k := range []string{"m1", "m2", "m3"} {
		code, _ := cl.Get(t, base, k, 0, 0)
		assert.Equal(t, 404, code, "%s was never written", k)
	}
}

// A PUT whose Content-Length is over the limit is refused at once, from
// the headers alone: 413 with the reason, the connection closed, nothing
// read or awaited of the body, and with Expect: 100-continue no 100
// Continue first. (The client here sends no body at all: a node that
// waited for it would keep the connection open until the test gives up.)
func TestOversizedContentLengthRefusedFromHeaders(t *testing.T) {
	_, base := testcluster.Single(t, func(_ int, c *node.Config) { c.MaxValueBytes = 100 })
	for _, c := range []struct{ name, head string }{
		{"just over", "Content-Length: 101\r\n"},
		{"within fasthttp's old limit (value+key+64)", "Content-Length: 1000\r\n"},
		{"far over", "Content-Length: 16778304\r\n"},
		{"just over, 100-continue", "Content-Length: 101\r\nExpect: 100-continue\r\n"},
		{"far over, 100-continue", "Content-Length: 16778304\r\nExpect: 100-continue\r\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp := exchange(t, base, "PUT /v0/entity?id=big HTTP/1.1\r\nHost: x\r\n"+c.head+"\r\n")
			require.Regexp(t, `^HTTP/1.1 413 `, resp, "no 100 Continue before, no waiting for the body")
			assert.Contains(t, resp, "\r\nConnection: close\r\n")
			assert.True(t, strings.HasSuffix(resp, "\r\n\r\nvalue too large: limit is 100 bytes\n"), "%q", resp)
		})
	}
	// At the limit, 100-continue is answered and the body read.
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(5*time.Second)))
	_, err = io.WriteString(conn, "PUT /v0/entity?id=big HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n")
	require.NoError(t, err)
	br := bufio.NewReader(conn)
	line, err := br.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "HTTP/1.1 100 Continue\r\n", line)
	_, err = br.ReadString('\n')
	require.NoError(t, err)
	_, err = io.WriteString(conn, strings.Repeat("v", 100))
	require.NoError(t, err)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 201, resp.StatusCode)
}

// TestHTTP10PutWithoutLength: an HTTP/1.0 request's body without
// Content-Length runs to the end of the connection, which no server can
// take as a request's framing (RFC 1945 §7.2.2 requires a Content-Length;
// RFC 9112 §6.3 makes such a body zero bytes long). fasthttp v1.74.0
// drops it silently, and the node stored an empty value and answered 201
// to a client that sent "abc": a value cut short, acknowledged. It is
// refused (411 Length Required, with the reason) and nothing is stored;
// with a Content-Length, 0 included, HTTP/1.0 PUTs are stored as sent.
func TestHTTP10PutWithoutLength(t *testing.T) {
	_, base := testcluster.Single(t)
	cl := testcluster.NewClient(t)
	require.Equal(t, http.StatusCreated, cl.Put(t, base, "old", []byte("old"), 0, 0))
	for _, key := range []string{"absent", "old"} {
		resp := halfClosed(t, base, "PUT /v0/entity?id="+key+" HTTP/1.0\r\n\r\nabc")
		require.Regexp(t, `^HTTP/1.1 411 `, resp)
		assert.Contains(t, resp, "Content-Length")
		assert.Equal(t, 1, strings.Count(resp, "HTTP/1.1 "), "one answer: %q", resp)
	}
	code, _ := cl.Get(t, base, "absent", 0, 0)
	assert.Equal(t, http.StatusNotFound, code, "nothing stored")
	code, got := cl.Get(t, base, "old", 0, 0)
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "old", string(got), "the older value is unchanged")

	resp := halfClosed(t, base, "PUT /v0/entity?id=framed HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc")
	require.Regexp(t, `^HTTP/1.1 201 `, resp)
	code, got = cl.Get(t, base, "framed", 0, 0)
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "abc", string(got))
	resp = halfClosed(t, base, "PUT /v0/entity?id=empty HTTP/1.0\r\nContent-Length: 0\r\n\r\n")
	require.Regexp(t, `^HTTP/1.1 201 `, resp)
	code, got = cl.Get(t, base, "empty", 0, 0)
	assert.Equal(t, http.StatusOK, code)
	assert.Empty(t, got)
}

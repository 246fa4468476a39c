package httpapi

import (
	"bufio"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// chunkedStream is fasthttp's body stream of a chunked request whose body
// is body, read from memory: the stream a handler gets, over a connection
// that ends after body.
func chunkedStream(t *testing.T, body string) io.Reader {
	t.Helper()
	req := new(fasthttp.Request)
	br := bufio.NewReader(strings.NewReader("PUT / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + body))
	require.NoError(t, req.Header.Read(br))
	require.NoError(t, req.ContinueReadBodyStream(br, 1, false))
	t.Cleanup(func() { _ = req.CloseBodyStream() })
	return req.BodyStream()
}

// readChunked reads a chunked stream as readBody does: chunkBoundary
// before each read.
func readChunked(stream io.Reader, limit int) (string, *apiError) {
	var got []byte
	buf := make([]byte, 2)
	for {
		ended, aerr := chunkBoundary(stream, len(got), limit)
		if aerr != nil || ended {
			return string(got), aerr
		}
		m, err := stream.Read(buf)
		got = append(got, buf[:m]...)
		if err != nil {
			return string(got), readError(err)
		}
	}
}

// The fields of fasthttp's body stream that stream.go reads are there:
// this fails first if an upgrade of fasthttp renames them (every chunked
// body would then be refused as incomplete).
func TestStreamStateReadable(t *testing.T) {
	stream := chunkedStream(t, "3\r\nabc\r\n0\r\n\r\n")
	ended, left, ok := streamState(stream)
	require.True(t, ok, "fasthttp's requestStream has no eof bool and chunkLeft int fields any more: see stream.go")
	assert.False(t, ended)
	assert.Zero(t, left)
	_, _, ok = streamState(strings.NewReader("x"))
	assert.False(t, ok, "another reader")
}

// A chunked body ends with its last chunk, or is incomplete; a chunk too
// large is refused from its size line.
func TestChunkBoundary(t *testing.T) {
	for _, c := range []struct {
		name, body, want string
		code             int // 0: read whole
	}{
		{"whole", "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", "abcde", 0},
		{"with a trailer", "3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n", "abc", 0},
		{"empty", "0\r\n\r\n", "", 0},
		{"at the limit", "5\r\nabcde\r\n0\r\n\r\n", "abcde", 0},
		{"cut after a chunk", "3\r\nabc\r\n", "abc", 400},
		{"cut before any chunk", "", "", 400},
		{"cut within a chunk", "5\r\nabc", "abc", 400},
		{"chunk over the limit", "6\r\nabc", "", 413},
		{"huge chunk", "7fffffff\r\n", "", 413},
		{"second chunk over the limit", "3\r\nabc\r\n3\r\n", "abc", 413},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, aerr := readChunked(chunkedStream(t, c.body), 5)
			if c.code == 0 {
				require.Nil(t, aerr)
			} else {
				require.NotNil(t, aerr)
				assert.Equal(t, c.code, aerr.code, aerr.reason)
			}
			assert.Equal(t, c.want, got)
		})
	}
	// Not fasthttp's stream: the end cannot be told, nothing is taken.
	_, aerr := chunkBoundary(strings.NewReader("x"), 0, 5)
	require.NotNil(t, aerr)
	assert.Equal(t, 400, aerr.code)
}

// discardBody drops a body by its framing and tells whether it ended
// within the limit.
func TestDiscardBody(t *testing.T) {
	assert.Nil(t, discardBody(chunkedStream(t, "3\r\nabc\r\n0\r\n\r\n"), -1, 5))
	assert.Equal(t, errIncomplete, discardBody(chunkedStream(t, "3\r\nabc\r\n"), -1, 5), "cut short")
	assert.Equal(t, 413, discardBody(chunkedStream(t, "7fffffff\r\n"), -1, 5).code, "over the limit")
}

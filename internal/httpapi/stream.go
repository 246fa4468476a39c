package httpapi

import (
	"bufio"
	"io"
	"net"
	"reflect"
	"strings"
	"sync"

	"github.com/valyala/fasthttp"
)

// Where a streamed chunked body stands, and what becomes of a body the
// handler did not read to its end.
//
// fasthttp v1.74.0's request body stream (requestStream.Read) returns a
// plain io.EOF both after a chunked body's last chunk and when the
// connection ends at a chunk boundary before it (parseChunkSize returns
// readHexInt's io.EOF as it is): a body cut short there read as whole,
// and was stored. Nor does it check a chunk's size against any limit:
// a chunk announcing 2 GiB was read until the read timeout. The stream's
// own state tells both apart: its eof field is set only once the last
// chunk and the trailer were read, and chunkLeft is what remains of the
// current chunk. Neither is exported, so they are read by reflection
// (streamState); fasthttp v1.78 fixes the first (ErrUnexpectedEOF), not
// the second. TestStreamStateReadable fails if an upgrade renames them;
// until then every chunked body is refused as incomplete, never stored.

// streamFields are the type of fasthttp's request body stream and the
// indices of its fields, found once from a stream made for the purpose.
var streamFields struct {
	once           sync.Once
	typ            reflect.Type // *fasthttp.requestStream; nil if unusable
	eof, chunkLeft int
}

func findStreamFields() {
	var req fasthttp.Request
	br := bufio.NewReader(strings.NewReader("PUT / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"))
	if req.Header.Read(br) != nil || req.ContinueReadBodyStream(br, 1, false) != nil || req.BodyStream() == nil {
		return
	}
	defer func() { _ = req.CloseBodyStream() }()
	t := reflect.TypeOf(req.BodyStream())
	if t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct {
		return
	}
	e, okE := t.Elem().FieldByName("eof")
	c, okC := t.Elem().FieldByName("chunkLeft")
	if okE && okC && e.Type.Kind() == reflect.Bool && c.Type.Kind() == reflect.Int {
		f := &streamFields
		f.typ, f.eof, f.chunkLeft = t, e.Index[0], c.Index[0]
	}
}

// streamState reports a chunked body stream's state: whether its last
// chunk was read (ended), and how many bytes of the current chunk are
// still to come (0 between chunks). ok is false if the stream is not
// fasthttp's or its fields are not there.
func streamState(stream io.Reader) (ended bool, chunkLeft int, ok bool) {
	f := &streamFields
	f.once.Do(findStreamFields)
	v := reflect.ValueOf(stream)
	if f.typ == nil || !v.IsValid() || v.Type() != f.typ || v.IsNil() {
		return false, 0, false
	}
	s := v.Elem()
	return s.Field(f.eof).Bool(), int(s.Field(f.chunkLeft).Int()), true
}

var errIncomplete = badRequest("incomplete body: the connection ended before the body did")

// chunkBoundary is called before each read of a chunked body, have bytes
// of it read so far. Between chunks it reads the next chunk's size line,
// and none of its bytes, so that a size over limit is refused at once,
// before waiting for any of them (413). It reports whether the body ended
// with its last chunk; the connection ending before is an incomplete body
// (400).
func chunkBoundary(stream io.Reader, have, limit int) (ended bool, aerr *apiError) {
	ended, left, ok := streamState(stream)
	switch {
	case !ok:
		return false, errIncomplete // cannot tell a whole body from a cut one
	case ended:
		return true, nil
	case left > 0:
		return false, nil
	}
	// An empty read parses the chunk's size line, then reads nothing of
	// the chunk (bufio.Reader.Read of no bytes does not block).
	_, err := stream.Read(nil)
	ended, left, _ = streamState(stream)
	switch {
	case err == io.EOF && ended:
		return true, nil
	case err != nil:
		return false, readError(err)
	case left > limit-have:
		return false, tooLarge(limit)
	}
	return false, nil
}

// discardBody reads and drops the rest of a body the handler did not take:
// at most limit bytes, within the read deadline fasthttp set for the
// request. It returns nil once the body's end was reached, so that the
// connection can carry the next request, or why not.
func discardBody(stream io.Reader, contentLength, limit int) *apiError {
	buf := make([]byte, 4<<10)
	read := 0
	for {
		if contentLength < 0 {
			ended, aerr := chunkBoundary(stream, read, limit)
			if aerr != nil || ended {
				return aerr
			}
		}
		m, err := stream.Read(buf)
		read += m
		switch {
		case read > limit:
			return tooLarge(limit)
		case err == io.EOF && contentLength >= 0 && read == contentLength:
			return nil
		case err != nil:
			// A chunked body's end is found by chunkBoundary alone; a
			// body with a length may be cut short (fasthttp then ends
			// it with io.EOF too).
			return readError(err)
		}
	}
}

// LingerCloser is a connection that can close lingering (the node's
// listener's, internal/node/linger.go): once asked, its Close half-
// closes it, then reads and drops what the client still sends for a
// bounded time and number of bytes, and only then closes. Closing at once
// with bytes unread makes the kernel reset the connection, and a client
// still sending its body then sees the reset instead of the answer.
type LingerCloser interface {
	LingerOnClose()
}

// lingerOnClose asks ctx's connection, or the one a TLS connection wraps,
// to close lingering; a connection that cannot is closed as before.
func lingerOnClose(ctx *fasthttp.RequestCtx) {
	c := ctx.Conn()
	for c != nil {
		if l, ok := c.(LingerCloser); ok {
			l.LingerOnClose()
			return
		}
		w, ok := c.(interface{ NetConn() net.Conn }) // *tls.Conn
		if !ok {
			return
		}
		c = w.NetConn()
	}
}

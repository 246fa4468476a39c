package testcluster

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/scan"
)

// HTTPGet is a plain net/http GET. The caller reads the body; it is closed
// at the end of the test.
func HTTPGet(t testing.TB, u string) *http.Response {
	t.Helper()
	resp, err := http.Get(u)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// RawConn is an HTTP/1.1 GET on a plain TCP connection that exposes the
// response body as it is on the wire, chunked encoding included: what the
// chunks framing of /v0/entities relies on, and what net/http hides.
type RawConn struct {
	// Conn is the connection; it is closed at the end of the test.
	Conn   net.Conn
	Status int
	Header textproto.MIMEHeader
	// Wire is the connection after the headers: the body's raw bytes.
	Wire *bufio.Reader
	// ChunkedReader reads Wire's chunks.
	*ChunkedReader
}

// Dial connects to addr (host:port) and closes the connection at the end
// of the test. rcvBuf > 0 sets the socket's receive buffer before
// connecting, so that a client that stops reading really stalls the
// sender.
func Dial(t testing.TB, addr string, rcvBuf int) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if rcvBuf > 0 {
		d.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvBuf)
			})
			if err != nil {
				return err
			}
			return serr
		}
	}
	conn, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

// RawGet sends GET pathQuery to addr (host:port) and reads the status and
// headers. rcvBuf > 0 sets the socket's receive buffer before connecting,
// so that a client that stops reading really stalls the sender.
func RawGet(t testing.TB, addr, pathQuery string, rcvBuf int) *RawConn {
	t.Helper()
	conn := Dial(t, addr, rcvBuf)
	_, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", pathQuery, addr)
	require.NoError(t, err)
	rc := &RawConn{Conn: conn, Wire: bufio.NewReaderSize(conn, 4096)}
	tp := textproto.NewReader(rc.Wire)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	line, err := tp.ReadLine()
	require.NoError(t, err)
	f := strings.Fields(line)
	require.GreaterOrEqual(t, len(f), 2, "status line %q", line)
	rc.Status, err = strconv.Atoi(f[1])
	require.NoError(t, err)
	rc.Header, err = tp.ReadMIMEHeader()
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Time{}))
	rc.ChunkedReader = NewChunkedReader(rc.Wire)
	return rc
}

// ChunkedReader reads an HTTP/1.1 chunked body strictly: chunk by chunk
// with Chunk, or as one stream of the chunks' contents with Read.
type ChunkedReader struct {
	br  *bufio.Reader
	cur []byte // what Read has not returned yet of the current chunk
}

// NewChunkedReader reads the chunked body that r starts with.
func NewChunkedReader(r io.Reader) *ChunkedReader {
	return &ChunkedReader{br: bufio.NewReaderSize(r, 4096)}
}

// errEnd is the terminating zero-length chunk.
var errEnd = errors.New("terminating chunk")

// Chunk reads the next chunk's content; io.EOF after the terminating
// zero-length chunk. A connection closed anywhere else, even between two
// chunks, is io.ErrUnexpectedEOF: only the zero-length chunk ends a body.
func (cr *ChunkedReader) Chunk() ([]byte, error) {
	b, err := cr.chunk()
	if err == errEnd {
		return nil, io.EOF
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return b, err
}

// Read presents the chunks' contents as one stream (for the binary framing
// read over a raw connection).
func (cr *ChunkedReader) Read(p []byte) (int, error) {
	for len(cr.cur) == 0 {
		b, err := cr.Chunk()
		if err != nil {
			return 0, err
		}
		cr.cur = b
	}
	n := copy(p, cr.cur)
	cr.cur = cr.cur[n:]
	return n, nil
}

// crlfLine reads a line that must end in CRLF; a line cut by the end of
// the connection is io.EOF, not a shorter line.
func (cr *ChunkedReader) crlfLine() (string, error) {
	line, err := cr.br.ReadString('\n')
	if err != nil {
		return "", err
	}
	if !strings.HasSuffix(line, "\r\n") {
		return "", fmt.Errorf("line %q does not end in CRLF", line)
	}
	return line[:len(line)-2], nil
}

func (cr *ChunkedReader) chunk() ([]byte, error) {
	line, err := cr.crlfLine()
	if err != nil {
		return nil, err
	}
	n, err := strconv.ParseUint(line, 16, 32)
	if err != nil {
		return nil, fmt.Errorf("chunk size %q: %w", line, err)
	}
	if n == 0 {
		if _, err := cr.crlfLine(); err != nil { // end of (empty) trailer
			return nil, err
		}
		return nil, errEnd
	}
	b := make([]byte, n+2)
	if _, err := io.ReadFull(cr.br, b); err != nil {
		return nil, err
	}
	if string(b[n:]) != "\r\n" {
		return nil, fmt.Errorf("chunk not followed by CRLF")
	}
	return b[:n], nil
}

// ReadChunks reads a whole /v0/entities response in the chunks framing
// and checks it: one chunk per record, key '\n' value. It returns the
// records as key/value pairs.
func ReadChunks(t testing.TB, cr *ChunkedReader) [][2]string {
	t.Helper()
	var out [][2]string
	for {
		c, err := cr.Chunk()
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		k, v, ok := bytes.Cut(c, []byte("\n"))
		require.True(t, ok, "chunk %q has no newline", c)
		out = append(out, [2]string{string(k), string(v)})
	}
}

// ReadBinary reads a whole format=binary /v0/entities body and checks its
// end marker. It returns the records as key/value pairs.
func ReadBinary(t testing.TB, body io.Reader) [][2]string {
	t.Helper()
	d := scan.NewDecoder(body, 1<<10, 1<<20)
	var out [][2]string
	for d.Next() {
		out = append(out, [2]string{string(d.Key()), string(d.Value())})
	}
	require.NoError(t, d.Err())
	return out
}

// ReadJSON reads a whole format=json /v0/entities body and checks every
// line: one object, exactly one of key and key_base64 and one of value and
// value_base64, the plain field only for valid UTF-8 and the base64 one
// only for bytes that are not. It returns the records as key/value pairs.
func ReadJSON(t testing.TB, body io.Reader) [][2]string {
	t.Helper()
	type line struct {
		Key         *string `json:"key"`
		KeyBase64   []byte  `json:"key_base64"`
		Value       *string `json:"value"`
		ValueBase64 []byte  `json:"value_base64"`
	}
	field := func(plain *string, b64 []byte, name, l string) string {
		require.True(t, (plain == nil) != (b64 == nil), "exactly one of %s and %s_base64: %s", name, name, l)
		if plain != nil {
			return *plain
		}
		require.False(t, utf8.Valid(b64), "%s_base64 holds valid UTF-8: %s", name, l)
		return string(b64)
	}
	var out [][2]string
	sc := bufio.NewScanner(body)
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		var rec line
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		require.NoError(t, dec.Decode(&rec), "line %q", sc.Text())
		out = append(out, [2]string{field(rec.Key, rec.KeyBase64, "key", sc.Text()), field(rec.Value, rec.ValueBase64, "value", sc.Text())})
	}
	require.NoError(t, sc.Err())
	return out
}

// ScanOf is what a range scan of [start, end) returns for data, a map of
// every live key to its value: the pairs with start <= key < end (no end
// if end is empty), in key order, as ReadChunks and ReadBinary return
// them.
func ScanOf(data map[string]string, start, end string) [][2]string {
	var out [][2]string
	for k, v := range data {
		if k >= start && (end == "" || k < end) {
			out = append(out, [2]string{k, v})
		}
	}
	slices.SortFunc(out, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	return out
}

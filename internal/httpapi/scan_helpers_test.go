package httpapi_test

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/store"
)

// Shared helpers of the range scan tests.

// genKey is the i-th key of a generated data set; keys sort like i.
func genKey(i int) []byte { return fmt.Appendf(nil, "key%08d", i) }

// genValue fills dst with the value of record i: its index, then base, with
// a length that varies with i so that framing errors cannot line up. It is
// cheap to re-derive, so a test reading gigabytes keeps nothing.
func genValue(dst, base []byte, i int) []byte {
	n := len(base) - i%251
	dst = binary.BigEndian.AppendUint64(dst[:0], uint64(i))
	return append(dst, base[8:n]...)
}

// newBase returns the value body shared by all generated records.
func newBase(size int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(i*7 + i>>8) // includes '\n' and 0
	}
	return b
}

// fillStore writes records 0..n-1 (version 1+i) straight into a Pebble
// directory, the fast way to prepare data before a node starts on it.
func fillStore(t testing.TB, dir string, n, valueSize int) {
	t.Helper()
	st, err := store.Open(dir, store.Options{Sync: false})
	require.NoError(t, err)
	base := newBase(valueSize)
	var v []byte
	for i := range n {
		v = genValue(v, base, i)
		require.NoError(t, st.Apply(genKey(i), &record.Record{Version: uint64(1 + i), Value: v}))
	}
	require.NoError(t, st.Close())
}

// counter reads a Prometheus counter's value.
func counter(t testing.TB, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	return m.GetCounter().GetValue()
}

// rawConn is an HTTP/1.1 client on a plain TCP connection that exposes the
// chunked encoding as it is on the wire: what the course's framing relies
// on, and what net/http hides.
type rawConn struct {
	conn   net.Conn
	br     *bufio.Reader
	tp     *textproto.Reader
	Status int
	Header textproto.MIMEHeader
}

// rawGet sends GET pathQuery to addr and reads the status and headers.
// rcvBuf > 0 sets the socket's receive buffer before connecting, so that a
// slow reader really stalls the sender.
func rawGet(t testing.TB, addr, pathQuery string, rcvBuf int) *rawConn {
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
	_, err = fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", pathQuery, addr)
	require.NoError(t, err)
	rc := &rawConn{conn: conn, br: bufio.NewReaderSize(conn, 4096)}
	rc.tp = textproto.NewReader(rc.br)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	line, err := rc.tp.ReadLine()
	require.NoError(t, err)
	f := strings.Fields(line)
	require.GreaterOrEqual(t, len(f), 2, "status line %q", line)
	rc.Status, err = strconv.Atoi(f[1])
	require.NoError(t, err)
	rc.Header, err = rc.tp.ReadMIMEHeader()
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Time{}))
	return rc
}

// Chunk reads the next chunk's content; io.EOF after the terminating
// zero-length chunk.
// A connection closed anywhere else, even between two chunks, is
// io.ErrUnexpectedEOF: only the zero-length chunk ends a body.
func (rc *rawConn) Chunk() ([]byte, error) {
	b, err := rc.chunk()
	if err == errEnd {
		return nil, io.EOF
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return b, err
}

var errEnd = fmt.Errorf("terminating chunk")

// crlfLine reads a line that must end in CRLF; a line cut by the end of
// the connection is io.EOF, not a shorter line.
func (rc *rawConn) crlfLine() (string, error) {
	line, err := rc.br.ReadString('\n')
	if err != nil {
		return "", err
	}
	if !strings.HasSuffix(line, "\r\n") {
		return "", fmt.Errorf("line %q does not end in CRLF", line)
	}
	return line[:len(line)-2], nil
}

func (rc *rawConn) chunk() ([]byte, error) {
	line, err := rc.crlfLine()
	if err != nil {
		return nil, err
	}
	n, err := strconv.ParseUint(line, 16, 32)
	if err != nil {
		return nil, fmt.Errorf("chunk size %q: %w", line, err)
	}
	if n == 0 {
		if _, err := rc.crlfLine(); err != nil { // end of (empty) trailer
			return nil, err
		}
		return nil, errEnd
	}
	b := make([]byte, n+2)
	if _, err := io.ReadFull(rc.br, b); err != nil {
		return nil, err
	}
	if string(b[n:]) != "\r\n" {
		return nil, fmt.Errorf("chunk not followed by CRLF")
	}
	return b[:n], nil
}

// chunkReader presents the chunks' contents as one stream (for the binary
// framing read over a raw connection).
type chunkReader struct {
	rc  *rawConn
	cur []byte
}

func (c *chunkReader) Read(p []byte) (int, error) {
	for len(c.cur) == 0 {
		b, err := c.rc.Chunk()
		if err != nil {
			return 0, err
		}
		c.cur = b
	}
	n := copy(p, c.cur)
	c.cur = c.cur[n:]
	return n, nil
}

// httpGet is a plain net/http GET whose body the caller reads and closes.
func httpGet(t testing.TB, u string) *http.Response {
	t.Helper()
	resp, err := http.Get(u)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func newTextprotoReader(br *bufio.Reader) *textproto.Reader { return textproto.NewReader(br) }

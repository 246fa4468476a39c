package faultnet

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// patience bounds every wait for something that must happen; only a broken
// link reaches it. It is not a claim about how fast anything is.
const patience = 10 * time.Second

// echoServer writes back whatever it reads, and half-closes its side when
// the client half-closes. It counts the connections it accepted, so a test
// can tell whether the link dialed it at all.
type echoServer struct {
	ln       net.Listener
	accepted atomic.Int64
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
}

// startEcho starts an echo server, closed when the test ends.
func startEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &echoServer{ln: ln, conns: map[net.Conn]struct{}{}}
	s.wg.Go(s.serve)
	t.Cleanup(s.close)
	return s
}

func (s *echoServer) addr() string { return s.ln.Addr().String() }

func (s *echoServer) serve() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.accepted.Add(1)
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Go(func() {
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				_ = c.Close()
			}()
			if _, err := io.Copy(c, c); err == nil {
				_ = c.(*net.TCPConn).CloseWrite()
				_, _ = io.Copy(io.Discard, c) // until the client closes
			}
		})
	}
}

// close stops the server and its connections and waits for its goroutines.
func (s *echoServer) close() {
	_ = s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// newLink starts a link to target, closed when the test ends.
func newLink(t *testing.T, target string, opts ...Option) *Link {
	t.Helper()
	l, err := NewLink(target, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, l.Close()) })
	return l
}

// warmLink starts an echo server and a link to it, and returns them with a
// connection through the link that has made one round trip.
func warmLink(t *testing.T, opts ...Option) (*echoServer, *Link, net.Conn) {
	t.Helper()
	echo := startEcho(t)
	l := newLink(t, echo.addr(), opts...)
	c := dial(t, l.Addr())
	requireEcho(t, c, "warm")
	return echo, l, c
}

// dial connects to addr; the connection is closed when the test ends.
func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, patience)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// roundTrip writes msg and reads back as many bytes, within timeout, and
// returns what it read. The write runs concurrently with the read, so that
// messages larger than the socket buffers cannot deadlock.
func roundTrip(c net.Conn, msg []byte, timeout time.Duration) ([]byte, error) {
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(msg)
		werr <- err
	}()
	got := make([]byte, len(msg))
	_, rerr := io.ReadFull(c, got)
	if err := <-werr; err != nil && rerr == nil {
		rerr = err
	}
	return got, rerr
}

// requireEcho asserts that msg makes a round trip on c unchanged.
func requireEcho(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	got, err := roundTrip(c, []byte(msg), patience)
	require.NoError(t, err)
	require.Equal(t, msg, string(got))
}

// requireBroken asserts that a round trip on c fails, and not by running
// out of time: the peer reset or closed the connection.
func requireBroken(t *testing.T, c net.Conn) {
	t.Helper()
	_, err := roundTrip(c, []byte("ping"), patience)
	require.Error(t, err)
	require.False(t, isTimeout(err), "want a reset or close, got %v", err)
}

// requireRefused asserts that a new connection to addr fails without a
// timeout. The kernel completes the handshake before the link can reset the
// connection, so the dial usually succeeds and the first round trip fails;
// the dial fails instead when the reset beats it.
func requireRefused(t *testing.T, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, patience)
	if err != nil {
		require.False(t, isTimeout(err), "want a reset, got %v", err)
		return
	}
	t.Cleanup(func() { _ = c.Close() })
	requireBroken(t, c)
}

// requireSilent asserts that a round trip on c gets no answer within wait.
func requireSilent(t *testing.T, c net.Conn, wait time.Duration) {
	t.Helper()
	_, err := roundTrip(c, []byte("ping"), wait)
	require.Error(t, err)
	require.True(t, isTimeout(err), "want a timeout, got %v", err)
}

func isTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

// eventually waits for cond, polling.
func eventually(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	require.Eventually(t, cond, patience, 2*time.Millisecond, msg)
}

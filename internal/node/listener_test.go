package node

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/leakcheck"
)

func TestDefaultMaxConnections(t *testing.T) {
	for _, c := range []struct {
		name              string
		nofile            uint64
		clusterSize, peer int
		want              int
	}{
		{"one node", 20000, 1, 1, 20000 - 1088},
		{"three nodes", 20000, 3, 1, 20000 - 1088 - 2*20},
		{"three nodes, 4 peer conns", 20000, 3, 4, 20000 - 1088 - 2*26},
		{"low limit: a quarter", 1024, 3, 1, 256},
		{"just above the reserve: a quarter", 1400, 1, 1, 350},
		{"unlimited", ^uint64(0), 1, 1, 1<<24 - 1088},
	} {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, DefaultMaxConnections(c.nofile, c.clusterSize, c.peer))
		})
	}
}

// fakeListener returns the queued results of Accept in order, then blocks
// until closed.
type fakeListener struct {
	mu      sync.Mutex
	results []acceptResult
	closed  chan struct{}
	once    sync.Once
}

type acceptResult struct {
	conn net.Conn
	err  error
}

func newFakeListener(rs ...acceptResult) *fakeListener {
	return &fakeListener{results: rs, closed: make(chan struct{})}
}

func (f *fakeListener) Accept() (net.Conn, error) {
	f.mu.Lock()
	if len(f.results) > 0 {
		r := f.results[0]
		f.results = f.results[1:]
		f.mu.Unlock()
		return r.conn, r.err
	}
	f.mu.Unlock()
	<-f.closed
	return nil, net.ErrClosed
}

func (f *fakeListener) Close() error   { f.once.Do(func() { close(f.closed) }); return nil }
func (f *fakeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

func emfile() error {
	return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
}

// Accept waits out descriptor and memory exhaustion and returns the next
// connection; any other error ends it.
func TestLimitListenerRetriesExhaustion(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	server, client := net.Pipe()
	defer client.Close()
	other := errors.New("some other failure")
	l := newLimitListener(newFakeListener(
		acceptResult{err: emfile()},
		acceptResult{err: &net.OpError{Op: "accept", Err: os.NewSyscallError("accept4", syscall.ENFILE)}},
		acceptResult{err: emfile()},
		acceptResult{conn: server},
		acceptResult{err: other},
	), 0, 0, false, nil, log)
	c, err := l.Accept()
	require.NoError(t, err)
	require.NoError(t, c.Close())
	assert.Contains(t, logs.String(), "too many open files", "the first failure is logged")
	assert.Equal(t, 1, strings.Count(logs.String(), "level=WARN"), "and rate-limited")
	_, err = l.Accept()
	require.ErrorIs(t, err, other)
}

// Close ends a wait between retries at once, with the error fasthttp's
// Serve takes for a closed listener.
func TestLimitListenerCloseEndsRetryWait(t *testing.T) {
	rs := make([]acceptResult, 100) // more retries than the test waits for
	for i := range rs {
		rs[i].err = emfile()
	}
	l := newLimitListener(newFakeListener(rs...), 0, 0, false, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	done := make(chan error, 1)
	go func() {
		_, err := l.Accept()
		done <- err
	}()
	require.NoError(t, l.Close())
	select {
	case err := <-done:
		require.ErrorIs(t, err, net.ErrClosed)
		require.Contains(t, err.Error(), "use of closed network connection")
	case <-time.After(10 * time.Second):
		t.Fatal("Accept still waiting after Close")
	}
}

// If the accept loop ends without Shutdown, the node says so on Failed
// and logs it at error level; Shutdown still closes it cleanly.
func TestServeFailureIsReported(t *testing.T) {
	leakcheck.Register(t)
	// The node logs from its own goroutines: to a file, which the test
	// reads without a data race.
	logPath := filepath.Join(t.TempDir(), "node.log")
	logFile, err := os.Create(logPath)
	require.NoError(t, err)
	defer logFile.Close()
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Self = "http://127.0.0.1:1" // any URL: a cluster of one never calls itself
	cfg.DataDir = t.TempDir()
	cfg.Store.Sync = false
	cfg.Logger = slog.New(slog.NewTextHandler(logFile, nil))
	n, err := Start(cfg)
	require.NoError(t, err)
	select {
	case err := <-n.Failed():
		t.Fatalf("failed before anything happened: %v", err)
	default:
	}
	// The socket goes away under fasthttp, as if accept had failed for
	// good.
	require.NoError(t, n.ln.Listener.Close())
	select {
	case err := <-n.Failed():
		require.ErrorContains(t, err, "stopped accepting connections")
	case <-time.After(10 * time.Second):
		t.Fatal("the accept loop ended and Failed said nothing")
	}
	logs, err := os.ReadFile(logPath)
	require.NoError(t, err)
	assert.Regexp(t, `level=ERROR msg="the node no longer serves" err="public listener 127.0.0.1:\d+ stopped accepting`, string(logs))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, n.Shutdown(ctx))
}

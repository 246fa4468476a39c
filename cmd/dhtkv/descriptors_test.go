package main

import (
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// nodeLog is a process's output, written straight to a file by the
// process and read by the test.
type nodeLog string

func (l nodeLog) String() string {
	b, _ := os.ReadFile(string(l))
	return string(b)
}

// startLimited runs the binary with RLIMIT_NOFILE set to soft/hard by the
// shell that execs it, on a port it picks and logs, and returns its
// address and log.
func startLimited(t *testing.T, soft, hard string, extra ...string) (*exec.Cmd, string, nodeLog) {
	t.Helper()
	bin := testcluster.BuildBinary(t, testcluster.RepoRoot(t))
	args := append([]string{"-c", `ulimit -S -n ` + soft + ` && ulimit -H -n ` + hard + ` && exec "$0" "$@"`,
		bin, "--listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--sync=false"}, extra...)
	cmd := exec.Command("/bin/sh", args...)
	log := startLogged(t, cmd)
	return cmd, testcluster.LoggedAddr(t, log.String, 30*time.Second), log
}

// startLogged starts cmd with its output in a log file, and kills it at
// the end of the test if it still runs; a failed test shows the log.
func startLogged(t *testing.T, cmd *exec.Cmd) nodeLog {
	t.Helper()
	log := nodeLog(filepath.Join(t.TempDir(), "node.log"))
	out, err := os.Create(string(log))
	require.NoError(t, err)
	defer out.Close() // the process has its own descriptor
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if t.Failed() {
			t.Logf("node log:\n%s", log)
		}
	})
	return log
}

// openConns dials n connections that send nothing and stay open until the
// test closes them. Past the node's descriptor limit the kernel still
// completes the handshakes: they wait in the listen backlog.
func openConns(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, 0, n)
	for range n {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		require.NoError(t, err)
		conns = append(conns, c)
	}
	t.Cleanup(func() { closeAll(conns) })
	return conns
}

func closeAll(conns []net.Conn) {
	for _, c := range conns {
		c.Close()
	}
}

// A burst of connections past RLIMIT_NOFILE (here 256, with a connection
// cap above it) makes accept fail with EMFILE. The node waits that out
// instead of ending its accept loop: once the connections close, a normal
// client gets answers again, and the process never exits. Before, the
// accept loop returned for good and the node answered nothing ever again.
func TestDescriptorExhaustionDoesNotStopTheNode(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary out of descriptors: a process test; runs without -short")
	}
	cmd, addr, log := startLimited(t, "64", "256", "--max-connections", "100000")
	base := "http://" + addr
	// The soft limit, 64 for the shell and 255 after Go's start-up, is
	// raised to the hard one; logged once the node started.
	require.Eventually(t, func() bool {
		return strings.Contains(log.String(), `msg="descriptor limit (soft raised to hard)" soft_before=255 soft=256 hard=256`)
	}, 10*time.Second, 10*time.Millisecond)
	for round := range 2 {
		conns := openConns(t, addr, 300)
		require.Eventually(t, func() bool { return strings.Contains(log.String(), "accept failed for lack of resources") },
			10*time.Second, 10*time.Millisecond, "round %d: the node ran out of descriptors", round)
		closeAll(conns)
		require.Eventually(t, func() bool { return testcluster.Status(base) == 200 }, 20*time.Second, 20*time.Millisecond,
			"round %d: the node answers again once the connections closed", round)
		cl := testcluster.NewClient(t)
		require.Equal(t, 201, cl.Put(t, base, "k", []byte("v"), 0, 0))
		code, body := cl.Get(t, base, "k", 0, 0)
		require.Equal(t, 200, code)
		require.Equal(t, "v", string(body))
	}
	require.Nil(t, cmd.ProcessState, "the node is still running")
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "SIGTERM exits 0")
}

// With the default --max-connections, derived from the same low limit (a
// quarter of 256: the reserve for Pebble is larger than the limit), the
// excess is refused with 503 before descriptors run out.
func TestDefaultConnectionCapStaysBelowTheDescriptorLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary: a process test; runs without -short")
	}
	_, addr, log := startLimited(t, "256", "256")
	require.Contains(t, log.String(), "max_connections=64 ")
	conns := openConns(t, addr, 200)
	// The accepted connections send nothing and get nothing: their reads
	// end at the deadline, all at once.
	var refused atomic.Int32
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
			b, _ := io.ReadAll(c)
			if strings.HasPrefix(string(b), "HTTP/1.1 503 ") {
				refused.Add(1)
			}
		}()
	}
	wg.Wait()
	// At least: the readiness probe's connection may not have been seen
	// closed yet, and then holds one of the 64 places.
	assert.GreaterOrEqual(t, refused.Load(), int32(200-64), "every connection past the cap is refused")
	closeAll(conns)
	require.Eventually(t, func() bool { return testcluster.Status("http://"+addr) == 200 }, 20*time.Second, 20*time.Millisecond)
	assert.NotContains(t, log.String(), "accept failed for lack of resources", "the cap kept descriptors from running out")
}

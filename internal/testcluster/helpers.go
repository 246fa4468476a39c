package testcluster

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/client"
)

// WaitFor bounds a wait for a condition that holds soon on an idle machine:
// generous, because only a failing test waits that long. It is not a claim
// about how fast anything is.
const WaitFor = 10 * time.Second

// Eventually calls cond until it returns true and fails the test with what
// (as "timed out after TIMEOUT waiting for WHAT") once timeout has passed
// without it. cond runs on the calling goroutine, so unlike
// require.Eventually it may itself use require; it is called at least once,
// and again after a pause that starts at a millisecond and doubles up to
// 10 ms, so a condition that holds soon is seen soon and a long wait does
// not spin.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	pause := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(pause) // the polling interval
		pause = min(2*pause, 10*time.Millisecond)
	}
}

// RepoRoot returns the repository root: the nearest directory at or above
// the test's working directory (its package directory under go test) that
// holds go.mod. It fails the test if there is none.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, dir, parent, "go.mod not found above the working directory")
		dir = parent
	}
}

// DeadEndpoint returns a 127.0.0.1 host:port that refuses connections: a
// port that was just bound and closed again, so nothing listens there
// (unless another process takes it meanwhile, which the kernel makes
// unlikely by handing out ephemeral ports in turn). Prefix "http://" where
// a URL is wanted.
func DeadEndpoint(t testing.TB) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", FreePorts(t, 1)[0])
}

// Single starts a cluster of one node (Start(t, 1, opts...)) and returns it
// with the node's endpoint (Endpoint(0)): the start of single-node tests.
// The node stops at the end of the test.
func Single(t testing.TB, opts ...Option) (*Cluster, string) {
	t.Helper()
	c := Start(t, 1, opts...)
	return c, c.Endpoint(0)
}

// NewAPIClient returns a dhtkv client (package client) of endpoints with a
// one-second dial timeout, closed at the end of the test.
func NewAPIClient(t testing.TB, endpoints ...string) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{Endpoints: endpoints, DialTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

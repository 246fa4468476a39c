package e2e_test

// The real binary as three processes with --sync=true: SIGKILL one node,
// check the quorum still serves, restart it on the same data directory and
// read every acknowledged write from all three replicas.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

type procNode struct {
	cmd    *exec.Cmd
	args   []string
	stderr *strings.Builder
}

type procCluster struct {
	t      testing.TB
	bin    string
	urls   []string
	admins []string // admin host:port
	nodes  []*procNode
}

func startProcCluster(t testing.TB, n int, extra ...string) *procCluster {
	t.Helper()
	return startProcClusterOf(t, testcluster.BuildBinary(t, testcluster.RepoRoot(t)), n, extra...)
}

// startProcClusterOf starts n nodes of the binary bin; pc.bin is what
// start runs, so a test may restart a node under another binary.
func startProcClusterOf(t testing.TB, bin string, n int, extra ...string) *procCluster {
	t.Helper()
	pc := &procCluster{t: t, bin: bin}
	all := testcluster.FreePorts(t, 2*n)
	ports := all[:n]
	for i, p := range ports {
		pc.urls = append(pc.urls, fmt.Sprintf("http://127.0.0.1:%d", p))
		pc.admins = append(pc.admins, fmt.Sprintf("127.0.0.1:%d", all[n+i]))
	}
	dir := t.TempDir()
	for i, p := range ports {
		args := append([]string{
			"--listen", fmt.Sprintf("127.0.0.1:%d", p),
			"--admin-listen", pc.admins[i],
			"--data-dir", filepath.Join(dir, fmt.Sprintf("node%d", i)),
			"--cluster", strings.Join(pc.urls, ","),
			"--log-level", "warn",
			// Anti-entropy only when a test asks (repair): a scheduled
			// exchange would repair what a test of another mechanism
			// means to watch.
			"--ae-interval", "0",
		}, extra...)
		pc.nodes = append(pc.nodes, &procNode{args: args})
		pc.start(i)
	}
	t.Cleanup(pc.stopAll)
	return pc
}

func (pc *procCluster) start(i int) {
	pc.t.Helper()
	n := pc.nodes[i]
	n.stderr = &strings.Builder{}
	n.cmd = exec.Command(pc.bin, n.args...)
	n.cmd.Stderr = n.stderr
	require.NoError(pc.t, n.cmd.Start())
	testcluster.WaitReady(pc.t, pc.urls[i], 10*time.Second)
}

// repair asks node i for an anti-entropy exchange with every peer (POST
// /repair on its admin port) and fails the test if one did not end with
// nothing left differing.
func (pc *procCluster) repair(i int) []client.Exchange {
	pc.t.Helper()
	resp, err := http.Post("http://"+pc.admins[i]+"/repair", "", nil)
	require.NoError(pc.t, err)
	defer resp.Body.Close()
	require.Equal(pc.t, http.StatusOK, resp.StatusCode)
	var stats []client.Exchange
	require.NoError(pc.t, json.NewDecoder(resp.Body).Decode(&stats))
	for _, st := range stats {
		require.Empty(pc.t, st.Error, "node %d's exchange with %s", i, st.Peer)
	}
	return stats
}

// metric returns the sum of every series of the metric name that node i
// exports on its admin port (0 if it has none).
func (pc *procCluster) metric(i int, name string) float64 {
	pc.t.Helper()
	resp, err := http.Get("http://" + pc.admins[i] + "/metrics")
	require.NoError(pc.t, err)
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(pc.t, err)
	var sum float64
	if f := families[name]; f != nil {
		for _, m := range f.GetMetric() {
			sum += m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return sum
}

func (pc *procCluster) kill(i int) {
	pc.t.Helper()
	n := pc.nodes[i]
	require.NoError(pc.t, n.cmd.Process.Signal(syscall.SIGKILL))
	_ = n.cmd.Wait()
	n.cmd = nil
}

// stopAll stops the running nodes with SIGTERM: a graceful shutdown exits 0.
func (pc *procCluster) stopAll() {
	for i := range pc.nodes {
		pc.stop(i)
	}
}

// stop stops node i, if it runs, with SIGTERM: a graceful shutdown exits 0.
func (pc *procCluster) stop(i int) {
	n := pc.nodes[i]
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- n.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			pc.t.Errorf("node %d exited with %v after SIGTERM; stderr:\n%s", i, err, n.stderr)
		}
	case <-time.After(15 * time.Second):
		_ = n.cmd.Process.Kill()
		<-done
		pc.t.Errorf("node %d did not stop within 15s of SIGTERM", i)
	}
	n.cmd = nil
}

func TestProcessClusterSurvivesSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("SIGKILLs nodes of the binary: a process test; runs without -short")
	}
	pc := startProcCluster(t, 3, "--sync=true", "--replica-timeout", "300ms")
	cl := testcluster.NewClient(t)
	acked := map[string]string{}
	put := func(via int, key, val string, ack int) int {
		code := cl.Put(t, pc.urls[via], key, []byte(val), ack, 3)
		if code == http.StatusCreated {
			acked[key] = val
		}
		return code
	}

	for i := range 30 {
		require.Equal(t, http.StatusCreated, put(i%3, fmt.Sprintf("key-%d", i), fmt.Sprintf("v%d", i), 2))
	}
	pc.kill(2)

	// Two of three are up: quorum reads and writes work, ack=3 cannot.
	for key, val := range acked {
		expectValue(t, cl, pc.urls[0], key, 2, 3, val)
	}
	for i := range 30 {
		require.Equal(t, http.StatusCreated, put(i%2, fmt.Sprintf("key-%d", i+30), fmt.Sprintf("w%d", i), 2))
	}
	require.Equal(t, http.StatusCreated, put(1, "key-0", "overwritten", 2))
	require.Equal(t, http.StatusGatewayTimeout, cl.Put(t, pc.urls[0], "key-ack3", []byte("x"), 3, 3))
	code, _ := cl.Get(t, pc.urls[1], "key-0", 3, 3)
	require.Equal(t, http.StatusGatewayTimeout, code)

	// The killed node comes back on its data directory (what it had
	// acknowledged was fsynced) and every acknowledged write is readable
	// with ack=3, through every node.
	pc.start(2)
	for via := range 3 {
		for key, val := range acked {
			expectValue(t, cl, pc.urls[via], key, 3, 3, val)
		}
	}
	// The restarted node's own replica has what it acknowledged before the
	// kill (writes coordinated by node 2 were acknowledged by it).
	for i := 2; i < 30; i += 3 {
		key := fmt.Sprintf("key-%d", i)
		code, rec := internalGet(t, cl, pc.urls[2], key, "")
		require.Equal(t, http.StatusOK, code, key)
		require.Equal(t, acked[key], string(rec.Value), key)
	}
}

package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// freeBase returns a base port such that base..base+2 and the admin ports
// make derives, base-2020..base-2018, are all free.
func freeBase(t *testing.T) int {
	t.Helper()
	for range 50 {
		base := 22000 + rand.IntN(40000)
		var ls []net.Listener
		ok := true
		for _, p := range []int{base, base + 1, base + 2, base - 2020, base - 2019, base - 2018} {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				ok = false
				break
			}
			ls = append(ls, l)
		}
		for _, l := range ls {
			l.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatal("no free base port found")
	return 0
}

// clusterScript runs scripts/cluster.sh (the recipe of make run-cluster
// and make stop-cluster) with the built binary and env.
func clusterScript(t *testing.T, env []string, arg string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(testcluster.RepoRoot(t), "scripts", "cluster.sh"), arg)
	cmd.Env = append(os.Environ(), env...)
	cmd.Dir = t.TempDir()
	return cmd
}

var nodeLine = regexp.MustCompile(`^  node(\d)  (http://127\.0\.0\.1:(\d+))  admin http://127\.0\.0\.1:(\d+)/metrics  log \S+$`)

// TestRunClusterScript: make run-cluster PORT=base starts three nodes on
// base..base+2 with the admin ports derived (base-2020...), prints the
// ports it started them on, and those are the nodes that answer, forming
// one cluster; make stop-cluster with the same PORT stops them and the
// recipe exits 0. A port already taken, or a bad PORT, is refused before
// anything starts.
func TestRunClusterScript(t *testing.T) {
	if testing.Short() {
		t.Skip("runs scripts/cluster.sh: a process test; runs without -short")
	}
	bin := testcluster.BuildBinary(t, testcluster.RepoRoot(t))
	base := freeBase(t)
	data := t.TempDir()
	env := []string{"PORT=" + strconv.Itoa(base), "BIN=" + filepath.Dir(bin), "DATA=" + data, "ADMIN_PORT="}

	run := clusterScript(t, env, "run")
	pr, pw := io.Pipe()
	var stderr bytes.Buffer
	run.Stdout, run.Stderr = pw, &stderr
	require.NoError(t, run.Start())
	exited := make(chan struct{}) // closed when the script is gone; then runErr is its error
	var runErr error
	go func() {
		runErr = run.Wait()
		pw.Close() // ends the reader below
		close(exited)
	}()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = clusterScript(t, env, "stop").Run()
			<-exited
		}
	})
	// The script's output, read to its end (the script must never block
	// writing it); started is closed at the line that ends the banner.
	type printed struct{ url, admin string }
	var nodes []printed
	started := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if bytes.Contains(sc.Bytes(), []byte("stops all three")) {
				close(started)
			}
			if m := nodeLine.FindStringSubmatch(sc.Text()); m != nil {
				nodes = append(nodes, printed{m[2], m[4]})
			}
		}
	}()
	select {
	case <-started: // nodes is complete and no longer written
	case <-exited:
		t.Fatalf("run-cluster exited at start: %v; stderr: %s", runErr, stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatal("run-cluster did not start in 60 s")
	}
	require.Len(t, nodes, 3)
	for i, n := range nodes {
		assert.Equal(t, fmt.Sprintf("http://127.0.0.1:%d", base+i), n.url, "node%d's port", i+1)
		assert.Equal(t, strconv.Itoa(base-2020+i), n.admin, "node%d's admin port", i+1)
		nodes[i].admin = "http://127.0.0.1:" + n.admin
	}

	c, err := client.New(client.Config{Endpoints: []string{nodes[0].url}})
	require.NoError(t, err)
	defer c.Close()
	for _, n := range nodes {
		st, err := c.Status(t.Context(), n.url)
		require.NoError(t, err)
		assert.Equal(t, n.url, st.Node, "the node on the printed port is the one started")
		require.Len(t, st.Members, 3)
		for i, m := range st.Members {
			assert.Equal(t, nodes[i].url, m.URL)
		}
		resp, err := http.Get(n.admin + "/livez")
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode, n.admin)
	}
	for i := 1; i <= 3; i++ {
		assert.FileExists(t, filepath.Join(data, fmt.Sprintf("node%d.pid", i)))
	}

	out, err := clusterScript(t, env, "stop").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "stopped (PORT="+strconv.Itoa(base))
	select {
	case <-exited:
		require.NoError(t, runErr, "the run recipe exits 0 once stopped; stderr: %s", stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("run-cluster still running after stop-cluster")
	}
	for i := 1; i <= 3; i++ {
		assert.NoFileExists(t, filepath.Join(data, fmt.Sprintf("node%d.pid", i)))
	}
	out, err = clusterScript(t, env, "stop").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "no cluster running")

	// Refusals: nothing is started, one line says why.
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+1))
	require.NoError(t, err)
	defer l.Close()
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{env, fmt.Sprintf("port %d is in use", base+1)},
		{[]string{"PORT=80", "DATA=" + data}, "PORT=80: want 1024 to 65533"},
		{[]string{"PORT=3000", "DATA=" + data}, "ADMIN_PORT (PORT-2020 by default) would be 980"},
		{[]string{"PORT=http", "DATA=" + data}, "PORT=http is not a port number"},
		{[]string{"PORT=" + strconv.Itoa(base), "ADMIN_PORT=" + strconv.Itoa(base+2), "DATA=" + data}, "overlaps"},
	} {
		out, err := clusterScript(t, tc.env, "run").CombinedOutput()
		require.Error(t, err, "%v: %s", tc.env, out)
		assert.Contains(t, string(out), tc.want, tc.env)
	}
	for i := 1; i <= 3; i++ {
		assert.NoFileExists(t, filepath.Join(data, fmt.Sprintf("node%d.pid", i)))
	}
}

// After the README's walkthrough decommissions node 1, make run-cluster
// still starts: node 1 exits 0 on its directory (its node left the
// cluster) and the script goes on with the other two. (Before, the
// script stopped every node because node 1 exited at start.)
func TestRunClusterAfterDecommission(t *testing.T) {
	if testing.Short() {
		t.Skip("runs scripts/cluster.sh: a process test; runs without -short")
	}
	bin := testcluster.BuildBinary(t, testcluster.RepoRoot(t))
	base := freeBase(t)
	data := t.TempDir()
	urls := make([]string, 3)
	for i := range urls {
		urls[i] = fmt.Sprintf("http://127.0.0.1:%d", base+i)
	}
	// Node 1's directory as a decommission leaves it: a map of the list
	// it was seeded from, and an identity the map no longer has.
	st, err := store.Open(filepath.Join(data, "node1"), store.Options{MemTableBytes: 1 << 20})
	require.NoError(t, err)
	m, err := clustermap.Seed(urls, 3)
	require.NoError(t, err)
	require.NoError(t, st.SetClusterMap(m.Encode()))
	require.NoError(t, st.SetIdentity(store.Identity{Cluster: m.Cluster, Node: 9, Formed: true}))
	require.NoError(t, st.Close())

	env := []string{"PORT=" + strconv.Itoa(base), "BIN=" + filepath.Dir(bin), "DATA=" + data, "ADMIN_PORT="}
	run := clusterScript(t, env, "run")
	outPath := filepath.Join(t.TempDir(), "out")
	outFile, err := os.Create(outPath)
	require.NoError(t, err)
	defer outFile.Close()
	var stderr bytes.Buffer
	run.Stdout, run.Stderr = outFile, &stderr
	require.NoError(t, run.Start())
	t.Cleanup(func() {
		_ = clusterScript(t, env, "stop").Run()
		_ = run.Wait()
	})
	// The banner's last line: the script has checked every node.
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(outPath)
		return err == nil && bytes.Contains(b, []byte("stops all three"))
	}, 60*time.Second, 20*time.Millisecond, "run-cluster started")
	testcluster.WaitReady(t, urls[1], 30*time.Second)
	testcluster.WaitReady(t, urls[2], 30*time.Second)
	require.Equal(t, http.StatusCreated, testcluster.NewClient(t).Put(t, urls[1], "k", []byte("v"), 2, 3),
		"nodes 2 and 3 serve at the default quorum")
	require.NoError(t, clusterScript(t, env, "stop").Run())
	require.NoError(t, run.Wait(), "stderr: %s", stderr.String())
	out, err := os.ReadFile(outPath)
	require.NoError(t, err)
	assert.Contains(t, string(out), "node1 was decommissioned earlier")
}

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
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// allFree reports whether every port of ports can be listened on now.
func allFree(ports ...int) bool {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for _, p := range ports {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			return false
		}
		ls = append(ls, l)
	}
	return true
}

// freeBase returns a base port such that base..base+4 and the admin ports
// make derives, base-2020..base-2016, are all free (nodes 1-5).
func freeBase(t *testing.T) int {
	t.Helper()
	for range 50 {
		base := 22000 + rand.IntN(40000)
		if allFree(base, base+1, base+2, base+3, base+4, base-2020, base-2019, base-2018, base-2017, base-2016) {
			return base
		}
	}
	t.Fatal("no free base port found")
	return 0
}

// freeAdminBase returns the first of five consecutive free ports, apart
// from freeBase's ports around base.
func freeAdminBase(t *testing.T, base int) int {
	t.Helper()
	for range 50 {
		p := 22000 + rand.IntN(40000)
		if p+4 >= base-2020 && p <= base+4 {
			continue
		}
		if allFree(p, p+1, p+2, p+3, p+4) {
			return p
		}
	}
	t.Fatal("no five free consecutive ports")
	return 0
}

// clusterScript runs scripts/cluster.sh (the recipe of make run-cluster
// and make stop-cluster) with the built binary and env.
func clusterScript(t *testing.T, env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(testcluster.RepoRoot(t), "scripts", "cluster.sh"), args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Dir = t.TempDir()
	return cmd
}

var nodeLine = regexp.MustCompile(`^  node(\d+)  (http://127\.0\.0\.1:(\d+))  admin http://127\.0\.0\.1:(\d+)/metrics  log \S+$`)

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
	lines := make(chan string, 100) // the lines after the banner
	go func() {
		sc := bufio.NewScanner(pr)
		banner := true
		for sc.Scan() {
			if !banner {
				select {
				case lines <- sc.Text():
				default: // nobody waits for so many
				}
			}
			if bytes.Contains(sc.Bytes(), []byte("stops every node")) {
				banner = false
				close(started)
			}
			if m := nodeLine.FindStringSubmatch(sc.Text()); m != nil {
				nodes = append(nodes, printed{m[2], m[4]})
			}
		}
	}()
	// said waits for a line of the script's holding want.
	said := func(want string) {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for {
			select {
			case l := <-lines:
				if strings.Contains(l, want) {
					return
				}
			case <-timeout:
				t.Fatalf("run-cluster did not say %q in 30 s", want)
			}
		}
	}
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

	// A node that dies is named, and the others go on; make run-node
	// starts it again, and make stop-node stops it alone.
	pid, err := os.ReadFile(filepath.Join(data, "node2.pid"))
	require.NoError(t, err)
	require.NoError(t, exec.Command("kill", "-KILL", strings.TrimSpace(string(pid))).Run())
	said("node2 exited (status 137)")
	same := fmt.Sprintf(" PORT=%d DATA=%s", base, data) // the hints name this cluster
	said("the others go on (make run-node N=2" + same + " starts it again)")
	for _, n := range []int{0, 2} {
		_, err := c.Status(t.Context(), nodes[n].url)
		require.NoError(t, err, "node%d still serves", n+1)
	}
	out, err := clusterScript(t, env, "node", "2").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "node2 running: "+nodes[1].url)
	out, err = clusterScript(t, env, "stop-node", "2").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "stopped node2")
	out, err = clusterScript(t, env, "stop-node", "3").CombinedOutput()
	require.NoError(t, err, "%s", out)
	said("node3 stopped (make stop-node N=3" + same + " or stop-cluster" + same)
	_, err = c.Status(t.Context(), nodes[0].url)
	require.NoError(t, err, "node1 still serves")

	out, err = clusterScript(t, env, "stop").CombinedOutput()
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
		{env, fmt.Sprintf("port %d is in use (another cluster? try make run-cluster PORT=<another base>, or make stop-cluster%s)", base+1, same)},
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
	errPath := filepath.Join(t.TempDir(), "err")
	errFile, err := os.Create(errPath)
	require.NoError(t, err)
	defer errFile.Close()
	run.Stdout, run.Stderr = outFile, errFile
	require.NoError(t, run.Start())
	t.Cleanup(func() {
		_ = clusterScript(t, env, "stop").Run()
		_ = run.Wait()
	})
	// The banner's last line: the script has checked every node. Its
	// output and error files say why when it does not come.
	deadline := time.Now().Add(60 * time.Second)
	for {
		b, _ := os.ReadFile(outPath)
		if bytes.Contains(b, []byte("stops every node")) {
			break
		}
		if time.Now().After(deadline) {
			e, _ := os.ReadFile(errPath)
			t.Fatalf("run-cluster did not start within 60 s; its output:\n%s\nits errors:\n%s", b, e)
		}
		time.Sleep(20 * time.Millisecond) // polling interval of a condition
	}
	testcluster.WaitReady(t, urls[1], 30*time.Second)
	testcluster.WaitReady(t, urls[2], 30*time.Second)
	require.Equal(t, http.StatusCreated, testcluster.NewClient(t).Put(t, urls[1], "k", []byte("v"), 2, 3),
		"nodes 2 and 3 serve at the default quorum")
	require.NoError(t, clusterScript(t, env, "stop").Run())
	werr := run.Wait()
	e, _ := os.ReadFile(errPath)
	require.NoError(t, werr, "stderr: %s", e)
	out, err := os.ReadFile(outPath)
	require.NoError(t, err)
	assert.Contains(t, string(out), "node1 was decommissioned, removed or replaced earlier")
}

// TestRunClusterFollowsItsNodes walks README.md's membership walkthrough
// with the scripts: run-cluster, join node 4 (make run-node N=4),
// decommission node 1, stop node 4 alone (make stop-node) and replace it
// with node 5 (make run-node N=5); then stop-cluster stops every node,
// the joined ones too, and run-cluster starts what the cluster has grown
// to: nodes 2, 3 and 5, saying that 1 and 4 left, serving at the default
// quorum. (Before, stop-cluster knew nodes 1-3 only, and run-cluster
// never started a joined node.)
func TestRunClusterFollowsItsNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("runs scripts/cluster.sh: a process test; runs without -short")
	}
	bin := testcluster.BuildBinary(t, testcluster.RepoRoot(t))
	base := freeBase(t)
	data := t.TempDir()
	url := func(n int) string { return fmt.Sprintf("http://127.0.0.1:%d", base+n-1) }
	// The cluster's first start is given an admin base of its own; every
	// later command is given none and must take the one DATA remembers
	// (a new user's make run-node N=4 started node 4 on the default).
	adminBase := freeAdminBase(t, base)
	admin := func(n int) string { return fmt.Sprintf("127.0.0.1:%d", adminBase+n-1) }
	env := []string{"PORT=" + strconv.Itoa(base), "BIN=" + filepath.Dir(bin), "DATA=" + data, "ADMIN_PORT="}
	t.Cleanup(func() { _ = clusterScript(t, env, "stop").Run() })

	// startCluster runs run-cluster until its banner, and returns its
	// output file and the command.
	first := true
	startCluster := func() (string, *exec.Cmd) {
		runEnv := env
		if first {
			runEnv = append(env[:len(env)-1:len(env)-1], "ADMIN_PORT="+strconv.Itoa(adminBase))
			first = false
		}
		run := clusterScript(t, runEnv, "run")
		outPath := filepath.Join(t.TempDir(), "out")
		out, err := os.Create(outPath)
		require.NoError(t, err)
		t.Cleanup(func() { out.Close() })
		run.Stdout, run.Stderr = out, out
		require.NoError(t, run.Start())
		require.Eventually(t, func() bool {
			b, err := os.ReadFile(outPath)
			return err == nil && bytes.Contains(b, []byte("stops every node"))
		}, 60*time.Second, 20*time.Millisecond, "run-cluster started")
		return outPath, run
	}
	c, err := client.New(client.Config{Endpoints: []string{url(2)}})
	require.NoError(t, err)
	defer c.Close()
	// change asks for a membership change and waits for its end.
	change := func(ask func() (*client.ClusterMap, error), via int) {
		t.Helper()
		var err error
		var first *client.ClusterMap
		require.Eventually(t, func() bool {
			if first, err = ask(); err != nil {
				t.Logf("not begun: %v", err)
			}
			return err == nil
		}, 30*time.Second, 100*time.Millisecond, "begun")
		// On the map's log the node asked installs the change's first map
		// a moment after it answers: wait for it, or a later one, without a
		// change under way.
		require.Eventually(t, func() bool {
			st, err := c.Cluster(t.Context(), admin(via))
			return err == nil && st.Map.Epoch >= first.Epoch && st.Map.Change == nil
		}, 90*time.Second, 50*time.Millisecond, "the change ends")
	}
	script := func(args ...string) string {
		t.Helper()
		out, err := clusterScript(t, env, args...).CombinedOutput()
		require.NoError(t, err, "cluster.sh %v: %s", args, out)
		return string(out)
	}

	_, run := startCluster()
	// The join begins (202: a node refuses while the cluster is still
	// forming), then node 4 starts and takes the map.
	var joinErr error
	require.Eventually(t, func() bool {
		_, joinErr = c.Join(t.Context(), admin(1), url(4))
		return joinErr == nil
	}, 30*time.Second, 100*time.Millisecond, "join begun: %v", joinErr)
	require.Contains(t, script("node", "4"), "node4 running: "+url(4))
	require.Eventually(t, func() bool {
		st, err := c.Cluster(t.Context(), admin(1))
		return err == nil && st.Map.Change == nil && slices.ContainsFunc(st.Map.Nodes, func(n client.ClusterNode) bool { return n.URL == url(4) })
	}, 90*time.Second, 50*time.Millisecond, "the join ends")
	change(func() (*client.ClusterMap, error) { return c.Decommission(t.Context(), admin(2), url(1)) }, 2)
	require.Contains(t, script("stop-node", "4"), "stopped node4")
	change(func() (*client.ClusterMap, error) { return c.Replace(t.Context(), admin(2), url(4), url(5)) }, 2)
	require.Contains(t, script("node", "5"), "node5 running: "+url(5))
	require.Eventually(t, func() bool {
		st, err := c.Cluster(t.Context(), admin(5))
		return err == nil && st.Map.Change == nil && st.Self >= 0
	}, 90*time.Second, 50*time.Millisecond, "node 5 rebuilt")

	require.Contains(t, script("stop"), "stopped")
	require.NoError(t, run.Wait(), "run-cluster exits 0 once stopped")
	for _, n := range []int{2, 3, 5} {
		_, err := http.Get(url(n) + "/v0/status")
		require.Error(t, err, "node %d stopped", n)
	}

	outPath, run := startCluster()
	out, err := os.ReadFile(outPath)
	require.NoError(t, err)
	var started []string
	for _, l := range strings.Split(string(out), "\n") {
		if m := nodeLine.FindStringSubmatch(l); m != nil {
			started = append(started, m[1])
		}
	}
	// Node 1's own stored map says it was decommissioned; node 4 may
	// answer before it learns that it was replaced (below).
	assert.Subset(t, started, []string{"2", "3", "5"}, "%s", out)
	assert.NotContains(t, started, "1", "%s", out)
	assert.Contains(t, string(out), "node1 was decommissioned, removed or replaced earlier")
	// Node 4 learns that it was replaced at start, from a member that
	// answers its question (it exits 0: run goes on without it), or,
	// when none answers yet, starts on its old map and stops once it
	// hears the new one.
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(outPath)
		return bytes.Contains(b, []byte("node4 was decommissioned, removed or replaced earlier")) ||
			bytes.Contains(b, []byte("node4 left the cluster"))
	}, 30*time.Second, 50*time.Millisecond, "node 4 says it left: %s", out)
	testcluster.WaitReady(t, url(2), 30*time.Second)
	require.Equal(t, http.StatusCreated, testcluster.NewClient(t).Put(t, url(2), "k", []byte("v"), 2, 3))
	require.Contains(t, script("stop"), "stopped")
	require.NoError(t, run.Wait())
}

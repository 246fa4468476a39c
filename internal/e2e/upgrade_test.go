package e2e_test

// A rolling upgrade of a cluster of the release without the map's log
// (main before the node opened its log) to this one, one node at a time,
// on the same data directories (docs/membership.md, "Upgrading to the
// log").

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/membership"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// upgradeFrom is the release the upgrade starts from: the last commit of
// main whose node runs without the map's log. DHTKV_UPGRADE_FROM names
// another revision.
const upgradeFrom = "7650f34"

// buildRevision builds cmd/dhtkv as of git revision rev of the
// repository at root, or skips the test when the history is not there
// (a shallow clone, a source tarball).
func buildRevision(t *testing.T, root, rev string) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git to build the release the upgrade starts from")
	}
	if out, err := exec.Command("git", "-C", root, "cat-file", "-e", rev+"^{commit}").CombinedOutput(); err != nil {
		t.Skipf("revision %s is not in this checkout's history (%v: %s): the upgrade test needs it", rev, err, out)
	}
	src := t.TempDir()
	archive := exec.Command("git", "-C", root, "archive", "--format=tar", rev)
	untar := exec.Command("tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	require.NoError(t, err)
	untar.Stdin = pipe
	require.NoError(t, untar.Start())
	require.NoError(t, archive.Run(), "git archive %s", rev)
	require.NoError(t, untar.Wait(), "untar %s", rev)
	bin := filepath.Join(t.TempDir(), "dhtkv-"+rev)
	build := exec.Command("go", "build", "-o", bin, "./cmd/dhtkv")
	build.Dir = src
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build at %s:\n%s", rev, out)
	return bin
}

// clusterStatus is node i's GET /cluster (admin port).
func (pc *procCluster) clusterStatus(i int) membership.ChangeStatus {
	pc.t.Helper()
	resp, err := http.Get("http://" + pc.admins[i] + "/cluster")
	require.NoError(pc.t, err)
	defer resp.Body.Close()
	require.Equal(pc.t, http.StatusOK, resp.StatusCode)
	var cs membership.ChangeStatus
	require.NoError(pc.t, json.NewDecoder(resp.Body).Decode(&cs))
	return cs
}

// setReplicas asks node i to change the replication factor to n; it
// returns the answer's status code and body.
func (pc *procCluster) setReplicas(i, n int) (int, string) {
	pc.t.Helper()
	resp, err := http.Post(fmt.Sprintf("http://%s/cluster/replicas?n=%d", pc.admins[i], n), "", nil)
	require.NoError(pc.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(pc.t, err)
	return resp.StatusCode, string(b)
}

// awaitReplicas waits until every node installed a map of n replicas with
// no change under way, and returns its epoch.
func (pc *procCluster) awaitReplicas(t *testing.T, n int) uint64 {
	t.Helper()
	var epoch uint64
	require.Eventually(t, func() bool {
		var epochs []uint64
		for i := range pc.nodes {
			cs := pc.clusterStatus(i)
			if cs.Map.Replicas != n || cs.Map.Change != nil {
				return false
			}
			epochs = append(epochs, cs.Map.Epoch)
		}
		epoch = epochs[0]
		return slices.Min(epochs) == slices.Max(epochs)
	}, time.Minute, 50*time.Millisecond, "every node at %d replicas, no change under way", n)
	return epoch
}

// A cluster of three nodes of the release without the log, upgraded one
// node at a time on the same data directories. While a member runs the
// old release the log refuses every change (it needs every member's
// acknowledgement, which only a node on the log gives), and the changes
// the old members still make reach the log (its seed follows the maps the
// upgraded nodes install); once the last node runs the log, its map is
// the cluster's and changes go through it. Reads and writes are served
// throughout.
func TestProcessClusterRollingUpgradeToTheLog(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the old release and runs processes; runs without -short")
	}
	longFault(t) // make test: membership_log's TestNodesBehindTheLogsRulesStop, rpc's TestLogUpgrade
	root := testcluster.RepoRoot(t)
	rev := upgradeFrom
	if r := os.Getenv("DHTKV_UPGRADE_FROM"); r != "" {
		rev = r
	}
	old := buildRevision(t, root, rev)
	cur := testcluster.BuildBinary(t, root)
	pc := startProcClusterOf(t, old, 3)
	cl := testcluster.NewClient(t)
	for k := range 20 {
		require.Equal(t, http.StatusCreated, cl.Put(t, pc.urls[k%3], fmt.Sprintf("k%02d", k), []byte("v"), 2, 3))
	}
	readAll := func(ack, from int) {
		t.Helper()
		for k := range 20 {
			expectValue(t, cl, pc.urls[k%3], fmt.Sprintf("k%02d", k), ack, from, "v")
		}
	}
	dataDir := func(i int) string {
		j := slices.Index(pc.nodes[i].args, "--data-dir")
		return pc.nodes[i].args[j+1]
	}
	upgrade := func(i int) {
		t.Helper()
		_, err := os.Stat(filepath.Join(dataDir(i), "maplog"))
		require.ErrorIs(t, err, os.ErrNotExist, "the old release keeps no log")
		pc.stop(i)
		pc.bin = cur
		pc.start(i)
	}

	// One node on the log: its log has no quorum (the others do not
	// answer the log's upgrade), and it serves on its stored map.
	upgrade(0)
	readAll(2, 3)

	// Two: the log elects a leader and is seeded with the stored map;
	// node 2, on the old release, never acknowledges it.
	upgrade(1)
	readAll(2, 3)
	require.Eventually(t, func() bool {
		return slices.Equal(pc.clusterStatus(0).Waiting, []int{2})
	}, time.Minute, 50*time.Millisecond, "the log seeded, waiting for node 2's acknowledgement")
	code, body := pc.setReplicas(0, 2)
	require.Equal(t, http.StatusConflict, code, body)
	require.Contains(t, body, "have not acknowledged", "the log refuses a change while a member runs the old release")

	// The old member still changes the map by its own protocol; the
	// upgraded nodes install its maps, and the log's seed follows them.
	code, body = pc.setReplicas(2, 2)
	require.Equal(t, http.StatusAccepted, code, body)
	before := pc.awaitReplicas(t, 2)
	readAll(2, 2)
	require.Eventually(t, func() bool {
		return pc.clusterStatus(0).LogEpoch == before && pc.clusterStatus(1).LogEpoch == before
	}, time.Minute, 50*time.Millisecond, "the log's seed follows the old release's change to epoch %d", before)

	// The last node: every member acknowledges the log's map, which is
	// the one the old release made last, and changes go through the log.
	upgrade(2)
	require.Eventually(t, func() bool {
		for i := range pc.nodes {
			// Each node's replica of the log holds the map (a change is
			// made from the epoch of the replica of the node asked).
			if cs := pc.clusterStatus(i); len(cs.Waiting) > 0 || cs.Map.Epoch != before || cs.LogEpoch != before {
				return false
			}
		}
		return true
	}, time.Minute, 50*time.Millisecond, "every member acknowledged the log's map of epoch %d", before)
	code, body = pc.setReplicas(2, 3)
	require.Equal(t, http.StatusAccepted, code, body)
	after := pc.awaitReplicas(t, 3)
	require.Greater(t, after, before)
	cs := pc.clusterStatus(0)
	require.NotNil(t, cs.Last, "the change ended on the log")
	require.Equal(t, after, cs.Last.Ended)
	readAll(3, 3)
	for i := range pc.nodes {
		_, err := os.Stat(filepath.Join(dataDir(i), "maplog"))
		require.NoError(t, err, "node %d keeps the log", i)
	}
}

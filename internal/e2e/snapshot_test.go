package e2e_test

import (
	"context"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// TestSnapshotRestore is the documented restore (README.md, Backup and
// restore): a node's snapshot taken through its admin listener, more
// writes, overwrites and deletes afterwards, the node stopped, its data
// directory replaced by the snapshot, the node started: it holds the
// snapshot's data, and one anti-entropy exchange brings it up to date.
// It is skipped while the store cannot checkpoint (/snapshot answers 501).
func TestSnapshotRestore(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 3)
	cl := testcluster.NewClient(t)
	want := map[string]string{}
	for i := range 50 {
		k := fmt.Sprintf("b%02d", i)
		want[k] = "before"
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(i%3), k, []byte(want[k]), 3, 3))
	}
	atSnapshot := testcluster.ScanOf(want, "", "")

	ctl, err := client.New(client.Config{Endpoints: []string{c.URL(2)}})
	require.NoError(t, err)
	defer ctl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A name inside the node's --snapshot-dir, by default beside its data
	// directory; after an exchange with every peer, so that the snapshot
	// knows up to when it holds every write.
	dir := filepath.Join(c.Config(2).DataDir+"-snapshots", "node3")
	c.Repair(t, 2)
	snap, err := ctl.Snapshot(ctx, c.Node(2).AdminAddr(), "node3")
	if err != nil && strings.Contains(err.Error(), ": 501 ") {
		t.Skipf("the store cannot checkpoint yet (store.Store.Checkpoint): %v", err)
	}
	require.NoError(t, err)
	require.Equal(t, dir, snap.Dir)

	for i := range 20 {
		k := fmt.Sprintf("a%02d", i)
		want[k] = "after"
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(i%3), k, []byte(want[k]), 3, 3))
	}
	want["b00"] = "overwritten"
	require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), "b00", []byte(want["b00"]), 3, 3))
	delete(want, "b01")
	require.Equal(t, http.StatusAccepted, cl.Delete(t, c.URL(1), "b01", 3, 3))

	// The restore: stop, replace the data directory, start.
	c.StopNode(2)
	data := c.Config(2).DataDir
	require.NoError(t, os.RemoveAll(data))
	require.NoError(t, os.Rename(dir, data))
	_, err = os.Stat(filepath.Join(data, store.SnapshotMark))
	require.NoError(t, err, "the snapshot says when it was taken")
	c.StartNode(2)
	_, err = os.Stat(filepath.Join(data, store.SnapshotMark))
	require.ErrorIs(t, err, fs.ErrNotExist, "started on, the directory is the node's own again")
	local := func(i int) [][2]string {
		resp := testcluster.HTTPGet(t, c.URL(i)+"/v0/entities?start=%00&format=binary")
		require.Equal(t, http.StatusOK, resp.StatusCode)
		return testcluster.ReadBinary(t, resp.Body)
	}
	require.Equal(t, atSnapshot, local(2), "the restored node holds the snapshot's data")

	c.Repair(t, 2)
	require.Equal(t, testcluster.ScanOf(want, "", ""), local(2), "anti-entropy brought it up to date")
	require.Equal(t, local(0), local(2))
}

// TestOldSnapshotRefused: a node restored from a snapshot that may lack
// a delete the others have collected refuses to start, saying why and
// what to do: one complete as of longer ago than --gc-grace (less the
// clock skew bound), and one taken before the node had completed an
// exchange with every peer since its start (it may lack deletes made
// while it was down). --restore-old-snapshot (every node restored)
// starts it, and it is the node's own directory from then on.
func TestOldSnapshotRefused(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 3, withGC()) // grace 1 s, skew bound 500 ms, exchanges on demand
	cl := testcluster.NewClient(t)
	require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), "k", []byte("v"), 3, 3))
	ctl, err := client.New(client.Config{Endpoints: []string{c.URL(2)}})
	require.NoError(t, err)
	defer ctl.Close()
	snapshot := func(name string) *client.Snapshot {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		snap, err := ctl.Snapshot(ctx, c.Node(2).AdminAddr(), name)
		require.NoError(t, err)
		return snap
	}
	snap := snapshot("unknown") // no exchange yet
	require.Nil(t, snap.CompleteAsOf)
	require.Contains(t, snap.Warning, "completeness unknown: the node had not completed an anti-entropy exchange with every peer since its start (POST /repair first)")
	unknown := snap.Dir
	before := time.Now()
	c.Repair(t, 2)
	snap = snapshot("old")
	require.NotNil(t, snap.CompleteAsOf)
	require.WithinRange(t, *snap.CompleteAsOf, before, time.Now(), "the start of its last exchanges")
	require.Empty(t, snap.Warning)
	old := snap.Dir
	time.Sleep(1500 * time.Millisecond) // the behaviour under test: older than the grace less the skew bound
	data := c.Config(2).DataDir
	for _, tc := range []struct{ dir, why string }{
		{unknown, "before the node had completed an anti-entropy exchange with every peer since its start: it may lack deletes the other replicas have since collected"},
		{old, "longer than --gc-grace (1s) less --max-clock-skew (500ms): the other replicas may have collected deletes made since"},
	} {
		c.StopNode(2)
		require.NoError(t, os.RemoveAll(data))
		require.NoError(t, os.Rename(tc.dir, data))
		_, err = node.New(c.Config(2))
		require.ErrorContains(t, err, tc.why)
		require.ErrorContains(t, err, "Start it with an empty directory instead (it rebuilds from its peers), or, when restoring every node of the cluster from its snapshots, with --restore-old-snapshot")
		require.NotContains(t, err.Error(), "\n", "one line")
		_, err = os.Stat(filepath.Join(data, store.SnapshotMark))
		require.NoError(t, err, "nothing changed in the directory refused")

		c.Reconfigure(2, func(cfg *node.Config) { cfg.RestoreOldSnapshot = true })
		c.StartNode(2)
		c.StopNode(2)
		c.Reconfigure(2, func(cfg *node.Config) { cfg.RestoreOldSnapshot = false })
		c.StartNode(2) // its own directory now
	}
	code, body := cl.Get(t, c.URL(2), "k", 3, 3)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "v", string(body))
}

// A snapshot is complete as of the earliest start of the node's last
// exchanges with its peers under the current cluster map: not known
// before one with every peer, nor after a change (exchanges under the old
// map compared other replica sets), even with the same peers left, until
// the next.
func TestSnapshotCompletenessFollowsTheMap(t *testing.T) {
	testcluster.InBubble(t, func(t *testing.T) {
		c := testcluster.StartInMemory(t, 4, func(_ int, cfg *node.Config) { cfg.Replicas = 3 }) // one may leave
		c.AwaitFormed(time.Minute)
		require.True(t, c.Node(0).CompleteAsOf().IsZero(), "no exchange yet")
		time.Sleep(time.Millisecond) // the bubble's clock stands still while anything runs
		before := time.Now()
		c.Repair(0)
		require.False(t, c.Node(0).CompleteAsOf().Before(before), "the start of its exchanges")

		require.Equal(t, http.StatusAccepted, c.Decommission(1, 3))
		c.AwaitLeft(3, time.Minute)
		c.Await(10*time.Second, "node 0 installed the map without node 4", func() (bool, string) {
			m, _ := c.Node(0).Members().Map()
			return m.ByURL(c.URL(3)) == nil && m.Change == nil, m.String()
		})
		require.True(t, c.Node(0).CompleteAsOf().IsZero(), "its exchanges with nodes 2 and 3 were under the old map")
		time.Sleep(time.Millisecond)
		before = time.Now()
		c.Repair(0)
		require.False(t, c.Node(0).CompleteAsOf().Before(before))
	})
}

package e2e_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/cluster"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// The flip-flop history of a failed write: W1 reached one replica only
// (its coordinator answered 504), W2 was acknowledged by the two others
// after W1 returned. Every replica is asked through the internal API
// afterwards, so nothing but the reads under test can repair anything.
func flipFlop(t *testing.T, c *testcluster.Cluster, cl *testcluster.Client) (key string, lone int) {
	t.Helper()
	key, lone = "flipflop", 2
	w1 := record.Record{Version: versionAt(time.Now().Add(-time.Second), 0, lone), Value: []byte("W1")}
	require.Equal(t, http.StatusCreated, internalPut(t, cl, c.URL(lone), key, w1, ""))
	w2 := record.Record{Version: versionAt(time.Now(), 0, 0), Value: []byte("W2")}
	for i := range 2 {
		require.Equal(t, http.StatusCreated, internalPut(t, cl, c.URL(i), key, w2, ""))
	}
	return key, lone
}

// TestReadRepairBlocking: the first quorum read that meets the stale
// replica writes W2 to it before replying, so every replica holds W2 and
// no later read, through any node with any quorum, returns W1.
func TestReadRepairBlocking(t *testing.T) {
	c := testcluster.Start(t, 3)
	cl := testcluster.NewClient(t)
	key, lone := flipFlop(t, c, cl)
	code, body := cl.Get(t, c.URL(lone), key, 3, 3)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "W2", string(body))
	for i := range 3 {
		_, rec := internalGet(t, cl, c.URL(i), key, "")
		require.Equal(t, "W2", string(rec.Value), "node %d was repaired before the reply", i)
	}
	for i := range 3 {
		for ack := 1; ack <= 3; ack++ {
			expectValue(t, cl, c.URL(i), key, ack, 3, "W2")
		}
	}
	require.Equal(t, 1.0, c.Metric(t, lone, "dhtkv_read_repairs_total", "mode", "blocking", "result", "ok"))
}

// TestReadRepairMissingAndTombstone: a replica that never saw the key, and
// one holding a value the others deleted, are both brought to the newest
// record, the tombstone included.
func TestReadRepairMissingAndTombstone(t *testing.T) {
	c := testcluster.Start(t, 3)
	cl := testcluster.NewClient(t)
	old := record.Record{Version: versionAt(time.Now().Add(-time.Second), 0, 1), Value: []byte("old")}
	del := record.Record{Version: versionAt(time.Now(), 0, 0), Tombstone: true}
	require.Equal(t, http.StatusCreated, internalPut(t, cl, c.URL(1), "gone", old, ""))
	require.Equal(t, http.StatusCreated, internalPut(t, cl, c.URL(0), "gone", del, ""))
	// node 2 never saw "gone"
	code, _ := cl.Get(t, c.URL(0), "gone", 3, 3)
	require.Equal(t, http.StatusNotFound, code)
	for i := range 3 {
		code, rec := internalGet(t, cl, c.URL(i), "gone", "")
		require.Equal(t, http.StatusOK, code, "node %d holds a record", i)
		require.True(t, rec.Tombstone, "node %d holds the tombstone", i)
		require.Equal(t, del.Version, rec.Version)
	}
}

// TestReadRepairAsyncReachesTheOthers: a read that asks two replicas and
// finds them disagreeing repairs, in the background, the third it never
// asked too.
func TestReadRepairAsyncReachesTheOthers(t *testing.T) {
	c := testcluster.Start(t, 3, func(_ int, cfg *node.Config) { cfg.Coordinator.ReadRepair = cluster.RepairAsync })
	cl := testcluster.NewClient(t)
	p := placementOf(t, c)
	key := findKey(t, p, "async", 0, 1, 2) // node 0 reads itself and node 1
	stale := record.Record{Version: versionAt(time.Now().Add(-time.Second), 0, 1), Value: []byte("stale")}
	fresh := record.Record{Version: versionAt(time.Now(), 0, 0), Value: []byte("fresh")}
	require.Equal(t, http.StatusCreated, internalPut(t, cl, c.URL(0), key, fresh, ""))
	require.Equal(t, http.StatusCreated, internalPut(t, cl, c.URL(1), key, stale, ""))
	expectValue(t, cl, c.URL(0), key, 2, 3, "fresh")
	for _, i := range []int{1, 2} {
		testcluster.Eventually(t, 10*time.Second, "background repair", func() bool {
			_, rec := internalGet(t, cl, c.URL(i), key, "")
			return string(rec.Value) == "fresh"
		})
	}
}

// TestReadRepairOff: with --read-repair=off the disagreement stays (and a
// quorum read still returns the newest version among its answers).
func TestReadRepairOff(t *testing.T) {
	c := testcluster.Start(t, 3, func(_ int, cfg *node.Config) { cfg.Coordinator.ReadRepair = cluster.RepairOff })
	cl := testcluster.NewClient(t)
	key, lone := flipFlop(t, c, cl)
	expectValue(t, cl, c.URL(lone), key, 3, 3, "W2")
	_, rec := internalGet(t, cl, c.URL(lone), key, "")
	require.Equal(t, "W1", string(rec.Value), "nothing repaired the lone replica")
}

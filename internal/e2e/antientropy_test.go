package e2e_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/cluster"
	"github.com/dhtkv/dhtkv/internal/history"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// aeOnly turns the other mechanisms off, so that only anti-entropy can
// bring a replica up to date: no read repair, and no hint is ever kept
// (a byte cap below any hint's size).
func aeOnly(interval time.Duration) testcluster.Option {
	return func(_ int, cfg *node.Config) {
		cfg.Coordinator.ReadRepair = cluster.RepairOff
		cfg.Handoff.MaxBytes = 1
		cfg.AntiEntropy.Interval = interval
	}
}

// TestAntiEntropyRepairsBothWays: node 2 misses a set of writes, then node
// 0 misses another set and some deletes; one repair asked of node 2 pulls
// what it missed and pushes what node 0 missed, tombstones included, and
// leaves every replica of every key identical. A second repair finds
// nothing to do.
func TestAntiEntropyRepairsBothWays(t *testing.T) {
	c := testcluster.Start(t, 3, aeOnly(0))
	cl := testcluster.NewClient(t)
	const n = 300
	var keys []string
	c.StopNode(2)
	for i := range n {
		k := fmt.Sprintf("a%d", i)
		keys = append(keys, k)
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(i%2), k, []byte("A"+k), 2, 3))
	}
	awaitNoReplicaCalls(t, c, 0, 1)
	c.StartNode(2)
	c.StopNode(0)
	for i := range n {
		k := fmt.Sprintf("b%d", i)
		keys = append(keys, k)
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(1+i%2), k, []byte("B"+k), 2, 3))
	}
	for i := 0; i < n; i += 3 {
		require.Equal(t, http.StatusAccepted, cl.Delete(t, c.URL(1), fmt.Sprintf("a%d", i), 2, 3))
	}
	awaitNoReplicaCalls(t, c, 1, 2)
	c.StartNode(0)
	before := replicaDumps(t, c, cl, keys...)
	require.NotEmpty(t, history.CheckReplicas(before), "the replicas differ before the repair")

	stats := c.Repair(t, 2)
	require.Len(t, stats, 2)
	var pulled, pushed int
	for _, st := range stats {
		require.Empty(t, st.Error, "exchange with %s", st.Peer)
		require.Zero(t, st.Failed)
		pulled += st.Pulled
		pushed += st.Pushed
	}
	// Node 2 missed the a keys (from node 0 or 1, whichever it compared
	// with first; the other then has nothing more), but not the third of
	// them it took the delete of; node 0 missed the b keys and the deletes.
	require.Equal(t, n-n/3, pulled, "a keys pulled by node 2")
	require.Equal(t, n+n/3, pushed, "b keys and deletes pushed to node 0")
	for _, v := range history.CheckReplicas(replicaDumps(t, c, cl, keys...)) {
		t.Error(v)
	}
	for _, k := range []string{"a0", "a1", "b5"} {
		code, _ := internalGet(t, cl, c.URL(0), k, "")
		require.Equal(t, http.StatusOK, code, "%s: a tombstone or a value, on node 0", k)
	}
	for i := range 3 {
		for _, st := range c.Repair(t, i) {
			require.Zero(t, st.PartitionsDiffering, "node %d with %s after the repair", i, st.Peer)
		}
	}
	require.Equal(t, float64(n-n/3), c.Metric(t, 2, "dhtkv_antientropy_keys_total", "direction", "pulled"))
	require.Equal(t, 1.0, c.Metric(t, 2, "dhtkv_antientropy_exchange_progress_ratio", "peer", c.URL(0)))
}

// TestAntiEntropyPullsDoNotFillTheCache: the records a repair pulls are
// read by the peer that holds them without keeping them in its read
// cache (a background batch): no client read anything, so after writes
// (which only invalidate) and a repair that pulled every key, every
// node's read cache is still empty.
func TestAntiEntropyPullsDoNotFillTheCache(t *testing.T) {
	c := testcluster.Start(t, 3, aeOnly(0))
	cl := testcluster.NewClient(t)
	const n = 200
	c.StopNode(2)
	for i := range n {
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(i%2), fmt.Sprintf("p%d", i), []byte("v"), 2, 3))
	}
	awaitNoReplicaCalls(t, c, 0, 1)
	c.StartNode(2)
	pulled := 0
	for _, st := range c.Repair(t, 2) {
		require.Empty(t, st.Error, "exchange with %s", st.Peer)
		pulled += st.Pulled
	}
	require.Equal(t, n, pulled, "node 2 pulled every key")
	for i := range 3 {
		require.Zero(t, c.Metric(t, i, "dhtkv_cache_bytes"), "node %d's read cache", i)
	}
	code, _ := cl.Get(t, c.URL(0), "p1", 1, 1)
	require.Equal(t, http.StatusOK, code)
	filled := 0.0
	for i := range 3 {
		filled += c.Metric(t, i, "dhtkv_cache_bytes")
	}
	require.Positive(t, filled, "a client's read fills a cache")
}

// TestAntiEntropyScheduled: with a short interval and no request to
// repair, a node that missed writes while it was down converges on its
// own, with no read and no hint.
func TestAntiEntropyScheduled(t *testing.T) {
	c := testcluster.Start(t, 3, aeOnly(0))
	cl := testcluster.NewClient(t)
	c.StopNode(2)
	var keys []string
	for i := range 100 {
		k := fmt.Sprintf("s%d", i)
		keys = append(keys, k)
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(i%2), k, []byte(k), 2, 3))
	}
	for i := range 3 { // schedule from now on: the first exchange within the interval
		c.Reconfigure(i, func(cfg *node.Config) { cfg.AntiEntropy.Interval = 100 * time.Millisecond })
	}
	c.StopNode(0)
	c.StartNode(0)
	c.StartNode(2)
	testcluster.Eventually(t, 20*time.Second, "node 2 holds every key", func() bool {
		return len(replicaDumps(t, c, cl, keys...)[c.URL(2)]) == len(keys)
	})
	for _, v := range history.CheckReplicas(replicaDumps(t, c, cl, keys...)) {
		t.Error(v)
	}
}

// awaitNoReplicaCalls waits until the coordinators have no replica call
// under way: a write's call to a stopped node ends at its deadline, and
// one still under way when the node comes back would land there, so that
// the node held what a repair is meant to bring.
func awaitNoReplicaCalls(t *testing.T, c *testcluster.Cluster, coordinators ...int) {
	t.Helper()
	for _, i := range coordinators {
		testcluster.Eventually(t, 10*time.Second, "no replica call under way", func() bool {
			return testcluster.Metric(t, c.Node(i).Registry(), "dhtkv_coordinator_replica_calls_in_flight") == 0
		})
	}
}

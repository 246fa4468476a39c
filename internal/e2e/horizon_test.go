package e2e_test

import (
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/placement"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// A garbage-collection horizon is a partition's, and spares keys that
// hold an older record (store's gc.go). Two histories that one horizon
// for the whole store got wrong; both need more nodes than replicas, so
// that a node collects in partitions its peer of another partition does
// not share (TestGCNoZombie has as many nodes as replicas).

// horizonCluster is 4 in-memory nodes of the given replication factor,
// with a grace of a minute, passes only when a test asks
// (CollectGarbage), and every node's map placement.
func horizonCluster(t *testing.T, replicas int, opts ...testcluster.Option) (*testcluster.InMemory, *placement.Placement) {
	t.Helper()
	c := testcluster.StartInMemory(t, 4, append([]testcluster.Option{func(_ int, cfg *node.Config) {
		cfg.Replicas = replicas
		cfg.GC.Grace = time.Minute
		cfg.GC.Interval = time.Hour
		cfg.Handoff.Window = 30 * time.Second
		cfg.MaxClockSkew = 500 * time.Millisecond
	}}, opts...)...)
	c.AwaitFormed(time.Minute)
	m, _ := c.Node(0).Members().Map()
	return c, placement.New(m.Nodes)
}

// TestGCHorizonTakesAMissedTombstone: node 1 misses the delete of z
// (cut off from node 0, z's other replica, and no hint: the hint store
// holds nothing); past the grace it collects y, a key it shares with node
// 2 only. Healed, node 0's exchange pushes z's tombstone to node 1. With
// one horizon for the whole store, node 1 refused it as "holding
// something newer", node 0 counted it delivered and collected its
// tombstone, and z read "old" again through every node, for good.
func TestGCHorizonTakesAMissedTombstone(t *testing.T) {
	testcluster.InBubble(t, func(t *testing.T) {
		c, p := horizonCluster(t, 2, func(_ int, cfg *node.Config) {
			cfg.Handoff.MaxBytes = 1 // no hints: only anti-entropy brings the delete
		})
		z := findKey(t, p, "z", 0, 1)
		y := findKey(t, p, "y", 1, 2)
		cl := c.Client()
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), z, []byte("old"), 2, 2))
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(1), y, []byte("v"), 2, 2))
		require.Equal(t, http.StatusAccepted, cl.Delete(t, c.URL(1), y, 2, 2))
		c.Cut(0, 1)
		require.Equal(t, http.StatusAccepted, cl.Delete(t, c.URL(0), z, 1, 2)) // node 1 misses it

		time.Sleep(70 * time.Second) // the behaviour under test: past both deletes' grace
		for _, st := range c.Repair(1) {
			if st.Peer != c.URL(0) {
				require.Empty(t, st.Error, "node 1 with %s", st.Peer)
			}
		}
		require.Equal(t, 1, c.Node(1).CollectGarbage(), "node 1 collects y, in a partition it shares with node 2 only")

		c.Heal()
		time.Sleep(time.Millisecond) // an exchange counts for the records that arrived before it started
		for _, i := range []int{0, 1} {
			for _, st := range c.Repair(i) {
				require.Empty(t, st.Error, "node %d with %s", i, st.Peer)
			}
		}
		time.Sleep(time.Millisecond)
		c.Node(0).CollectGarbage()
		for i := range 4 {
			code, body := cl.Get(t, c.URL(i), z, 2, 2)
			require.Equal(t, http.StatusNotFound, code, "z through node %d: %q", i, body)
		}
	})
}

// TestGCHorizonSparesGainedPartitions: node 3, which has collected a
// delete of its own partitions, gains k's partition when node 0 is
// decommissioned, and must take k's live value, written before its
// horizon. With one horizon for the whole store, the copy's record was
// refused: k ended on two replicas of three, and anti-entropy never
// repaired it (the refusal reads as "holds newer").
func TestGCHorizonSparesGainedPartitions(t *testing.T) {
	testcluster.InBubble(t, func(t *testing.T) {
		c, p := horizonCluster(t, 3)
		k := findKeySet(t, p, "k", 0, 1, 2)
		y := findKeySet(t, p, "y", 1, 2, 3)
		cl := c.Client()
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), k, []byte("live"), 3, 3))
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(1), y, []byte("v"), 3, 3))
		require.Equal(t, http.StatusAccepted, cl.Delete(t, c.URL(1), y, 3, 3))
		time.Sleep(70 * time.Second) // the behaviour under test: k is older than node 3's horizon to come
		for _, st := range c.Repair(3) {
			require.Empty(t, st.Error, "node 3 with %s", st.Peer)
		}
		require.Equal(t, 1, c.Node(3).CollectGarbage())

		require.Equal(t, http.StatusAccepted, c.Decommission(1, 0))
		c.AwaitLeft(0, 5*time.Minute)
		c.AwaitStable(5 * time.Minute)
		for i := 1; i < 4; i++ {
			held := false
			for _, e := range c.Replica(i) {
				held = held || e.Key == k && e.Value == "live"
			}
			require.True(t, held, "node %d holds k", i)
		}
	})
}

// TestGCHorizonResetWhenAPartitionLeaves: node 3 collects a delete in
// each of 40 partitions it holds, beside a live value of each, older than
// the collection's horizon; then node 4 joins, taking some of those
// partitions from node 3, which drops them, and is decommissioned, giving
// them back. Every value must be on each of its three replicas again. A
// horizon kept while the partition was away refused the copy's record of
// every value node 3 had dropped.
func TestGCHorizonResetWhenAPartitionLeaves(t *testing.T) {
	testcluster.InBubble(t, func(t *testing.T) {
		c, p := horizonCluster(t, 3)
		cl := c.Client()
		var values []string
		for i := 0; len(values) < 40; i++ {
			k := fmt.Sprintf("k%d", i)
			if !slices.Contains(replicasOf(p, k, 3), 3) {
				continue
			}
			part, _ := partition.Of([]byte(k))
			gone := k + "-gone"
			for j := 0; ; j++ {
				if q, _ := partition.Of([]byte(gone)); q == part {
					break
				}
				gone = fmt.Sprintf("%s-gone%d", k, j)
			}
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), k, []byte("live"), 3, 3))
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), gone, []byte("v"), 3, 3))
			require.Equal(t, http.StatusAccepted, cl.Delete(t, c.URL(0), gone, 3, 3))
			values = append(values, k)
		}
		time.Sleep(70 * time.Second) // the behaviour under test: the values are older than node 3's horizons to come
		for _, st := range c.Repair(3) {
			require.Empty(t, st.Error, "node 3 with %s", st.Peer)
		}
		require.Equal(t, 40, c.Node(3).CollectGarbage())

		j := c.AddNode(0)
		require.Equal(t, http.StatusAccepted, c.Join(1, j))
		c.StartNode(j)
		joined := c.AwaitStable(5 * time.Minute)
		pj, away := placement.New(joined.Nodes), 0
		for _, k := range values {
			if !slices.ContainsFunc(pj.Replicas([]byte(k), 3, nil), func(id int) bool { return joined.Node(id).URL == c.URL(3) }) {
				away++
			}
		}
		require.Positive(t, away, "the join took some of the partitions from node 3")
		require.Equal(t, http.StatusAccepted, c.Decommission(1, j))
		c.AwaitLeft(j, 5*time.Minute)
		c.AwaitStable(5 * time.Minute)
		held := map[string]bool{}
		for _, e := range c.Replica(3) {
			held[e.Key] = e.Value == "live"
		}
		for _, k := range values {
			require.True(t, held[k], "node 3 holds %s again (%d of its partitions went away and came back)", k, away)
		}
	})
}

// TestGCHorizonAboveLastExchangeKeepsMissedWrites: a horizon may only
// claim what the exchanges a collection relied on vouched for. Node 1
// and node 2 replicate one partition; node 1's last exchange with node 2
// (clean) is older than the grace when it collects y's tombstone, and w,
// a write of another key of that partition made after that exchange,
// is on node 2 only (from=1: anti-entropy brings it to node 1). The
// collection raised the partition's horizon to now - grace, above w's
// version: node 1 then refused w as "below the horizon", both sides
// counted it delivered, and w stayed on one replica for good (lost with
// node 2's disk).
func TestGCHorizonAboveLastExchangeKeepsMissedWrites(t *testing.T) {
	testcluster.InBubble(t, func(t *testing.T) {
		c, p := horizonCluster(t, 2)
		w := findKey(t, p, "w", 2, 1)
		part, _ := partition.Of([]byte(w))
		y := ""
		for i := 0; ; i++ {
			y = fmt.Sprintf("y-%d", i)
			if q, _ := partition.Of([]byte(y)); q == part {
				break
			}
		}
		cl := c.Client()
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(1), y, []byte("v"), 2, 2))
		require.Equal(t, http.StatusAccepted, cl.Delete(t, c.URL(1), y, 2, 2))
		// Older than the exchange below by more than the collector's lag
		// (a write may reach a peer after its exchange with a version from
		// before it: --max-clock-skew + --replica-timeout + 1 s).
		time.Sleep(5 * time.Second)
		for _, st := range c.Repair(1) { // node 1's last exchanges: the tombstone is everywhere
			require.Empty(t, st.Error, "node 1 with %s", st.Peer)
		}
		time.Sleep(time.Second)
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(2), w, []byte("written"), 1, 1)) // on node 2 only

		time.Sleep(70 * time.Second) // past the grace of y's delete, and of w's write
		require.Equal(t, 1, c.Node(1).CollectGarbage(), "node 1 collects y")

		for _, i := range []int{1, 2} {
			for _, st := range c.Repair(i) {
				require.Empty(t, st.Error, "node %d with %s", i, st.Peer)
			}
		}
		code, rec := internalGet(t, cl, c.URL(1), w, "")
		require.Equal(t, http.StatusOK, code, "anti-entropy brought w to node 1, its other replica")
		require.Equal(t, "written", string(rec.Value))

		// What it costs: node 2's disk lost and rebuilt from node 1.
		c.StopNode(2)
		c.WipeNode(2)
		c.StartNode(2)
		c.Await(time.Minute, "node 2 rebuilt", func() (bool, string) {
			return !c.Node(2).Rebuilding(), "rebuilding"
		})
		code, body := cl.Get(t, c.URL(0), w, 2, 2)
		require.Equal(t, http.StatusOK, code, "w through node 0: %q", body)
	})
}

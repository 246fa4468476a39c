package e2e_test

import (
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/placement"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// TestRegainedPartitionDropsItsLeftovers: node 3 gives partitions away in
// a join, and its paced drop of them (a record a second here, thousands
// of records behind) is still under way when some of the keys it gave
// away are deleted, past the grace collected everywhere, and a
// decommission gives the partitions back to it; the new change cuts the
// drop short. Node 3 still held those keys' values, which the copy had
// nothing to beat and no cleanup dropped afterwards (the partitions are
// its own again): the deletes were undone for good, through any node.
// Now node 3 drops what it holds of the partitions it gains before it
// copies them.
func TestRegainedPartitionDropsItsLeftovers(t *testing.T) {
	testcluster.InBubble(t, func(t *testing.T) {
		c, p := horizonCluster(t, 3, func(i int, cfg *node.Config) {
			if i == 3 {
				cfg.Membership.DropRate = 1 // the behaviour under test: a drop that lasts
			}
		})
		cl := c.Client()
		var keys []string
		for i := 0; len(keys) < 40; i++ {
			k := fmt.Sprintf("k%d", i)
			if !slices.Contains(replicasOf(p, k, 3), 3) {
				continue
			}
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), k, []byte("live"), 3, 3))
			keys = append(keys, k)
		}
		// Thousands of records on node 3 alone, so that its drop has not
		// reached the keys when the next change begins.
		_, rec := internalGet(t, cl, c.URL(3), keys[0], "")
		writeFillers(t, cl, c.URL(3), rec.Version)

		j := c.AddNode(0)
		require.Equal(t, http.StatusAccepted, c.Join(1, j))
		c.StartNode(j)
		joined := c.AwaitNoChange(5 * time.Minute)
		pj := placement.New(joined.Nodes)
		var gone []string
		for _, k := range keys {
			if slices.ContainsFunc(pj.Replicas([]byte(k), 3, nil), func(id int) bool { return joined.Node(id).URL == c.URL(3) }) {
				continue
			}
			if code, _ := internalGet(t, cl, c.URL(3), k, ""); code != http.StatusOK {
				continue // dropped already
			}
			require.Equal(t, http.StatusAccepted, cl.Delete(t, c.URL(0), k, 3, 3))
			gone = append(gone, k)
		}
		require.NotEmpty(t, gone, "keys node 3 gave away and has not dropped yet")
		time.Sleep(70 * time.Second) // the behaviour under test: past the deletes' grace
		for _, i := range []int{0, 1, 2, j} {
			c.Repair(i)
		}
		time.Sleep(time.Millisecond) // an exchange counts for the records that arrived before it started
		collected := 0
		for _, i := range []int{0, 1, 2, j} {
			collected += c.Node(i).CollectGarbage()
		}
		require.Equal(t, 3*len(gone), collected, "every replica collected every tombstone")

		require.Equal(t, http.StatusAccepted, c.Decommission(1, j))
		c.AwaitLeft(j, 5*time.Minute)
		c.AwaitNoChange(5 * time.Minute)
		for _, k := range gone {
			for i := range 3 {
				code, body := cl.Get(t, c.URL(i), k, 3, 3)
				require.Equal(t, http.StatusNotFound, code, "%s through node %d: %q", k, i, body)
			}
		}
	})
}

// TestChangeStopsTheLastOnesCleanup: node 3's paced drop of what a join
// took from it is still under way when the next change (a decommission,
// which gives partitions back to it) begins. The drop stops there: by the
// old map it would go on dropping a partition the new change gives back,
// the writes of its write-both stage with it. Node 0 is stopped so that
// the change waits in write-both; node 3 drops nothing meanwhile, and
// drops again once the change is over (its cleanup marker stays).
func TestChangeStopsTheLastOnesCleanup(t *testing.T) {
	testcluster.InBubble(t, func(t *testing.T) {
		c, _ := horizonCluster(t, 3, func(i int, cfg *node.Config) {
			if i == 3 {
				cfg.Membership.DropRate = 1 // the behaviour under test: a drop that lasts
			}
		})
		cl := c.Client()
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), "k", []byte("v"), 3, 3))
		_, rec := internalGet(t, cl, c.URL(0), "k", "")
		// Thousands of records on node 3, so that its drop lasts: more
		// than the pace's burst (a chunk) of them in partitions it gives
		// away.
		writeFillers(t, cl, c.URL(3), rec.Version)
		dropped := func() float64 {
			return testcluster.Metric(t, c.Node(3).Registry(), "dhtkv_membership_dropped_records_total")
		}

		j := c.AddNode(0)
		require.Equal(t, http.StatusAccepted, c.Join(1, j))
		c.StartNode(j)
		c.AwaitNoChange(5 * time.Minute)
		c.Await(time.Minute, "node 3 drops what the join took", func() (bool, string) {
			return dropped() > 0, "nothing dropped"
		})
		pending, err := c.Node(3).Store().CleanupPending()
		require.NoError(t, err)
		require.True(t, pending, "node 3's drop is still under way")

		c.StopNode(0)
		require.Equal(t, http.StatusAccepted, c.Decommission(1, j))
		c.Await(time.Minute, "node 3 installs the decommission's first map", func() (bool, string) {
			m, _ := c.Node(3).Members().Map()
			return m.Change != nil, m.String()
		})
		before := dropped()
		time.Sleep(30 * time.Second) // the behaviour under test: the change waits for node 0
		require.Equal(t, before, dropped(), "node 3 went on dropping by the old map after the change began")

		c.StartNode(0)
		c.AwaitLeft(j, 5*time.Minute)
		c.AwaitNoChange(5 * time.Minute)
		c.Await(5*time.Minute, "node 3's drop goes on once the change is over", func() (bool, string) {
			return dropped() > before, fmt.Sprint(dropped())
		})
	})
}

// writeFillers writes 5,000 records of version v straight into the local
// replica of the node at base (internal batches), so that a paced drop of
// what it gives away lasts.
func writeFillers(t *testing.T, cl *testcluster.Client, base string, v uint64) {
	t.Helper()
	for b := range 100 {
		var body []byte
		for i := range 50 {
			r := record.Record{Version: v, Value: []byte("f")}
			body = rpc.AppendBatchOp(body, rpc.OpWrite, fmt.Appendf(nil, "filler%d-%d", b, i), r.Encode())
		}
		code, out := internalBatch(t, cl, base, body, "")
		require.Equal(t, http.StatusOK, code, "%s", out)
	}
}

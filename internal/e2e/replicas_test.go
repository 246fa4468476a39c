package e2e_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/partcopy"
	"github.com/dhtkv/dhtkv/internal/placement"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// TestMembershipReplicasChangeUnderLoad: a 4-node cluster at replication
// factor 2, holding bulk records and under a steady load of writes and
// reads at the nodes' default ack and from (recorded into a history), is
// changed to factor 3 and then back to 2 through POST /cluster/replicas.
// While it grows, a write may ask ack 3 (all of each set), and a read's
// ack above the factor of the set it reads is refused with a 400 that
// says why. Once it has grown, every node records factor 3 and every
// key is on its three replicas before any anti-entropy (the stream stage
// copied each partition to its third-ranked node); once it has shrunk,
// every node records factor 2, no node holds a key it is not one of the
// two replicas of, and the history has no lost acknowledged write, no
// stale read and every key reads back its last acknowledged write
// (faultRun.check).
func TestMembershipReplicasChangeUnderLoad(t *testing.T) {
	longFault(t) // make test: membership's TestSetReplicasThroughItsStages and TestLoggedReplicas, TestReadyDuringAGrowthNeedsEveryOldReplica
	testcluster.InBubble(t, func(t *testing.T) {
		c := testcluster.StartInMemory(t, 4, func(_ int, cfg *node.Config) {
			cfg.Replicas = 2
			cfg.Move.Rate = partcopy.MinRate // the stream stage lasts while the load runs
			cfg.Handoff.Interval = 200 * time.Millisecond
		})
		c.AwaitFormed(time.Minute)
		seedBulk(t, c)
		l, _ := newMemLoad(t, c)
		l.defaults = true
		all := []int{0, 1, 2, 3}
		r := &faultRun{t: t, c: c, load: l, members: all}
		l.setVia(all...)
		l.preload(t)
		l.start()
		time.Sleep(time.Second)

		change := func(via, n int) *clustermap.Map {
			code, body := c.Client().Do(t, http.MethodPost, fmt.Sprintf("%s/cluster/replicas?n=%d", c.AdminURL(via), n), nil)
			require.Equal(t, http.StatusAccepted, code, "%s", body)
			m := c.AwaitStable(2 * time.Minute)
			for _, i := range all {
				nm, _ := c.Node(i).Members().Map()
				require.Equal(t, n, nm.Replicas, "node %d records the new factor", i)
				require.Equal(t, m.Epoch, nm.Epoch)
			}
			return m
		}

		// Grow to 3, asked of node 1. While the change is under way, an
		// ack of 3 cannot be had from the old set of 2: refused, clearly.
		code, body := c.Client().Do(t, http.MethodPost, c.AdminURL(1)+"/cluster/replicas?n=3", nil)
		require.Equal(t, http.StatusAccepted, code, "%s", body)
		// The driver hands the change's first map to the others; a node
		// that has not installed it yet still bounds ack by factor 2 alone.
		c.Await(time.Minute, "the change installed everywhere", func() (bool, string) {
			for _, i := range all {
				if m, _ := c.Node(i).Members().Map(); m.Change == nil {
					return false, fmt.Sprintf("node %d at %s", i, m)
				}
			}
			return true, ""
		})
		// A write at ack 3 takes both old replicas and the three new ones
		// (a set smaller than ack gives all it has). A read's ack is
		// bounded by the set it reads: until read-new, the old set of 2
		// (the stream stage lasts seconds of the bubble's clock; this
		// takes none).
		code, body = c.Client().Do(t, http.MethodPut, testcluster.EntityURL(c.URL(2), "not-in-the-load", 3, 0), []byte("x"))
		require.Equal(t, http.StatusCreated, code, "%s", body)
		m0, _ := c.Node(0).Members().Map()
		require.NotEqual(t, clustermap.ReadNew, m0.Change.Stage, "the stream stage outlasts a request")
		code, body = c.Client().Do(t, http.MethodGet, testcluster.EntityURL(c.URL(0), "m0-0", 3, 3), nil)
		require.Equal(t, http.StatusBadRequest, code)
		require.Contains(t, string(body), "ack=3 exceeds 2: the replication factor is changing between 2 and 3, and at this stage of the change a read asks the set of 2")
		code, body = c.Client().Do(t, http.MethodPost, c.AdminURL(0)+"/cluster/replicas?n=1", nil)
		require.Equal(t, http.StatusConflict, code, "one change at a time: %s", body)
		grown := c.AwaitStable(2 * time.Minute)
		require.Equal(t, 3, grown.Replicas)
		for _, i := range all {
			nm, _ := c.Node(i).Members().Map()
			require.Equal(t, 3, nm.Replicas, "node %d records the new factor", i)
		}
		// Before any anti-entropy: each key on its three replicas.
		p := placement.New(grown.Nodes)
		keys := l.allKeys()
		for k := range bulkRecords {
			keys = append(keys, fmt.Sprintf("bulk%04d", k))
		}
		held := map[string][]int{}
		for _, i := range all {
			for _, e := range c.Replica(i) {
				held[e.Key] = append(held[e.Key], grown.ByURL(c.URL(i)).ID)
			}
		}
		var missing []string
		for _, key := range keys {
			want := slices.Sorted(slices.Values(p.Replicas([]byte(key), 3, nil)))
			if got := slices.Sorted(slices.Values(held[key])); !slices.Equal(want, got) {
				missing = append(missing, fmt.Sprintf("%s on %v, replicas %v", key, got, want))
			}
		}
		require.Empty(t, missing, "after growing to 3, before anti-entropy: %s", strings.Join(missing, "; "))
		time.Sleep(time.Second) // load at factor 3

		// Back to 2, asked of node 3: the third-ranked replicas drop
		// their partitions at the end.
		m := change(3, 2)
		require.Equal(t, 2, m.Replicas)
		strays(t, c, m, all, "at the change's end")
		time.Sleep(time.Second) // load on the final map
		l.end()
		r.check(m)
	})
}

// TestShrinkKeepsAWriteItsKeptReplicaMissed: at factor 3, a write is
// acknowledged by two replicas (ack=2, the default majority) while the
// key's first-ranked replica, node 0, is down, and the hint for node 0
// expires (--hint-window) before anti-entropy ran. The factor is then
// lowered to 1: the new set of the key is node 0 alone, which gains
// nothing, so nothing is copied; nodes 1 and 2 drop the partition at
// the change's end, and with it the only copies of an acknowledged
// write.
func TestShrinkKeepsAWriteItsKeptReplicaMissed(t *testing.T) {
	testcluster.InBubble(t, func(t *testing.T) {
		c := testcluster.StartInMemory(t, 3, func(_ int, cfg *node.Config) {
			cfg.Replicas = 3
			cfg.Handoff.Window = 2 * time.Second
			cfg.Handoff.Interval = 200 * time.Millisecond
		})
		c.AwaitFormed(time.Minute)
		m, _ := c.Node(0).Members().Map()
		p := placement.New(m.Nodes)
		cl := c.Client()
		var keys []string
		for i := 0; len(keys) < 20; i++ {
			k := fmt.Sprintf("k%d", i)
			if replicasOf(p, k, 1)[0] == 0 {
				keys = append(keys, k)
			}
		}

		c.StopNode(0)
		for _, k := range keys {
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(1), k, []byte("v"), 2, 3))
		}
		time.Sleep(10 * time.Second) // past the hints' window: they are dropped
		c.StartNode(0)
		c.AwaitStable(time.Minute)
		require.Empty(t, c.Hints(1)[0], "node 1's hints for node 0 expired")
		require.Empty(t, c.Hints(2)[0], "node 2's hints for node 0 expired")

		code, body := cl.Do(t, http.MethodPost, c.AdminURL(1)+"/cluster/replicas?n=1", nil)
		require.Equal(t, http.StatusAccepted, code, "%s", body)
		// After the change: the admin call answers once the log took it,
		// maybe before any member installed it (AwaitNoChange could find
		// them all still at the map before).
		c.AwaitStableAfter(m.Epoch, 2*time.Minute)

		var lost []string
		for _, k := range keys {
			if code, _ := cl.Get(t, c.URL(0), k, 1, 1); code != http.StatusOK {
				lost = append(lost, k)
			}
		}
		require.Empty(t, lost, "%d of %d writes acknowledged by 2 of 3 replicas lost by the shrink to 1", len(lost), len(keys))
	})
}

package e2e_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/placement"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// TestRestartAfterCopyReportedKeepsTheCopy: node 2 gains partitions in a
// decommission of node 0 (one replica), copies them, and reports the
// copy to the map's log; then it restarts while the change is still in
// its stream stage (node 1, the other gainer, still copies), and copies
// again. What it drops before that copy is only what it held from before
// the change began (membership's dropLeftovers): were it the copy the log
// counted, the log would move to read-new once node 1 is done, node 2's
// new copy would stop at the newer map, and the change would end with
// node 2 holding part of its partitions, their only other replica gone.
// Found by a review: 221-269 of 800 acknowledged writes were lost.
func TestRestartAfterCopyReportedKeepsTheCopy(t *testing.T) {
	testcluster.InBubble(t, func(t *testing.T) {
		c := testcluster.StartInMemory(t, 3, func(i int, cfg *node.Config) {
			cfg.Replicas = 1
			if i == 1 {
				cfg.Move.Rate = 2 << 20 // node 1's copy lasts a couple of seconds
			}
		})
		c.AwaitFormed(time.Minute)
		m, _ := c.Node(0).Members().Map()
		p := placement.New(m.Nodes)
		cl := c.Client()
		val := make([]byte, 8<<10)
		var keys []string
		for i := 0; len(keys) < 800; i++ {
			k := fmt.Sprintf("k%d", i)
			if replicasOf(p, k, 1)[0] != 0 {
				continue
			}
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), k, val, 1, 1))
			keys = append(keys, k)
		}

		require.Equal(t, http.StatusAccepted, c.Decommission(1, 0))
		// Node 2 copied its share and reported it; node 1 still copies.
		var stream uint64
		c.Await(time.Minute, "node 2 copied its gained partitions", func() (bool, string) {
			mm, _ := c.Node(2).Members().Map()
			if mm.Change == nil || mm.Change.Stage != clustermap.Stream {
				return false, mm.String()
			}
			stream = mm.Epoch
			return c.Node(2).Members().Moved() >= mm.Epoch, "not moved"
		})
		c.Await(time.Minute, "the log has node 2's report", func() (bool, string) {
			st := c.Node(0).MapLog().State()
			return st.Copied[2] >= stream, fmt.Sprint(st.Copied)
		})
		mm, _ := c.Node(1).Members().Map()
		require.Equal(t, stream, mm.Epoch, "node 1 still copies: the change is in its stream stage")

		// A restart (here with a slower copy, as a larger data set's).
		c.StopNode(2)
		c.Reconfigure(2, func(cfg *node.Config) { cfg.Move.Rate = 1 << 20 })
		c.StartNode(2)

		c.AwaitLeft(0, 5*time.Minute)
		c.AwaitNoChange(5 * time.Minute)
		var lost []string
		for _, k := range keys {
			if code, _ := cl.Get(t, c.URL(1), k, 1, 1); code != http.StatusOK {
				lost = append(lost, k)
			}
		}
		require.Empty(t, lost, "%d of %d acknowledged writes lost", len(lost), len(keys))
	})
}

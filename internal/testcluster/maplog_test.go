package testcluster

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/membership"
	"github.com/dhtkv/dhtkv/internal/node"
)

// onLog gives a node's log raft's timeouts short enough for tests.
func onLog(_ int, cfg *node.Config) {
	cfg.MapLog.HeartbeatTimeout = 200 * time.Millisecond
	cfg.MapLog.ElectionTimeout = 200 * time.Millisecond
	cfg.MapLog.LeaderLeaseTimeout = 100 * time.Millisecond
	cfg.MapLog.RebalanceInterval = 100 * time.Millisecond
}

// awaitLogMaps waits until every running node's replica of the log holds
// a map of epoch at least epoch, and the node installed it.
func (c *InMemory) awaitLogMaps(epoch uint64) {
	c.t.Helper()
	c.Await(time.Minute, "the log's map on every node", func() (bool, string) {
		for i := range c.Size() {
			n := c.Node(i)
			if n == nil {
				continue
			}
			lm := n.MapLog().Map()
			if lm == nil || lm.Epoch < epoch {
				return false, fmt.Sprintf("node %d's log holds %v", i, lm)
			}
			if m, _ := n.Members().Map(); m.Epoch < lm.Epoch {
				return false, fmt.Sprintf("node %d installed %s, its log holds %s", i, m, lm)
			}
		}
		return true, ""
	})
}

// A cluster on the map's log, end to end over the nodes' own ports (the
// log's traffic upgraded from an internal HTTP request, carried by the
// in-memory links): the seeds bootstrap and seed the log from --cluster; a
// node joins (its id given by the log) and one is decommissioned, each
// change completed by the members' acknowledgements; a member restarted
// resumes from its persisted log.
func TestInMemoryOnLog(t *testing.T) {
	c := StartInMemory(t, 3, onLog)
	c.awaitLogMaps(1)
	for i := range 3 {
		m, self := c.Node(i).Members().Map()
		require.Equal(t, uint64(1), m.Epoch)
		require.Equal(t, i, self)
	}
	cl := c.Client()
	for k := range 20 {
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), fmt.Sprintf("k%02d", k), []byte("v"), 2, 2))
	}

	j := c.AddNode(0)
	require.Equal(t, http.StatusAccepted, c.Join(1, j))
	c.StartNode(j)
	m := c.AwaitStable(time.Minute)
	require.Len(t, m.Nodes, 4)
	require.NotNil(t, m.ByURL(c.URL(j)))
	require.Equal(t, 3, m.ByURL(c.URL(j)).ID, "the log's next id")
	c.awaitLogMaps(m.Epoch)
	c.Await(time.Minute, "the joiner in the log's group", func() (bool, string) {
		conf, err := c.Node(0).MapLog().Configuration()
		if err != nil {
			return false, err.Error()
		}
		return len(conf) == 4, fmt.Sprint(conf)
	})

	require.Equal(t, http.StatusAccepted, c.Decommission(j, 1))
	c.AwaitLeft(1, time.Minute)
	m = c.AwaitStable(time.Minute)
	require.Len(t, m.Nodes, 3)
	require.Nil(t, m.Node(1))
	for k := range 20 {
		code, _ := cl.Get(t, c.URL(j), fmt.Sprintf("k%02d", k), 2, 2)
		require.Equal(t, http.StatusOK, code, "k%02d after the changes", k)
	}

	// A restart resumes from the persisted log.
	c.StopNode(0)
	c.StartNode(0)
	has, err := c.Node(0).MapLog().HasState()
	require.NoError(t, err)
	require.True(t, has)
	c.awaitLogMaps(m.Epoch)
	got, self := c.Node(0).Members().Map()
	require.Equal(t, m.Epoch, got.Epoch)
	require.Equal(t, 0, self)

}

// A dead voter of the log replaced: node 3 joins, node 0 (a voter) is
// decommissioned so that node 3 is promoted, node 3 dies and a new
// machine takes its identity at another address. The log keeps the
// voter's vote at the new address (Rebalance); under -race this found
// hashicorp/raft's unlocked read of a follower's address in pipelined
// replication (maplog's noPipeline).
func TestInMemoryOnLogReplaceDeadVoter(t *testing.T) {
	c := StartInMemory(t, 3, onLog)
	c.awaitLogMaps(1)
	j := c.AddNode(0)
	require.Equal(t, http.StatusAccepted, c.Join(0, j))
	c.StartNode(j)
	c.AwaitStable(time.Minute)
	require.Equal(t, http.StatusAccepted, c.Decommission(1, 0))
	c.AwaitLeft(0, time.Minute)
	c.AwaitStable(time.Minute)
	c.StopNode(j)
	k := c.AddNode(1)
	code, body := c.Client().Do(t, http.MethodPost, c.AdminURL(1)+"/cluster/replace?node="+c.URL(j)+"&with="+c.URL(k), nil)
	require.Equal(t, http.StatusAccepted, code, "%s", body)
	replaced, err := clustermap.Decode(body)
	require.NoError(t, err)
	c.StartNode(k)
	m := c.AwaitStableAfter(replaced.Epoch-1, time.Minute)
	require.Equal(t, 3, m.ByURL(c.URL(k)).ID, "the dead node's identity")
	c.awaitLogMaps(m.Epoch)
}

// A member removed as dead while it is down (POST /cluster/remove) and
// restarted later with its old data directory does not start: its stored
// map still has it (a decommissioned node's has not: refused from it
// alone), so it asks the members for theirs first, finds itself out, and
// fails with membership.ErrLeft (the binary exits 0 on it), saying why:
// its records may be older than deletes the cluster collected since.
func TestInMemoryOnLogRemovedNodeRestartRefused(t *testing.T) {
	c := StartInMemory(t, 4, onLog, func(_ int, cfg *node.Config) { cfg.Replicas = 3 })
	c.awaitLogMaps(1)
	c.StopNode(3)
	code, body := c.Client().Do(t, http.MethodPost, c.AdminURL(1)+"/cluster/remove?node="+c.URL(3), nil)
	require.Equal(t, http.StatusAccepted, code, "%s", body)
	began, err := clustermap.Decode(body)
	require.NoError(t, err)
	m := c.AwaitStableAfter(began.Epoch, time.Minute)
	require.Nil(t, m.Node(3))
	err = c.startNode(3)
	require.ErrorIs(t, err, membership.ErrLeft)
	require.ErrorContains(t, err, "data directory /node4 belongs to node 3 (http://127.0.0.1:7004), which was removed from the cluster (or decommissioned) while it was down")
	require.Nil(t, c.Node(3), "not running")
}

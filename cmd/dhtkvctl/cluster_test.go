package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// dhtkvctl join, cluster and decommission against a real cluster: the
// join waits through every stage and the new node serves the data; a
// second change while one is refused is exit 1; decommission hands the
// node's data over and the node stops by itself.
func TestMembershipCommands(t *testing.T) {
	c := testcluster.Start(t, 2)
	cl := testcluster.NewClient(t)
	for i := range 50 {
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), fmt.Sprintf("j%d", i), []byte("v"), 2, 2))
	}
	admin := "--admin=" + c.Node(0).AdminAddr()
	for _, s := range []step{
		{name: "no admin", args: []string{"join", "http://127.0.0.1:1"}, code: exitUsage, errHas: "needs --admin"},
		{name: "no URL", args: []string{"join", admin}, code: exitUsage, errHas: "takes 1 arguments"},
		{name: "help", args: []string{"join", "-h"}, outHas: []string{"--admin", "--join", "decommission"}},
		{name: "not a member", args: []string{"decommission", admin, "http://127.0.0.1:1"}, code: exitError, errHas: "not a member"},
		{name: "malformed", args: []string{"decommission", admin, "127.0.0.1:1"}, code: exitBadRequest, errHas: "bad request (400): bad node URL"},
		{name: "abort takes no URL", args: []string{"abort", admin, "http://127.0.0.1:1"}, code: exitUsage, errHas: "takes 0 arguments"},
		{name: "decommission help", args: []string{"decommission", "-h"}, outHas: []string{"--force", "fewer nodes than the replication factor"}},
		{name: "below the factor", args: []string{"decommission", admin, "--no-wait", c.URL(1)}, code: exitError,
			errHas: "would leave 1 nodes, fewer than the replication factor 2"},
		{name: "abort with no change", args: []string{"abort", admin}, code: exitError, errHas: "no change under way"},
	} {
		s.run(t)
	}
	joiner := c.AddNode(t, 0)
	var out, errb bytes.Buffer
	// The new node starts while the command waits: the change needs it.
	started := make(chan struct{})
	go func() {
		defer close(started)
		for { // once the join has begun: before, the node is in no map
			if m, _ := c.Node(0).Members().Map(); m.Change != nil {
				break
			}
			time.Sleep(10 * time.Millisecond) // polling interval
		}
		c.StartNode(joiner)
	}()
	require.Equal(t, exitOK, run([]string{"join", admin, c.URL(joiner)}, nil, &out, &errb), errb.String())
	<-started
	// The stages it sees between are printed too; on the map's log they
	// may pass quicker than its polls.
	assert.Contains(t, out.String(), "join begun")
	assert.Contains(t, out.String(), "3 nodes, replication factor 2, no change under way")

	out.Reset()
	require.Equal(t, exitOK, run([]string{"cluster", admin, "--json"}, nil, &out, &errb), errb.String())
	var st client.ClusterStatus
	require.NoError(t, json.Unmarshal(out.Bytes(), &st))
	require.Len(t, st.Map.Nodes, 3)
	require.Nil(t, st.Map.Change)

	out.Reset()
	require.Equal(t, exitOK, run([]string{"decommission", admin, "--no-wait", c.URL(1)}, nil, &out, &errb), errb.String())
	errb.Reset()
	assert.Equal(t, exitError, run([]string{"join", admin, "--no-wait", "http://127.0.0.1:2"}, nil, &out, &errb))
	assert.Contains(t, errb.String(), "another membership change")
	c.AwaitLeft(t, 1, 60*time.Second)
	m := c.AwaitStable(t, 60*time.Second)
	require.Len(t, m.Nodes, 2)
	for i := range 50 {
		code, body := cl.Get(t, c.URL(joiner), fmt.Sprintf("j%d", i), 2, 2)
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, "v", string(body))
	}
}

// dhtkvctl replicas: a bad N is a usage error, a factor the map refuses
// is exit 1 with the reason, and a change from 2 to 3 on a real 3-node
// cluster waits through every stage and leaves every key on all three.
func TestReplicasCommand(t *testing.T) {
	c, cl := startWithKeys(t, "r")
	admin := "--admin=" + c.Node(1).AdminAddr()
	for _, s := range []step{
		{name: "no N", args: []string{"replicas", admin}, code: exitUsage, errHas: "takes 1 arguments"},
		{name: "not a number", args: []string{"replicas", admin, "three"}, code: exitUsage, errHas: `a whole number from 1 to the number of nodes, got "three"`},
		{name: "zero", args: []string{"replicas", admin, "0"}, code: exitUsage, errHas: "got \"0\""},
		{name: "above the nodes", args: []string{"replicas", admin, "4"}, code: exitError, errHas: "replication factor 4 out of range: from 1 to the number of nodes, 3"},
		{name: "unchanged", args: []string{"replicas", admin, "2"}, code: exitError, errHas: "the replication factor is 2 already"},
		{name: "help", args: []string{"replicas", "-h"}, outHas: []string{"replicas N", "smaller factor"}},
		{name: "grow", args: []string{"replicas", admin, "3"}, outHas: []string{"replicas begun: epoch 2, 3 nodes, replication factor 2, changing to 3 at stage write-both", "3 nodes, replication factor 3, no change under way"}},
	} {
		s.run(t)
	}
	c.AwaitStable(t, 30*time.Second)
	for i := range 30 {
		for n := range 3 { // ack=3: every node is a replica now
			code, body := cl.Get(t, c.URL(n), fmt.Sprintf("r%d", i), 3, 3)
			require.Equal(t, http.StatusOK, code)
			require.Equal(t, "v", string(body))
		}
	}
}

// dhtkvctl remove: a node that answers is refused (exit 1, the reason);
// once it is stopped the command waits through every stage, printing
// them with the dead mark, and the cluster ends without it, every key
// still readable from the others.
func TestRemoveCommand(t *testing.T) {
	c, cl := startWithKeys(t, "d")
	admin := "--admin=" + c.Node(0).AdminAddr()
	for _, s := range []step{
		{name: "no URL", args: []string{"remove", admin}, code: exitUsage, errHas: "takes 1 arguments"},
		{name: "help", args: []string{"remove", "-h"}, outHas: []string{"remove DEAD", "ack=1", "--no-wait"}},
		{name: "answers", args: []string{"remove", admin, c.URL(2)}, code: exitError, errHas: c.URL(2) + " answers; only a dead node is removed"},
		{name: "malformed", args: []string{"remove", admin, "127.0.0.1:1"}, code: exitBadRequest, errHas: "bad request (400): bad node URL"},
	} {
		s.run(t)
	}
	c.StopNode(2)
	// The log may have to elect a leader first (node 2 may have led it),
	// past the default --timeout.
	(step{name: "dead", args: []string{"remove", "--timeout=1m", admin, c.URL(2)}, outHas: []string{
		"remove begun: epoch 2, 3 nodes, replication factor 2, decommission of " + c.URL(2) + " (dead) at stage write-both",
		"2 nodes, replication factor 2, no change under way",
	}}).run(t)
	m := c.AwaitStable(t, 30*time.Second)
	require.Nil(t, m.ByURL(c.URL(2)))
	for i := range 30 {
		code, body := cl.Get(t, c.URL(1), fmt.Sprintf("d%d", i), 2, 2)
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, "v", string(body))
	}
}

// dhtkvctl remove of two dead nodes, no spare machine: the first remove
// begins (its stages wait for the second dead node), the second counts
// its node dead in that change and waits until both are out, printing
// the node to be removed next. Four nodes, two replicas; node 2 is a
// voter of the map's log, node 3 is not.
func TestRemoveTwoDeadCommand(t *testing.T) {
	c := testcluster.Start(t, 4, func(_ int, cfg *node.Config) { cfg.Replicas = 2 })
	c.AwaitStable(t, 30*time.Second)
	// Every member acknowledged the log's map before two die (a change
	// begins only then): they die in a settled cluster.
	require.Eventually(t, func() bool {
		st := c.Node(0).MapLog().State()
		return st.Map != nil && len(st.Waiting(-1)) == 0
	}, 30*time.Second, 20*time.Millisecond)
	admin := "--admin=" + c.Node(0).AdminAddr()
	c.StopNode(3)
	c.StopNode(2)
	(step{name: "first", args: []string{"remove", "--timeout=1m", "--no-wait", admin, c.URL(3)}, outHas: []string{
		"decommission of " + c.URL(3) + " (dead) at stage write-both",
	}}).run(t)
	(step{name: "second", args: []string{"remove", "--timeout=1m", admin, c.URL(2)}, outHas: []string{
		"decommission of " + c.URL(3) + " (dead) at stage write-both; " + c.URL(2) + " dead, removed next",
		"2 nodes, replication factor 2, no change under way", // the wait ends only once both are out
	}}).run(t)
	m := c.AwaitStable(t, 30*time.Second)
	require.Len(t, m.Nodes, 2)
	require.Nil(t, m.ByURL(c.URL(2)))
	require.Nil(t, m.ByURL(c.URL(3)))
}

// startWithKeys starts a real 3-node cluster with 2 replicas and writes 30
// keys, prefix0 to prefix29, each with the value "v".
func startWithKeys(t *testing.T, prefix string) (*testcluster.Cluster, *testcluster.Client) {
	c := testcluster.Start(t, 3, func(_ int, cfg *node.Config) { cfg.Replicas = 2 })
	cl := testcluster.NewClient(t)
	for i := range 30 {
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), fmt.Sprintf("%s%d", prefix, i), []byte("v"), 2, 2))
	}
	return c, cl
}

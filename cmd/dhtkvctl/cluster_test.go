package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
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
		{name: "no URL", args: []string{"join", admin}, code: exitUsage, errHas: "takes 1 argument, got 0"},
		{name: "help", args: []string{"join", "-h"}, outHas: []string{"--admin", "--join", "decommission"}},
		{name: "not a member", args: []string{"decommission", admin, "http://127.0.0.1:1"}, code: exitError, errHas: "not a member"},
		{name: "malformed", args: []string{"decommission", admin, "127.0.0.1:1"}, code: exitBadRequest, errHas: "bad request (400): bad node URL"},
		{name: "abort takes no URL", args: []string{"abort", admin, "http://127.0.0.1:1"}, code: exitUsage, errHas: "abort takes no arguments, got 1"},
		{name: "replace takes two", args: []string{"replace", admin, "http://127.0.0.1:1"}, code: exitUsage, errHas: "replace takes 2 arguments, got 1"},
		{name: "abort help", args: []string{"abort", "-h"}, check: func(t *testing.T, out string) {
			assert.Contains(t, out, "dhtkvctl abort --admin HOST:PORT\n", "no trailing space")
		}},
		{name: "join help", args: []string{"join", "-h"}, outHas: []string{"dhtkvctl join --admin HOST:PORT [--no-wait] URL\n"}},
		{name: "replace help", args: []string{"replace", "-h"}, outHas: []string{"dhtkvctl replace --admin HOST:PORT DEAD-URL NEW-URL\n"}},
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
	assert.Contains(t, out.String(), "next: if "+c.URL(joiner)+" is not running yet, start it now", "what to do next")
	assert.Contains(t, out.String(), "3 nodes, replication factor 2, no change under way")
	assert.Contains(t, out.String(), "join of node 2 ("+c.URL(joiner)+") completed")

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
		{name: "no N", args: []string{"replicas", admin}, code: exitUsage, errHas: "takes 1 argument, got 0"},
		{name: "not a number", args: []string{"replicas", admin, "three"}, code: exitUsage, errHas: `a whole number from 1 to the number of nodes, got "three"`},
		{name: "zero", args: []string{"replicas", admin, "0"}, code: exitUsage, errHas: "got \"0\""},
		{name: "above the nodes", args: []string{"replicas", admin, "4"}, code: exitError, errHas: "replication factor 4 out of range: from 1 to the number of nodes, 3"},
		{name: "unchanged", args: []string{"replicas", admin, "2"}, code: exitError, errHas: "the replication factor is 2 already"},
		{name: "help", args: []string{"replicas", "-h"}, outHas: []string{"replicas N", "a write needs ack of each set"}},
		{name: "grow", args: []string{"replicas", admin, "3"}, outHas: []string{"replicas begun: epoch 2, 3 nodes, replication factor 2, changing to 3 at stage write-both", "3 nodes, replication factor 3, no change under way", "replicas change to 3 completed"}},
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
		{name: "no URL", args: []string{"remove", admin}, code: exitUsage, errHas: "takes 1 argument, got 0"},
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
		"remove of node 2 (" + c.URL(2) + ") completed",
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
		"remove of node 2 (" + c.URL(2) + ") completed",
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

// A membership change that does not complete exits 1 with one line
// naming its outcome, where the command used to see a map with no change
// under way and exit 0 (a join aborted while it waited printed "no
// change under way"). Each change waits at write-both for a member that
// does not acknowledge it, a node never started or node 2 cut off from
// the others, while dhtkvctl abort ends it; node 2's links are restored
// and every member acknowledges the map before the next one begins. Last,
// a decommission of node 2 that a remove of it finishes (node 2 counted
// dead) is not the decommission asked for: exit 1 too, and the remove
// that finished it exits 0.
func TestChangeNotCompleted(t *testing.T) {
	c := testcluster.StartLinked(t, 3, func(_ int, cfg *node.Config) { cfg.Replicas = 2 })
	admin := "--admin=" + c.Node(0).AdminAddr()
	// settled waits until the log has no change under way and every
	// member acknowledged its map: a change begins only then.
	settled := func(t *testing.T) {
		t.Helper()
		testcluster.Eventually(t, 60*time.Second, "the cluster settled", func() bool {
			st := c.Node(0).MapLog().State()
			return st.Map != nil && st.Map.Change == nil && len(st.Waiting(-1)) == 0
		})
	}
	// begin runs args in the background once the cluster settled, and
	// returns its exit code's channel once the change is under way.
	begin := func(t *testing.T, args []string, out, errb *bytes.Buffer) <-chan int {
		t.Helper()
		code := make(chan int, 1)
		go func() { code <- run(args, nil, out, errb) }()
		testcluster.Eventually(t, 30*time.Second, "the change begun", func() bool {
			st := c.Node(0).MapLog().State()
			return st.Map != nil && st.Map.Change != nil
		})
		return code
	}
	exited := func(t *testing.T, code <-chan int) int {
		t.Helper()
		select {
		case n := <-code:
			return n
		case <-time.After(60 * time.Second):
			t.Fatal("the command did not return")
			return -1
		}
	}
	never := fmt.Sprintf("http://127.0.0.1:%d", testcluster.FreePorts(t, 1)[0])
	for _, tc := range []struct {
		name    string
		args    []string
		isolate bool // cut node 2 off: the change waits for its acknowledgement
		errHas  string
	}{
		{name: "join", args: []string{"join", admin, never}, errHas: "join of node 3 (" + never + ") aborted at epoch "},
		{name: "decommission", args: []string{"decommission", admin, c.URL(1)}, isolate: true,
			errHas: "decommission of node 1 (" + c.URL(1) + ") aborted at epoch "},
		{name: "replicas", args: []string{"replicas", admin, "3"}, isolate: true, errHas: "replicas change to 3 aborted at epoch "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			settled(t)
			if tc.isolate {
				c.Isolate(2)
				defer c.Heal()
			}
			var out, errb bytes.Buffer
			code := begin(t, tc.args, &out, &errb)
			// The log may have to elect a leader first (node 2 may have
			// led it), past the default --timeout.
			step{name: "abort", args: []string{"abort", "--timeout=1m", admin}, outHas: []string{"abort done: ", "no change under way"}}.run(t)
			require.Equal(t, exitError, exited(t, code), "stdout %q, stderr %q", out.String(), errb.String())
			assert.Contains(t, out.String(), tc.name+" begun: ")
			assert.Contains(t, errb.String(), tc.errHas)
			assert.Equal(t, 1, strings.Count(errb.String(), "\n"), "one line on stderr: %q", errb.String())
			assert.NotContains(t, out.String(), "completed")
		})
	}

	settled(t)
	c.Isolate(2)
	var out, errb bytes.Buffer
	code := begin(t, []string{"decommission", admin, c.URL(2)}, &out, &errb)
	(step{name: "remove", args: []string{"remove", "--timeout=1m", admin, c.URL(2)}, outHas: []string{
		"remove begun: ", "decommission of " + c.URL(2) + " (dead)", "2 nodes, replication factor 2, no change under way",
		"remove of node 2 (" + c.URL(2) + ") completed",
	}}).run(t)
	require.Equal(t, exitError, exited(t, code), "stdout %q, stderr %q", out.String(), errb.String())
	assert.Contains(t, errb.String(), "decommission of node 2 ("+c.URL(2)+") ended as a remove at epoch ")
	assert.Equal(t, 1, strings.Count(errb.String(), "\n"), "one line on stderr: %q", errb.String())
}

// dhtkvctl decommission asked of the leaving node's own admin listener
// (kubectl exec dhtkv-4 -- dhtkvctl decommission --admin 127.0.0.1:6060
// http://dhtkv-4.dhtkv:8080): the node stops once it is out of the map, as
// the binary does on Left, and the command must still report the
// decommission it asked for as completed (the other members' maps no
// longer have it), where it waited for --wait-timeout and exited 1 with
// "did not complete".
func TestDecommissionAskedOfTheLeavingNode(t *testing.T) {
	c, _ := startWithKeys(t, "s")
	admin := "--admin=" + c.Node(2).AdminAddr()
	stopped := make(chan struct{})
	go func() { defer close(stopped); c.AwaitLeft(t, 2, 60*time.Second) }() // the process exits on Left
	var out, errb bytes.Buffer
	code := run([]string{"decommission", admin, "--wait-timeout=30s", c.URL(2)}, nil, &out, &errb)
	<-stopped
	assert.Contains(t, out.String(), "decommission begun")
	require.Equal(t, exitOK, code, "stdout %q, stderr %q", out.String(), errb.String())
	assert.Contains(t, out.String(), "completed")
}

// A membership command at the default --timeout (5 s) while the map's log
// cannot answer at once (here the node asked is cut off from the other
// two for 8 s, as in a leader election or a brief partition): the node
// goes on proposing the change for up to 30 s (membership.logCallTimeout)
// and applies it; dhtkvctl waits for that answer (changeAnswer), where it
// gave up at 5 s and exited 1 with a bare "context deadline exceeded",
// reporting as failed a change that happened.
func TestChangeWaitsForTheNodesAnswer(t *testing.T) {
	c := testcluster.StartLinked(t, 3, func(_ int, cfg *node.Config) { cfg.Replicas = 2 })
	testcluster.Eventually(t, 60*time.Second, "the cluster settled", func() bool {
		st := c.Node(0).MapLog().State()
		return st.Map != nil && st.Map.Change == nil && len(st.Waiting(-1)) == 0
	})
	admin := "--admin=" + c.Node(0).AdminAddr()
	joiner := fmt.Sprintf("http://127.0.0.1:%d", testcluster.FreePorts(t, 1)[0])
	c.Isolate(0)
	healed := time.AfterFunc(8*time.Second, c.Heal)
	defer healed.Stop()
	var out, errb bytes.Buffer
	code := run([]string{"join", admin, "--no-wait", joiner}, nil, &out, &errb)
	t.Logf("exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	// What the cluster did with the request.
	testcluster.Eventually(t, 40*time.Second, "the join applied", func() bool {
		m := c.Node(0).MapLog().State().Map
		return m != nil && m.ByURL(joiner) != nil
	})
	require.Equal(t, exitOK, code, "stderr %q", errb.String())
	assert.Contains(t, out.String(), "join begun")
}

// After a join or a replace begins, dhtkvctl says what to do next: a
// replace is over as it begins, before its new machine started, and a
// join's node may not run yet while writes need it.
func TestNextStep(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		has  string
	}{
		{"join", []string{"http://n4:8080"}, "if http://n4:8080 is not running yet, start it now"},
		{"replace", []string{"http://n2:8080", "http://n5:8080"}, "next: start the new machine at http://n5:8080"},
		{"decommission", []string{"http://n2:8080"}, ""},
		{"replicas", []string{"3"}, ""},
		{"abort", nil, ""},
	} {
		got := nextStep(tc.name, tc.args)
		if tc.has == "" {
			assert.Empty(t, got, tc.name)
			continue
		}
		assert.Contains(t, got, tc.has, tc.name)
	}
}

// A recorded change is named by its kind and node, except a replicas
// change: its node is the one that drove it, and "replicas of node 1"
// read as if node 1 had moved.
func TestPrintClusterNamesTheLastChange(t *testing.T) {
	m := &client.ClusterMap{Epoch: 9, Replicas: 3, Nodes: []client.ClusterNode{{ID: 1, URL: "http://a:1"}}}
	for _, tc := range []struct {
		last client.ChangeOutcome
		want string
	}{
		{client.ChangeOutcome{Kind: "join", Node: 1, Began: 5, Ended: 8}, "last change: join of node 1 at http://a:1, epochs 5-8, completed\n"},
		{client.ChangeOutcome{Kind: "decommission", Node: 4, Began: 5, Ended: 8}, "last change: decommission of node 4, epochs 5-8, completed\n"},
		{client.ChangeOutcome{Kind: "replicas", Node: 1, Began: 5, Ended: 8, Aborted: true}, "last change: replicas change (driven by node 1), epochs 5-8, aborted\n"},
	} {
		var b strings.Builder
		require.NoError(t, printCluster(&b, &client.ClusterStatus{Map: m, Self: 1, Last: &tc.last}, false))
		assert.Contains(t, b.String(), tc.want)
	}
}

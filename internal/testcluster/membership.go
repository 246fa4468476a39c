package testcluster

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/node"
)

// AddNode prepares a node that will join the cluster: a free port, an
// empty data directory, and --join naming node via. It is not started and
// not yet a member: Join does both. It returns the node's index.
func (c *Cluster) AddNode(t testing.TB, via int, opts ...Option) int {
	t.Helper()
	port := FreePorts(t, 1)[0]
	c.mu.Lock()
	i := len(c.cfgs)
	cfg := c.cfgs[via]
	cfg.Listen = fmt.Sprintf("127.0.0.1:%d", port)
	cfg.Self = ""
	cfg.DataDir = filepath.Join(t.TempDir(), fmt.Sprintf("node%d", i+1))
	cfg.Cluster = ""
	cfg.Join = "http://" + c.cfgs[via].Listen
	for _, o := range opts {
		o(i, &cfg)
	}
	c.cfgs = append(c.cfgs, cfg)
	c.nodes = append(c.nodes, nil)
	if c.links != nil {
		c.mu.Unlock()
		t.Fatal("AddNode: not for linked clusters")
	}
	c.mu.Unlock()
	return i
}

// StartNodeWaiting starts node i (from AddNode) in the background, before
// the change that adds it: the node waits for it (node.Config.JoinWait).
// The channel receives the start's error (nil: node i runs) once it
// returns; the cluster's lock is not held meanwhile, so that the test
// can ask for the join.
func (c *Cluster) StartNodeWaiting(t testing.TB, i int) <-chan error {
	t.Helper()
	c.mu.Lock()
	cfg := c.cfgs[i]
	running := c.nodes[i] != nil
	c.mu.Unlock()
	require.False(t, running, "node %d already running", i)
	ctx, cancel := context.WithCancel(context.Background())
	done, returned := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(returned)
		n, err := node.StartContext(ctx, cfg)
		if err == nil {
			c.mu.Lock()
			c.nodes[i] = n
			c.mu.Unlock()
		}
		done <- err
	}()
	t.Cleanup(func() {
		// Before StopAll (registered first): a start still waiting ends,
		// and a node that started is registered for StopAll to stop.
		cancel()
		<-returned
	})
	return done
}

// admin is a client of node i's admin listener.
func (c *Cluster) admin(t testing.TB, i int) (*client.Client, string) {
	t.Helper()
	n := c.Node(i)
	require.NotNil(t, n, "node %d is stopped", i)
	cl, err := client.New(client.Config{Endpoints: []string{c.URL(i)}})
	require.NoError(t, err)
	return cl, n.AdminAddr()
}

// Join asks node via to add node i (from AddNode), then starts node i.
func (c *Cluster) Join(t testing.TB, via, i int) {
	t.Helper()
	cl, admin := c.admin(t, via)
	_, err := cl.Join(context.Background(), admin, c.URL(i))
	require.NoError(t, err)
	c.StartNode(i)
}

// Decommission asks node via to remove node i. Node i stops serving once
// out of the map; AwaitLeft waits for that and stops it.
func (c *Cluster) Decommission(t testing.TB, via, i int) {
	t.Helper()
	cl, admin := c.admin(t, via)
	_, err := cl.Decommission(context.Background(), admin, c.URL(i))
	require.NoError(t, err)
}

// AwaitLeft waits until node i knows it was decommissioned, then stops it
// (within its read timeout and more, as StopNode).
func (c *Cluster) AwaitLeft(t testing.TB, i int, timeout time.Duration) {
	t.Helper()
	n := c.Node(i)
	require.NotNil(t, n, "node %d is stopped", i)
	select {
	case <-n.Left():
	case <-time.After(timeout):
		t.Fatalf("node %d did not learn that it left within %v", i, timeout)
	}
	start := time.Now()
	c.mu.Lock()
	c.nodes[i] = nil
	c.mu.Unlock()
	c.stop(i, n, c.cfgs[i].ReadTimeout+10*time.Second)
	t.Logf("node %d stopped in %v", i, time.Since(start))
}

// AwaitStable waits until every running member has installed the same
// map, with no change under way, and has dropped the partitions it no
// longer holds, and returns the map.
func (c *Cluster) AwaitStable(t testing.TB, timeout time.Duration) *clustermap.Map {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for {
		var m *clustermap.Map
		same := true
		for i := range c.Size() {
			n := c.Node(i)
			if n == nil {
				continue
			}
			nm, self := n.Members().Map()
			if self < 0 {
				continue // left, not stopped yet
			}
			if m == nil {
				m = nm
			}
			if nm.Epoch != m.Epoch || nm.Change != nil {
				same = false
				last = fmt.Sprintf("node %d at %s, another at %s", i, nm, m)
			} else if n.Members().CleanupPending() {
				same = false
				last = fmt.Sprintf("node %d still drops partitions it no longer holds", i)
			}
		}
		if same && m != nil {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("no stable cluster map within %v: %s", timeout, last)
		}
		time.Sleep(50 * time.Millisecond) // polling interval of a condition
	}
}

// Index returns the index of the node at url (-1: none).
func (c *Cluster) Index(url string) int {
	for i := range c.Size() {
		if c.URL(i) == url {
			return i
		}
	}
	return -1
}

package testcluster

import (
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/faultnet"
	"github.com/dhtkv/dhtkv/internal/node"
)

// StartLinked is Start with every node-to-node connection routed through a
// faultnet.Link per ordered pair of nodes, which the test controls with
// Link, Partition, Isolate and Heal. Clients still reach every node
// directly: a partition separates the nodes, not the clients.
func StartLinked(t testing.TB, n int, opts ...Option) *Cluster {
	t.Helper()
	ports := FreePorts(t, n)
	addrs := make([]string, n)
	for i, p := range ports {
		addrs[i] = "127.0.0.1:" + strconv.Itoa(p)
	}
	links := make([][]*faultnet.Link, n)
	for i := range n {
		links[i] = make([]*faultnet.Link, n)
		for j := range n {
			if i == j {
				continue
			}
			l, err := faultnet.NewLink(addrs[j])
			require.NoError(t, err)
			links[i][j] = l
		}
	}
	// Registered first, so it runs after the nodes have stopped.
	t.Cleanup(func() {
		for _, row := range links {
			for _, l := range row {
				if l != nil {
					l.Close()
				}
			}
		}
	})
	route := func(i int, cfg *node.Config) {
		from := links[i]
		cfg.PeerDial = func(addr string, timeout time.Duration) (net.Conn, error) {
			for j, a := range addrs {
				if a == addr && from[j] != nil {
					addr = from[j].Addr()
					break
				}
			}
			return net.DialTimeout("tcp", addr, timeout)
		}
	}
	c := start(t, ports, append([]Option{route}, opts...))
	c.links = links
	return c
}

// Link is the link carrying node from's connections to node to.
func (c *Cluster) Link(from, to int) *faultnet.Link {
	require.NotNil(c.t, c.links, "cluster not started with StartLinked")
	return c.links[from][to]
}

// Partition cuts every link between nodes of different groups and restores
// the links within each group; a node in no group is cut off from all.
func (c *Cluster) Partition(groups ...[]int) {
	group := make([]int, c.Size())
	for i := range group {
		group[i] = -1 - i // alone
	}
	for g, members := range groups {
		for _, m := range members {
			group[m] = g
		}
	}
	for i := range c.Size() {
		for j := range c.Size() {
			if i == j {
				continue
			}
			if group[i] == group[j] {
				c.Link(i, j).Restore()
			} else {
				c.Link(i, j).Cut()
			}
		}
	}
}

// Isolate cuts node i off from every other node, both ways.
func (c *Cluster) Isolate(i int) {
	var rest []int
	for j := range c.Size() {
		if j != i {
			rest = append(rest, j)
		}
	}
	c.Partition(rest)
}

// Heal restores every link.
func (c *Cluster) Heal() {
	for i := range c.Size() {
		for j := range c.Size() {
			if i != j {
				c.Link(i, j).Restore()
			}
		}
	}
}

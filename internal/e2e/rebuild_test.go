package e2e_test

import (
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/cluster"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/placement"
	"github.com/dhtkv/dhtkv/internal/sizeflag"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// TestRebuildWipedNode plays a history that loses data unless a node
// that lost its disk rebuilds: 300 keys
// acknowledged with ack=2 while C was down (stored on A and B; no hints,
// no read repair, so C stays without them), C back, then B's disk lost
// and A stopped. B starts empty and must not answer "never written": it
// rebuilds, and cannot finish without A, so quorum reads of those keys
// answer 504, never 404 (a read with ack=1 may still meet C, which was
// never told: R+W is not above N). Once A is back B finishes, and every key reads back
// through every node, B's own replica included; B's identity says it is
// done, so a restart does not rebuild again.
func TestRebuildWipedNode(t *testing.T) {
	const a, b, cNode = 0, 1, 2
	c := testcluster.Start(t, 3, func(_ int, cfg *node.Config) {
		cfg.Handoff.Window = time.Millisecond
		cfg.Coordinator.ReadRepair = cluster.RepairOff
	})
	cl := testcluster.NewClient(t)
	for i := range 3 { // the cluster has run long enough to know it exists
		testcluster.Eventually(t, 10*time.Second, "cluster formed", func() bool { return c.Metric(t, i, "dhtkv_cluster_formed") == 1 })
	}
	c.StopNode(cNode)
	const n = 300
	for i := range n {
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(i%2), fmt.Sprintf("rb%d", i), []byte(fmt.Sprint(i)), 2, 3))
	}
	c.StartNode(cNode)
	c.StopNode(b)
	c.WipeNode(b)
	c.StopNode(a)
	c.StartNode(b)
	require.Equal(t, 1.0, c.Metric(t, b, "dhtkv_rebuilding"), "B holds nothing, C knows the cluster exists: B rebuilds")
	_, status := cl.Do(t, http.MethodGet, c.URL(b)+"/v0/status", nil)
	require.Contains(t, string(status), "rebuilding")
	for i := range n {
		for _, via := range []int{b, cNode} {
			code, _ := cl.Get(t, c.URL(via), fmt.Sprintf("rb%d", i), 2, 3)
			require.NotEqual(t, http.StatusNotFound, code, "rb%d via node %d: an acknowledged write read as never written by a quorum", i, via)
		}
	}

	c.StartNode(a)
	testcluster.Eventually(t, 20*time.Second, "B's rebuild finished", func() bool {
		return c.Metric(t, b, "dhtkv_rebuilding") == 0
	})
	for i := range n {
		key := fmt.Sprintf("rb%d", i)
		code, rec := internalGet(t, cl, c.URL(b), key, "")
		require.Equal(t, http.StatusOK, code, "%s copied to B", key)
		require.Equal(t, fmt.Sprint(i), string(rec.Value))
		expectValue(t, cl, c.URL(i%3), key, 2, 3, fmt.Sprint(i))
	}
	c.StopNode(b)
	c.StartNode(b)
	require.Equal(t, 0.0, c.Metric(t, b, "dhtkv_rebuilding"), "done is recorded")
}

// TestFreshClusterDoesNotRebuild: nodes of a new cluster start empty with
// empty peers: nothing to copy, nothing refused.
func TestFreshClusterDoesNotRebuild(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 3)
	for i := range 3 {
		require.Equal(t, 0.0, c.Metric(t, i, "dhtkv_rebuilding"), "node %d", i)
	}
}

// TestDataDirOfAnotherNodeIsRefused: a node started on a data directory
// that another node of the cluster wrote refuses to start, and writes no
// emergency ballast into it first.
func TestDataDirOfAnotherNodeIsRefused(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 2)
	c.StopAll()
	cfg := c.Config(0)
	cfg.DataDir = c.Config(1).DataDir
	cfg.Store.Ballast = sizeflag.Amount{Bytes: 1 << 20}
	_, err := node.Start(cfg)
	require.ErrorContains(t, err, "belongs to node 1")
	_, err = os.Stat(filepath.Join(cfg.DataDir, store.BallastFile))
	require.ErrorIs(t, err, fs.ErrNotExist, "nothing written into a directory refused")

	cfg = c.Config(1) // its own: the ballast is made
	cfg.Store.Ballast = sizeflag.Amount{Bytes: 1 << 20}
	n, err := node.Start(cfg)
	require.NoError(t, err)
	require.NoError(t, n.Close())
	st, err := os.Stat(filepath.Join(cfg.DataDir, store.BallastFile))
	require.NoError(t, err)
	require.Equal(t, int64(1<<20), st.Size())
}

// TestRebuildWipedSeedAfterChange: a node started with the --cluster list
// it was seeded from, on an empty directory, after the cluster changed
// (the members are at a higher epoch). It seeds the list's map again,
// learns at once from the peers it pings that it lost its disk, and
// installs their newer map on the way; it must then rebuild under its
// identity, not crash (installing a map before the node's parts existed
// called anti-entropy through a nil pointer), and hold every write in its
// own replica. A Kubernetes seed pod whose volume was lost starts exactly
// so (docs/kubernetes.md).
//
// After a join and then a decommission of the joined node the cluster is
// the three seeds again, at a higher epoch, and every peer refuses the
// wiped seed's pings, routed by the seeded map, as stale: that refusal
// says the cluster exists and changed since. (It was once taken for a
// peer that had not seen the cluster: the seed served an empty replica
// as whole and answered ack=1 reads of its keys with 404. The join-only
// case passed then, as its reads were quorum reads the other replicas
// answered; both now read the seed's own replica.)
func TestRebuildWipedSeedAfterChange(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, c *testcluster.Cluster)
	}{
		{"a join", func(t *testing.T, c *testcluster.Cluster) { c.Join(t, 0, c.AddNode(t, 0)) }},
		{"a join and a decommission", func(t *testing.T, c *testcluster.Cluster) {
			joined := c.AddNode(t, 0)
			c.Join(t, 0, joined)
			c.AwaitStable(t, 30*time.Second)
			c.Decommission(t, 0, joined)
			c.AwaitLeft(t, joined, 30*time.Second)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testcluster.Start(t, 3)
			cl := testcluster.NewClient(t)
			for i := range 3 {
				testcluster.Eventually(t, 10*time.Second, "cluster formed", func() bool { return c.Metric(t, i, "dhtkv_cluster_formed") == 1 })
			}
			const n = 200
			for i := range n {
				require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(i%3), fmt.Sprintf("ws%d", i), []byte(fmt.Sprint(i)), 3, 3))
			}
			tc.change(t, c)
			m := c.AwaitStable(t, 30*time.Second)
			require.Greater(t, m.Epoch, uint64(1))
			const seed = 1
			c.StopNode(seed)
			c.WipeNode(seed)
			c.StartNode(seed)
			testcluster.Eventually(t, 30*time.Second, "the wiped seed rebuilt on the current map", func() bool {
				mine, _ := c.Node(seed).Members().Map()
				return !c.Node(seed).Rebuilding() && mine.Epoch == m.Epoch && c.Metric(t, seed, "dhtkv_rebuild_records_total") > 0
			})
			// The seed's own replica, read without a quorum: every key the
			// current map places on it.
			p, held := placement.New(m.Nodes), 0
			for i := range n {
				key := fmt.Sprintf("ws%d", i)
				if !slices.Contains(replicasOf(p, key, m.Replicas), seed) {
					continue
				}
				held++
				code, rec := internalGet(t, cl, c.URL(seed), key, "")
				require.Equal(t, http.StatusOK, code, "%s on the wiped seed's replica", key)
				require.Equal(t, fmt.Sprint(i), string(rec.Value))
			}
			require.Greater(t, held, n/2, "the seed holds most keys")
		})
	}
}

// TestRebuildClockBehindWaits: a wiped node whose clock is 30 s behind
// refuses every record written in the last 30 s (too far ahead of its
// clock to be stored), so its copies leave them out. The rebuild must
// not count as done then: the node would serve reads without records it
// is a replica of, and later count as their replica. It keeps rebuilding
// until its clock is right, and then holds every key.
func TestRebuildClockBehindWaits(t *testing.T) {
	testcluster.InBubble(t, func(t *testing.T) {
		c := testcluster.StartInMemory(t, 3)
		c.AwaitFormed(time.Minute)
		cl := c.Client()
		const keys = 100
		for k := range keys {
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(k%2), fmt.Sprintf("cb%d", k), []byte("v"), 3, 3))
		}
		const b = 2
		c.StopNode(b)
		c.WipeNode(b)
		c.StepClock(b, -30*time.Second)
		c.StartNode(b)
		require.True(t, c.Node(b).Rebuilding())
		time.Sleep(10 * time.Second) // the behaviour under test: many copies, each leaving records out
		require.True(t, c.Node(b).Rebuilding(), "the rebuild waits for the clock")
		c.StepClock(b, 0)
		c.Await(time.Minute, "the rebuild finished", func() (bool, string) {
			return !c.Node(b).Rebuilding(), "rebuilding"
		})
		require.Len(t, c.Replica(b), keys, "every key is on the rebuilt node")
	})
}

// TestRebuildTwoWipedNodesAtOnce: two nodes of three lose their disks
// together (a rack). Each rebuild refused to finish without the other,
// which refuses its stream while it rebuilds: both waited for ever. Each
// now copies from the live replica and does not wait for the other,
// which holds nothing the live one lacks. At three replicas every
// partition has the live node: every key comes back on both. At two, the
// partitions whose replicas were the two lost disks have nobody to copy
// from: their keys are gone (written at ack=2, on those two only), and
// each rebuild says how many partitions it could not source; every other
// key comes back on both of its replicas.
func TestRebuildTwoWipedNodesAtOnce(t *testing.T) {
	for _, replicas := range []int{3, 2} {
		t.Run(fmt.Sprintf("replicas=%d", replicas), func(t *testing.T) {
			testcluster.InBubble(t, func(t *testing.T) {
				c := testcluster.StartInMemory(t, 3, func(_ int, cfg *node.Config) { cfg.Replicas = replicas })
				c.AwaitFormed(time.Minute)
				cl := c.Client()
				const keys = 300
				for k := range keys {
					require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(k%3), fmt.Sprintf("tw%d", k), []byte(fmt.Sprint(k)), replicas, replicas))
				}
				m, _ := c.Node(0).Members().Map()
				const a, b, live = 0, 1, 2
				for _, i := range []int{a, b} {
					c.StopNode(i)
					c.WipeNode(i)
				}
				for _, i := range []int{a, b} {
					c.StartNode(i) // the second may finish its rebuild at once: nothing to assert here
				}
				c.Await(time.Minute, "both rebuilds finished", func() (bool, string) {
					return !c.Node(a).Rebuilding() && !c.Node(b).Rebuilding(), "rebuilding"
				})
				for _, i := range []int{a, b} {
					require.Positive(t, testcluster.Metric(t, c.Node(i).Registry(), "dhtkv_rebuild_records_total"), "node %d rebuilt", i)
				}

				p := placement.New(m.Nodes)
				held := make([]map[string]string, c.Size())
				for i := range held {
					held[i] = map[string]string{}
					for _, e := range c.Replica(i) {
						held[i][e.Key] = e.Value
					}
				}
				lost := 0
				for k := range keys {
					key := fmt.Sprintf("tw%d", k)
					var owners []int
					for _, id := range p.Replicas([]byte(key), m.Replicas, nil) {
						owners = append(owners, c.Index(m.Node(id).URL))
					}
					if !slices.Contains(owners, live) {
						lost++ // on the two lost disks only
						continue
					}
					for _, i := range owners {
						require.Equal(t, fmt.Sprint(k), held[i][key], "%s on node %d, one of its replicas %v", key, i, owners)
					}
				}
				// The first to finish found the other rebuilding; the other
				// may then copy from it (what it has of those partitions:
				// nothing older than both rebuilds).
				unsourced := 0.0
				for _, i := range []int{a, b} {
					unsourced += testcluster.Metric(t, c.Node(i).Registry(), "dhtkv_rebuild_unsourced_partitions_total")
				}
				if replicas == 3 {
					require.Zero(t, unsourced, "every partition has the live replica")
					require.Zero(t, lost)
				} else {
					require.Positive(t, unsourced, "the partitions of the two lost disks only")
					require.Positive(t, lost, "some keys were on the two lost disks only")
				}
			})
		})
	}
}

// TestLocalScanOfRebuildingNode: a rebuilding node's local scan
// (scope=local, the default) is refused with 503 and the reason, as its
// point reads are: its records are not yet all its replica holds, and
// answered they would read as the range's whole (it once answered 200
// with none). A point read through it still answers, from the others.
func TestLocalScanOfRebuildingNode(t *testing.T) {
	testcluster.InBubble(t, func(t *testing.T) {
		const a, b = 0, 1
		c := testcluster.StartInMemory(t, 3)
		c.AwaitFormed(time.Minute)
		cl := c.Client()
		const keys = 20
		for k := range keys {
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(k%3), fmt.Sprintf("ls%d", k), []byte("v"), 3, 3))
		}
		c.StopNode(a) // b's rebuild waits for it
		c.StopNode(b)
		c.WipeNode(b)
		c.StartNode(b)
		require.True(t, c.Node(b).Rebuilding())
		code, body := cl.Do(t, http.MethodGet, c.URL(b)+"/v0/entities?start=%00", nil)
		require.Equal(t, http.StatusServiceUnavailable, code, "%s", body)
		require.Equal(t, "this node's replica is rebuilding: scan with scope=cluster, or through another node\n", string(body))
		code, _ = cl.Get(t, c.URL(b), "ls0", 1, 3)
		require.Equal(t, http.StatusOK, code, "a point read is answered by another replica")
	})
}

// TestRebuildCopiesARebuildingPeersWrites: C's disk is lost while A is
// down, and C rebuilds, waiting for A; writes at ack=2 meanwhile reach B
// and C alone. Then B's disk is lost and B rebuilds too. The writes are
// now on C alone, a rebuilding peer: B must copy them from it all the
// same (its rebuild once skipped a rebuilding peer, finished from A
// alone, and a quorum of A and B read the writes as never written).
func TestRebuildCopiesARebuildingPeersWrites(t *testing.T) {
	testcluster.InBubble(t, func(t *testing.T) {
		const a, b, cNode = 0, 1, 2
		c := testcluster.StartInMemory(t, 3, func(_ int, cfg *node.Config) {
			cfg.Coordinator.ReadRepair = cluster.RepairOff
		})
		c.AwaitFormed(time.Minute)
		cl := c.Client()
		c.StopNode(a)
		c.StopNode(cNode)
		c.WipeNode(cNode)
		c.StartNode(cNode)
		require.True(t, c.Node(cNode).Rebuilding(), "C rebuilds, waiting for A")
		const keys = 50
		for k := range keys {
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(b), fmt.Sprintf("rs%d", k), []byte("v"), 2, 3))
		}
		c.StopNode(b)
		c.WipeNode(b)
		c.StartNode(b)
		require.True(t, c.Node(b).Rebuilding(), "B rebuilds")
		c.StartNode(a)
		c.Await(time.Minute, "both rebuilds finished", func() (bool, string) {
			return !c.Node(b).Rebuilding() && !c.Node(cNode).Rebuilding(), "rebuilding"
		})
		require.Len(t, c.Replica(b), keys, "B copied C's writes")
		c.StopNode(cNode) // one node down: a quorum (A, B) is left
		for k := range keys {
			code, _ := cl.Get(t, c.URL(a), fmt.Sprintf("rs%d", k), 2, 3)
			require.Equal(t, http.StatusOK, code, "rs%d, acknowledged at ack=2, through a quorum of A and B", k)
		}
	})
}

// TestNotReadyWhileTheOtherReplicaRebuilds: A is down and B rebuilds
// (waiting for A): C reaches B, whose pings answer, but B's replica
// refuses every read, so no quorum read through C can succeed. C must say
// so (/readyz 503, no quorum) rather than count B as a readable replica,
// and be ready again once B's rebuild ends.
func TestNotReadyWhileTheOtherReplicaRebuilds(t *testing.T) {
	testcluster.InBubble(t, func(t *testing.T) {
		const a, b, cNode = 0, 1, 2
		c := testcluster.StartInMemory(t, 3)
		c.AwaitFormed(time.Minute)
		cl := c.Client()
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(cNode), "rd", []byte("v"), 3, 3))
		c.StopNode(a)
		c.StopNode(b)
		c.WipeNode(b)
		c.StartNode(b)
		require.True(t, c.Node(b).Rebuilding())
		c.Await(time.Minute, "C not ready: B rebuilds and A is down", func() (bool, string) {
			err := c.Node(cNode).Ready()
			return err != nil, fmt.Sprint(err)
		})
		require.ErrorIs(t, c.Node(cNode).Ready(), node.ErrNoQuorum)
		code, _ := cl.Get(t, c.URL(cNode), "rd", 2, 3)
		require.Equal(t, http.StatusGatewayTimeout, code, "no quorum read through C")
		c.StartNode(a)
		c.Await(time.Minute, "C ready once B rebuilt", func() (bool, string) {
			err := c.Node(cNode).Ready()
			return err == nil && !c.Node(b).Rebuilding(), fmt.Sprint(err)
		})
	})
}

// TestRebuildWipedNodeStartedCutOff is TestRebuildWipedNode's history
// with B started while its links are down (a switch rebooting, the peers
// restarting after a power cut): at its start no peer answers, so it
// cannot tell a lost disk from a new cluster, and goes on unconfirmed.
// Once the links are back C says the cluster was formed before B's
// directory was made, and B rebuilds, waiting for A: quorum reads never
// answer 404 for the writes acknowledged at ack=2 (B once served its
// empty replica as whole for good). With A back the rebuild ends, and a
// restart neither rebuilds nor asks again.
func TestRebuildWipedNodeStartedCutOff(t *testing.T) {
	testcluster.InBubble(t, func(t *testing.T) {
		const a, b, cNode = 0, 1, 2
		c := testcluster.StartInMemory(t, 3, func(_ int, cfg *node.Config) {
			cfg.Handoff.Window = time.Millisecond
			cfg.Coordinator.ReadRepair = cluster.RepairOff
		})
		c.AwaitFormed(time.Minute)
		cl := c.Client()
		c.StopNode(cNode)
		const keys = 100
		for k := range keys {
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(k%2), fmt.Sprintf("cut%d", k), []byte("v"), 2, 3))
		}
		c.StartNode(cNode)
		c.StopNode(b)
		c.WipeNode(b)
		c.StopNode(a)
		c.Isolate(b)
		c.StartNode(b)
		require.True(t, c.Node(b).Unconfirmed(), "no peer answered B's start")
		require.False(t, c.Node(b).Rebuilding())
		time.Sleep(time.Minute) // the behaviour under test: cut off, B keeps asking and stays unconfirmed
		require.True(t, c.Node(b).Unconfirmed())

		c.Heal()
		c.Await(10*time.Second, "B learned it lost its disk", func() (bool, string) {
			return !c.Node(b).Unconfirmed() && c.Node(b).Rebuilding(), "unconfirmed"
		})
		for k := range keys {
			for _, via := range []int{b, cNode} {
				code, _ := cl.Get(t, c.URL(via), fmt.Sprintf("cut%d", k), 2, 3)
				require.NotEqual(t, http.StatusNotFound, code, "cut%d via node %d: an acknowledged write read as never written", k, via)
			}
		}
		c.StartNode(a)
		c.Await(time.Minute, "B's rebuild finished", func() (bool, string) { return !c.Node(b).Rebuilding(), "rebuilding" })
		for k := range keys {
			code, _ := cl.Get(t, c.URL(b), fmt.Sprintf("cut%d", k), 2, 3)
			require.Equal(t, http.StatusOK, code, "cut%d via B", k)
		}
		c.StopNode(b)
		c.StartNode(b)
		require.False(t, c.Node(b).Rebuilding(), "done is recorded")
		require.False(t, c.Node(b).Unconfirmed(), "and what the peers said")
	})
}

// TestNewClusterStartedApartDoesNotRebuild: the nodes of a new cluster
// start a minute apart, so the first two find no peer, or not every
// peer, answering, and go on unconfirmed; once every peer answered, none
// of which was formed before their directories were made, they know it
// was a new cluster. Nobody rebuilds, and every node serves reads
// throughout.
func TestNewClusterStartedApartDoesNotRebuild(t *testing.T) {
	testcluster.InBubble(t, func(t *testing.T) {
		c := testcluster.StartInMemory(t, 3)
		c.AwaitFormed(time.Minute)
		c.StopAll()
		cl := c.Client()
		for i := range 3 {
			c.WipeNode(i) // a new cluster of the same list
		}
		for i := range 3 {
			c.StartNode(i)
			require.Equal(t, i < 2, c.Node(i).Unconfirmed(), "node %d: not every peer answered its start", i)
			for j := range i + 1 {
				require.False(t, c.Node(j).Rebuilding(), "node %d", j)
				code, _ := cl.Get(t, c.URL(j), "missing", 1, 3)
				require.Equal(t, http.StatusNotFound, code, "node %d serves its replica", j)
			}
			time.Sleep(time.Minute) // the behaviour under test: nodes starting apart
		}
		c.Await(10*time.Second, "every node confirmed", func() (bool, string) {
			for i := range 3 {
				if c.Node(i).Unconfirmed() || c.Node(i).Rebuilding() {
					return false, fmt.Sprintf("node %d unconfirmed %v, rebuilding %v", i, c.Node(i).Unconfirmed(), c.Node(i).Rebuilding())
				}
			}
			return true, ""
		})
		c.AwaitFormed(time.Minute)
	})
}

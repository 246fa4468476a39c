package e2e_test

// The course's two-node replication suite, one test per scenario, against a
// real in-process cluster of two nodes (testcluster.Start(t, 2)).

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

var methods = []string{http.MethodGet, http.MethodPut, http.MethodDelete}

func expectRejected(t *testing.T, c *testcluster.Cluster, cl *testcluster.Client, ack, from string) {
	t.Helper()
	for i := range c.Size() {
		for _, m := range methods {
			var body []byte
			if m == http.MethodPut {
				body = []byte("v")
			}
			code, _ := cl.Do(t, m, rawURL(c.URL(i), "key", ack, from), body)
			require.Equal(t, http.StatusBadRequest, code, "%s ack=%s from=%s via node %d", m, ack, from, i)
		}
	}
}

func TestTwoNodesTooSmallRF(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 2)
	expectRejected(t, c, testcluster.NewClient(t), "0", "2")
}

func TestTwoNodesTooBigRF(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 2)
	expectRejected(t, c, testcluster.NewClient(t), "3", "2")
}

func TestTwoNodesUnreachableRF(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 2)
	cl := testcluster.NewClient(t)
	for down := range 2 {
		up := 1 - down
		c.StopNode(down)
		for _, m := range methods {
			var body []byte
			if m == http.MethodPut {
				body = []byte("v")
			}
			code, answer := cl.Do(t, m, testcluster.EntityURL(c.URL(up), "key", 2, 2), body)
			require.Equal(t, http.StatusGatewayTimeout, code, "%s via node %d: %s", m, up, answer)
			if m == http.MethodGet {
				require.Contains(t, string(answer), "not enough replicas")
			}
		}
		c.StartNode(down)
	}
}

func expectValue(t *testing.T, cl *testcluster.Client, base, key string, ack, from int, want string) {
	t.Helper()
	code, body := cl.Get(t, base, key, ack, from)
	if code != http.StatusOK || string(body) != want {
		t.Fatalf("GET %s ack=%d from=%d via %s: %d %q, want 200 %q (coordinator's replica: %s)",
			key, ack, from, base, code, body, want, describeLocal(t, cl, base, key))
	}
}

func expectAbsent(t *testing.T, cl *testcluster.Client, base, key string, ack, from int) {
	t.Helper()
	code, body := cl.Get(t, base, key, ack, from)
	if code != http.StatusNotFound {
		t.Fatalf("GET %s ack=%d from=%d via %s: %d %q, want 404 (coordinator's replica: %s)",
			key, ack, from, base, code, body, describeLocal(t, cl, base, key))
	}
}

// describeLocal shows a node's local record of key, for failure messages.
func describeLocal(t *testing.T, cl *testcluster.Client, base, key string) string {
	code, rec := internalGet(t, cl, base, key, "")
	if code != http.StatusOK {
		return fmt.Sprintf("internal GET %d", code)
	}
	ms, l, n := hlc.Parts(rec.Version)
	return fmt.Sprintf("%q tombstone=%v version ms=%d logical=%d node=%d", rec.Value, rec.Tombstone, ms, l, n)
}

func TestTwoNodesOverlapRead(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 2)
	cl := testcluster.NewClient(t)
	for a := range 2 {
		b := 1 - a
		key := fmt.Sprintf("overlap-read-%d", a)
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(a), key, []byte("v1"), 1, 2))
		expectValue(t, cl, c.URL(a), key, 2, 2, "v1")
		expectValue(t, cl, c.URL(b), key, 2, 2, "v1")

		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(b), key, []byte("v2"), 1, 2))
		expectValue(t, cl, c.URL(a), key, 2, 2, "v2")
		expectValue(t, cl, c.URL(b), key, 2, 2, "v2")
	}
}

func TestTwoNodesOverlapWrite(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 2)
	cl := testcluster.NewClient(t)
	for a := range 2 {
		b := 1 - a
		key := fmt.Sprintf("overlap-write-%d", a)
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(a), key, []byte("v1"), 2, 2))
		expectValue(t, cl, c.URL(a), key, 1, 2, "v1")
		expectValue(t, cl, c.URL(b), key, 1, 2, "v1")

		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(b), key, []byte("v2"), 2, 2))
		expectValue(t, cl, c.URL(a), key, 1, 2, "v2")
		expectValue(t, cl, c.URL(b), key, 1, 2, "v2")
	}
}

func TestTwoNodesOverlapDelete(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 2)
	cl := testcluster.NewClient(t)
	for a := range 2 {
		key := fmt.Sprintf("overlap-delete-%d", a)
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(a), key, []byte("v"), 2, 2))
		require.Equal(t, http.StatusAccepted, cl.Delete(t, c.URL(a), key, 2, 2))
		for i := range 2 {
			expectAbsent(t, cl, c.URL(i), key, 1, 2)
		}
	}
}

// missed runs a scenario in which node i misses the last change: prepare
// runs with both nodes up, change runs through the other node while i is
// down (ack=1), then i comes back and GET 2/2 through i must see the change.
func missed(t *testing.T, prepare, change func(c *testcluster.Cluster, cl *testcluster.Client, via int, key string), check func(cl *testcluster.Client, base, key string)) {
	c := testcluster.Start(t, 2)
	cl := testcluster.NewClient(t)
	for i := range 2 {
		other := 1 - i
		key := fmt.Sprintf("missed-%d", i)
		if prepare != nil {
			prepare(c, cl, i, key)
		}
		c.StopNode(i)
		change(c, cl, other, key)
		c.StartNode(i)
		check(cl, c.URL(i), key)
	}
}

func TestTwoNodesMissedWrite(t *testing.T) {
	t.Parallel()
	missed(t, nil,
		func(c *testcluster.Cluster, cl *testcluster.Client, via int, key string) {
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(via), key, []byte("v"), 1, 2))
		},
		func(cl *testcluster.Client, base, key string) { expectValue(t, cl, base, key, 2, 2, "v") })
}

func TestTwoNodesMissedDelete(t *testing.T) {
	t.Parallel()
	missed(t,
		func(c *testcluster.Cluster, cl *testcluster.Client, via int, key string) {
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(via), key, []byte("v"), 2, 2))
		},
		func(c *testcluster.Cluster, cl *testcluster.Client, via int, key string) {
			require.Equal(t, http.StatusAccepted, cl.Delete(t, c.URL(via), key, 1, 2))
		},
		func(cl *testcluster.Client, base, key string) { expectAbsent(t, cl, base, key, 2, 2) })
}

func TestTwoNodesMissedOverwrite(t *testing.T) {
	t.Parallel()
	missed(t,
		func(c *testcluster.Cluster, cl *testcluster.Client, via int, key string) {
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(via), key, []byte("v1"), 2, 2))
		},
		func(c *testcluster.Cluster, cl *testcluster.Client, via int, key string) {
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(via), key, []byte("v2"), 1, 2))
		},
		func(cl *testcluster.Client, base, key string) { expectValue(t, cl, base, key, 2, 2, "v2") })
}

func TestTwoNodesMissedRecreate(t *testing.T) {
	t.Parallel()
	missed(t,
		func(c *testcluster.Cluster, cl *testcluster.Client, via int, key string) {
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(via), key, []byte("v1"), 2, 2))
			require.Equal(t, http.StatusAccepted, cl.Delete(t, c.URL(via), key, 2, 2))
		},
		func(c *testcluster.Cluster, cl *testcluster.Client, via int, key string) {
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(via), key, []byte("v2"), 1, 2))
		},
		func(cl *testcluster.Client, base, key string) { expectValue(t, cl, base, key, 2, 2, "v2") })
}

func TestTwoNodesTolerateFailure(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 2)
	cl := testcluster.NewClient(t)
	for down := range 2 {
		up := 1 - down
		key := fmt.Sprintf("tolerate-%d", down)
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(down), key, []byte("v"), 2, 2))
		c.StopNode(down)
		expectValue(t, cl, c.URL(up), key, 1, 2, "v")
		require.Equal(t, http.StatusAccepted, cl.Delete(t, c.URL(up), key, 1, 2))
		expectAbsent(t, cl, c.URL(up), key, 1, 2)
		c.StartNode(down)
		expectAbsent(t, cl, c.URL(down), key, 2, 2)
	}
}

// TestTwoNodesRespectRF: PUT 1/1 stores one copy, on the key's first replica
// (whichever node coordinates). Each node is then brought up alone: exactly
// one of them holds the key (checked on its local replica through the
// internal endpoint). A GET 1/1 through a node alone reads the key's first
// replica, not "the local one": it answers 200 on the owner and 504 on the
// other node (its only replica for from=1, the owner, is down).
func TestTwoNodesRespectRF(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 2)
	cl := testcluster.NewClient(t)
	p := placementOf(t, c)
	for owner := range 2 {
		for via := range 2 {
			key := findKey(t, p, fmt.Sprintf("rf-via%d", via), owner)
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(via), key, []byte("v"), 1, 1))

			c.StopAll()
			found := 0
			for alone := range 2 {
				c.StartNode(alone)
				code, rec := internalGet(t, cl, c.URL(alone), key, "")
				if alone == owner {
					require.Equal(t, http.StatusOK, code, "owner %d lacks %s", owner, key)
					require.Equal(t, "v", string(rec.Value))
					expectValue(t, cl, c.URL(alone), key, 1, 1, "v")
					found++
				} else {
					require.Equal(t, http.StatusNotFound, code, "node %d is not a replica of %s for from=1 but has it", alone, key)
					code, _ := cl.Get(t, c.URL(alone), key, 1, 1)
					require.Equal(t, http.StatusGatewayTimeout, code, "GET 1/1 via non-owner %d with the owner down", alone)
				}
				c.StopNode(alone)
			}
			require.Equal(t, 1, found)
			c.StartNode(0)
			c.StartNode(1)
		}
	}
}

// TestTwoNodesDistribute: PUT 1/1 through each node, for many keys: exactly
// one node stores each key, the key's first replica, and both nodes own
// some keys.
func TestTwoNodesDistribute(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 2)
	cl := testcluster.NewClient(t)
	p := placementOf(t, c)
	owned := [2]int{}
	for i := range 40 {
		via := i % 2
		key := fmt.Sprintf("distribute-%d", i)
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(via), key, []byte("v"), 1, 1))
		hs := holders(t, c, cl, key, "")
		require.Equal(t, replicasOf(p, key, 1), hs, "key %s via node %d", key, via)
		owned[hs[0]]++
	}
	require.Positive(t, owned[0])
	require.Positive(t, owned[1])
}

// TestLowerLimitsTakeAPeersBatch: a node whose --max-value-bytes is
// lower than its peers' (a rolling change of the flag) takes a peer's
// batch of many small writes (its batch body limit is at least the
// peers' batch size, rpc.DefaultMaxBatchBytes) and refuses only the
// write over its own limit; its batch-mates, other clients' writes, are
// stored. Both used to be refused as a whole, 413, and the coordinator
// kept no hint for a refusal.
func TestLowerLimitsTakeAPeersBatch(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 1, func(_ int, cfg *node.Config) { cfg.MaxValueBytes = 1024 })
	cl := testcluster.NewClient(t)
	version := hlc.VersionAt(time.Now())
	const small = 200
	var body []byte
	for i := range small {
		env := (&record.Record{Version: version, Value: make([]byte, 1000)}).Encode()
		body = rpc.AppendBatchOp(body, rpc.OpWrite, fmt.Appendf(nil, "k%d", i), env)
	}
	big := (&record.Record{Version: version, Value: make([]byte, 2000)}).Encode()
	body = rpc.AppendBatchOp(body, rpc.OpWrite, []byte("big"), big)
	require.Less(t, len(body), rpc.DefaultMaxBatchBytes, "a batch a peer sends")

	code, ans := internalBatch(t, cl, c.URL(0), body, "")
	require.Equal(t, http.StatusOK, code, "%s", ans)
	for i := range small {
		require.Equal(t, byte(rpc.ResApplied), ans[i], "write %d", i)
	}
	require.Equal(t, byte(rpc.ResRefused), ans[small], "the write over this node's limit")
	require.Contains(t, string(ans[small:]), "value of 2000 bytes, limit is 1024")

	code, rec := internalGet(t, cl, c.URL(0), "k7", "")
	require.Equal(t, http.StatusOK, code)
	require.Len(t, rec.Value, 1000)
	code, _ = internalGet(t, cl, c.URL(0), "big", "")
	require.Equal(t, http.StatusNotFound, code)
}

// TestTinyLimitsStillReplicate: with the smallest value and key limits a
// node accepts, replicated writes still go through: a node's batch body
// limit is at least the peers' batch size, whatever its value limit (a
// body limit of 1,088 bytes against batches of 256 KiB once made most
// empty PUTs answer 504).
func TestTinyLimitsStillReplicate(t *testing.T) {
	t.Parallel()
	for _, lim := range []struct{ key, value int }{{1024, 0}, {1, 0}, {1, 1}} {
		t.Run(fmt.Sprintf("key=%d,value=%d", lim.key, lim.value), func(t *testing.T) {
			c := testcluster.Start(t, 3, withReplicaTimeout(5*time.Second), func(_ int, cfg *node.Config) {
				cfg.MaxKeyBytes, cfg.MaxValueBytes = lim.key, lim.value
			})
			cl := testcluster.NewClient(t)
			var wg sync.WaitGroup
			codes := make(chan int, 200)
			for i := range 200 {
				// Concurrent, so that calls queue and go out as batches;
				// the generous replica timeout keeps a loaded machine's
				// slow moment from counting as the failure under test.
				wg.Go(func() {
					key := string(rune('a' + i%26))
					if lim.key > 1 {
						key = fmt.Sprintf("k%d", i)
					}
					codes <- cl.Put(t, c.URL(i%3), key, make([]byte, lim.value), 3, 3)
				})
			}
			wg.Wait()
			close(codes)
			for code := range codes {
				require.Equal(t, http.StatusCreated, code)
			}
			for _, st := range c.Repair(t, 0) { // summaries are not bound by the value limit
				require.Empty(t, st.Error)
			}
		})
	}
}

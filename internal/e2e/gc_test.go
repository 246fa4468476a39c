package e2e_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// withGC makes garbage collection quick to watch: a grace of one second
// (so the hint window and the skew bound shrink below it), a pass every
// 50 ms, no hints (only anti-entropy may carry the delete), exchanges only
// on demand.
func withGC() testcluster.Option {
	return func(_ int, cfg *node.Config) {
		cfg.GC.Grace = time.Second
		cfg.GC.Interval = 50 * time.Millisecond
		cfg.Handoff.Window = 100 * time.Millisecond
		cfg.Handoff.MaxBytes = 1
		cfg.MaxClockSkew = 500 * time.Millisecond
	}
}

// TestGCNoZombie is the failure Cassandra users hit when repair misses
// gc_grace: a value deleted while one replica was down must not come back
// after the others forgot the delete. Here:
//
//   - the delete reaches two replicas; the third is down and keeps the
//     value;
//   - past the grace, the two cannot collect the tombstone: their
//     exchanges with the missing replica fail;
//   - the replica returns; after exchanges with every peer, every node
//     collects the tombstone;
//   - the value is gone everywhere and stays gone: reads through every
//     node, a repair round, and a late write of the old value (a hint
//     replayed after the collection) do not bring it back.
func TestGCNoZombie(t *testing.T) {
	c := testcluster.Start(t, 3, withGC())
	cl := testcluster.NewClient(t)
	require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), "z", []byte("old"), 3, 3))
	require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), "keep", []byte("kept"), 3, 3))
	_, old := internalGet(t, cl, c.URL(2), "z", "")
	c.StopNode(2)
	require.Equal(t, http.StatusAccepted, cl.Delete(t, c.URL(0), "z", 2, 3))
	_, tomb := internalGet(t, cl, c.URL(0), "z", "")
	require.True(t, tomb.Tombstone)

	// The behaviour under test: past the grace, and the exchanges below
	// start more than the collector's lag after the delete
	// (--max-clock-skew 0.5 s + --replica-timeout 0.3 s + 1 s: gc.Options.Lag).
	time.Sleep(2500 * time.Millisecond)
	for i := range 2 {
		for _, st := range c.Repair(t, i) {
			if st.Peer == c.URL(2) {
				require.NotEmpty(t, st.Error, "node 2 is down")
			}
		}
		require.Zero(t, c.Node(i).CollectGarbage(), "node %d: a replica has not confirmed the delete", i)
		code, rec := internalGet(t, cl, c.URL(i), "z", "")
		require.Equal(t, http.StatusOK, code)
		require.True(t, rec.Tombstone, "node %d keeps the tombstone", i)
	}

	c.StartNode(2)
	for i := range 3 {
		for _, st := range c.Repair(t, i) {
			require.Empty(t, st.Error)
		}
	}
	for i := range 3 {
		testcluster.Eventually(t, 10*time.Second, fmt.Sprintf("node %d collected the tombstone", i), func() bool {
			return c.Metric(t, i, "dhtkv_gc_removed_total") == 1
		})
		require.Positive(t, c.Metric(t, i, "dhtkv_gc_horizon_timestamp_seconds"))
	}

	// The old value, delivered late (as a hinted write would be), is
	// refused: the replica answers as if it held something newer.
	code, ans := internalBatch(t, cl, c.URL(1), rpc.AppendBatchOp(nil, rpc.OpWrite, []byte("z"), old.Encode()), "")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, byte(rpc.ResNewer), ans[0], "a write older than the horizon is refused")
	for i := range 3 {
		for _, st := range c.Repair(t, i) {
			require.Empty(t, st.Error)
			require.Zero(t, st.Pulled+st.Pushed, "nothing left to exchange")
		}
	}
	for i := range 3 {
		for _, ack := range []int{1, 2, 3} {
			code, _ := cl.Get(t, c.URL(i), "z", ack, 3)
			require.Equal(t, http.StatusNotFound, code, "z through node %d with ack=%d", i, ack)
		}
		code, _ := internalGet(t, cl, c.URL(i), "z", "")
		require.Equal(t, http.StatusNotFound, code, "z on node %d", i)
		code, body := cl.Get(t, c.URL(i), "keep", 2, 3)
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, "kept", string(body), "live values are never collected")
	}
	// A new write is stored as usual.
	require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(2), "z", []byte("new"), 3, 3))
	code, body := cl.Get(t, c.URL(0), "z", 3, 3)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "new", string(body))
}

// TestGCAfterRestoreWithinGrace: a node restored from a backup taken
// before a delete, within the delete's grace, lacks the delete. The
// others' exchanges with it before the restore found it holding the
// tombstone, and counted on, they would collect the tombstone while it
// holds the value (a quorum read through it then answers the deleted
// value). The restored node runs another incarnation, so they do not:
//
//   - z is written to all three and node 1 takes a backup; z is deleted,
//     and nodes 0 and 2 exchange with node 1, which holds the tombstone;
//   - node 1 is restored from its backup and started, cut off (no
//     exchange can bring it the delete) or not (no exchange is run); it
//     holds z's value again;
//   - past the delete's grace, nodes 0 and 2 keep the tombstone: node 1
//     is silent, or answers with another incarnation;
//   - healed, an exchange carries the delete to node 1, and then every
//     node collects the tombstone; z is not found through any node.
func TestGCAfterRestoreWithinGrace(t *testing.T) {
	for _, cut := range casesToRun(t, []bool{true, false}) {
		t.Run(fmt.Sprintf("cut=%v", cut), func(t *testing.T) { gcAfterRestore(t, cut) })
	}
}

func gcAfterRestore(t *testing.T, cut bool) {
	testcluster.InBubble(t, func(t *testing.T) {
		const restored = 1
		c := testcluster.StartInMemory(t, 3, func(_ int, cfg *node.Config) {
			cfg.GC.Grace = 5 * time.Minute
			cfg.GC.Interval = 5 * time.Second
			cfg.Handoff.Window = 30 * time.Second
			cfg.MaxClockSkew = 500 * time.Millisecond
			cfg.AntiEntropy.Interval = 24 * time.Hour // exchanges on demand (Repair)
		})
		c.AwaitFormed(time.Minute)
		cl := c.Client()
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), "z", []byte("old"), 3, 3))
		// Complete as of now: z reached every replica (ack=3).
		require.NoError(t, c.Node(restored).Store().Checkpoint("/backup", time.Now(), 0))
		require.Equal(t, http.StatusAccepted, cl.Delete(t, c.URL(0), "z", 3, 3))
		// An exchange counts for the records that arrived before it
		// started, to the millisecond (the bubble's clock stands still
		// while anything runs): each round below begins a millisecond on.
		exchange := func(nodes ...int) {
			time.Sleep(time.Millisecond)
			for _, i := range nodes {
				for _, st := range c.Repair(i) {
					require.Empty(t, st.Error, "node %d", i)
				}
			}
		}
		exchange(0, 2)

		c.StopNode(restored)
		c.RestoreCheckpoint(restored, "/backup")
		if cut {
			c.Isolate(restored)
		}
		c.StartNode(restored)
		held := c.Replica(restored)
		require.Len(t, held, 1)
		require.Equal(t, "old", held[0].Value, "the backup's value")

		time.Sleep(6 * time.Minute) // the behaviour under test: past the delete's grace, passes every 5 s
		for _, i := range []int{0, 2} {
			require.Zero(t, c.Node(i).CollectGarbage(), "node %d", i)
			held = c.Replica(i)
			require.Len(t, held, 1, "node %d", i)
			require.True(t, held[0].Tombstone, "node %d keeps the tombstone", i)
		}

		c.Heal()
		exchange(0, 2)     // the tombstone to node 1
		exchange(restored) // node 1's, after it arrived
		for i := range 3 {
			testcluster.Eventually(t, time.Minute, fmt.Sprintf("node %d collected the tombstone", i), func() bool {
				return len(c.Replica(i)) == 0
			})
		}
		for i := range 3 {
			for _, ack := range []int{1, 2, 3} {
				code, body := cl.Get(t, c.URL(i), "z", ack, 3)
				require.Equal(t, http.StatusNotFound, code, "z through node %d with ack=%d: %q", i, ack, body)
			}
		}
	})
}

// TestGCExpired: an expired value is collected like a tombstone, from its
// expiry plus the grace, on a single node (no other replica to confirm).
func TestGCExpired(t *testing.T) {
	c := testcluster.Start(t, 1, withGC())
	cl := testcluster.NewClient(t)
	code, _ := cl.Do(t, http.MethodPut, testcluster.EntityURL(c.URL(0), "e", 0, 0)+"&ttl=1", []byte("v"))
	require.Equal(t, http.StatusCreated, code)
	require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), "l", []byte("v"), 0, 0))
	testcluster.Eventually(t, 10*time.Second, "the expired value collected", func() bool {
		return c.Metric(t, 0, "dhtkv_gc_removed_total") == 1
	})
	code, _ = cl.Get(t, c.URL(0), "e", 0, 0)
	require.Equal(t, http.StatusNotFound, code)
	code, _ = cl.Get(t, c.URL(0), "l", 0, 0)
	require.Equal(t, http.StatusOK, code)
}

package e2e_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/cluster"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// withHints makes hints quick to deliver and never repairs on reads, so
// that only hinted handoff can bring a replica back up to date.
func withHints(window time.Duration, maxBytes int64) testcluster.Option {
	return func(_ int, cfg *node.Config) {
		cfg.Handoff.Interval = 50 * time.Millisecond
		cfg.Handoff.Window = window
		cfg.Handoff.MaxBytes = maxBytes
		cfg.Coordinator.ReadRepair = cluster.RepairOff
	}
}

// TestHintedHandoff: writes acknowledged by two replicas while the third
// was down reach it once it is back, with no read and no rewrite, and the
// hints are gone afterwards; they survive the coordinator's restart too.
func TestHintedHandoff(t *testing.T) {
	c := testcluster.Start(t, 3, withHints(time.Hour, 64<<20))
	cl := testcluster.NewClient(t)
	c.StopNode(2)
	const n = 200
	for i := range n {
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(i%2), fmt.Sprintf("h%d", i), []byte(fmt.Sprint(i)), 2, 3))
	}
	// The call to the stopped replica may still be failing when the PUT
	// is acknowledged (by the two others): its hint follows.
	testcluster.Eventually(t, 10*time.Second, "one hint per write, for the replica that was down", func() bool {
		return c.Metric(t, 0, "dhtkv_hints_stored_total")+c.Metric(t, 1, "dhtkv_hints_stored_total") == n
	})
	require.Positive(t, c.Metric(t, 0, "dhtkv_hints_pending_bytes"))

	c.StopNode(0) // hints are durable: node 0 delivers its own after its restart
	c.StartNode(0)
	c.StartNode(2)
	testcluster.Eventually(t, 20*time.Second, "hints delivered", func() bool {
		return c.Metric(t, 0, "dhtkv_hints_pending_bytes")+c.Metric(t, 1, "dhtkv_hints_pending_bytes") == 0
	})
	for i := range n {
		code, rec := internalGet(t, cl, c.URL(2), fmt.Sprintf("h%d", i), "")
		require.Equal(t, http.StatusOK, code, "h%d reached node 2", i)
		require.Equal(t, fmt.Sprint(i), string(rec.Value))
	}
	require.Equal(t, float64(n), c.Metric(t, 0, "dhtkv_hints_replayed_total")+c.Metric(t, 1, "dhtkv_hints_replayed_total"))
}

// TestHintsBoundedByWindowAndCap: hints older than the window are dropped
// instead of delivered, and a target's hints never exceed the byte cap.
func TestHintsBoundedByWindowAndCap(t *testing.T) {
	t.Run("window", func(t *testing.T) {
		c := testcluster.Start(t, 2, withHints(time.Millisecond, 64<<20))
		cl := testcluster.NewClient(t)
		c.StopNode(1)
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), "old", []byte("v"), 1, 2))
		testcluster.Eventually(t, 10*time.Second, "hint dropped", func() bool {
			return c.Metric(t, 0, "dhtkv_hints_dropped_total", "reason", "window") == 1
		})
		c.StartNode(1)
		code, _ := internalGet(t, cl, c.URL(1), "old", "")
		require.Equal(t, http.StatusNotFound, code, "an expired hint is not delivered")
	})
	t.Run("cap", func(t *testing.T) {
		c := testcluster.Start(t, 2, withHints(time.Hour, 1000))
		cl := testcluster.NewClient(t)
		c.StopNode(1)
		for i := range 20 {
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), fmt.Sprintf("c%d", i), make([]byte, 100), 1, 2))
		}
		testcluster.Eventually(t, 10*time.Second, "every failed write hinted or dropped", func() bool {
			return c.Metric(t, 0, "dhtkv_hints_stored_total")+c.Metric(t, 0, "dhtkv_hints_dropped_total", "reason", "cap") == 20
		})
		require.LessOrEqual(t, c.Metric(t, 0, "dhtkv_hints_pending_bytes"), 1000.0)
		require.Positive(t, c.Metric(t, 0, "dhtkv_hints_dropped_total", "reason", "cap"))
	})
}

package e2e_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/pace"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// A node with the background pace on reports its factor and the
// scheduler's latency; a target nothing meets slows its background work
// to the floor, and with the pace off the factor stays 1.
func TestBackgroundPace(t *testing.T) {
	c := testcluster.Start(t, 2, func(i int, cfg *node.Config) {
		if i == 0 {
			// A scheduler latency no interval stays under: every interval
			// with enough samples halves the factor.
			cfg.Pace = pace.Options{Target: time.Nanosecond}
		}
	})
	// Requests make the scheduler latencies the governor reads.
	cl := testcluster.NewClient(t)
	require.Eventually(t, func() bool {
		for i := range 50 {
			_, _, _ = do(cl, http.MethodPut, testcluster.EntityURL(c.URL(0), string(testcluster.GenKey(i)), 1, 2), []byte("v"))
		}
		return c.Metric(t, 0, "dhtkv_background_pace_factor") == pace.Floor
	}, 30*time.Second, 10*time.Millisecond)
	require.Positive(t, c.Metric(t, 0, "dhtkv_background_pace_slowdowns_total"))
	require.Positive(t, c.Metric(t, 0, "dhtkv_background_pace_sched_latency_p99_seconds"))
	require.Equal(t, 1.0, c.Metric(t, 1, "dhtkv_background_pace_factor"), "off in the test cluster")
	require.Zero(t, c.Metric(t, 1, "dhtkv_background_pace_slowdowns_total"))
}

package loadgen

import (
	"context"
	"testing"
	"time"
)

// An interrupted constant-rate run (SIGINT/SIGTERM cancel Run's context:
// cmd/dhtkv-load) counted every slot of the window after the interruption
// as unsent, and recordUnsent put each into the histogram at
// max(gaveUp-intended, 0), clamped to 1µs: slots that were not even due
// yet dragged the percentiles to 1µs. Only slots due before the run gave
// up (the interruption's moment) are unsent.
func TestInterruptedRunDoesNotCountFutureSlots(t *testing.T) {
	l := newRequestLog()
	cfg := testConfig(startServer(t, okHandler(l)))
	cfg.Rate = 200
	cfg.Duration = 5 * time.Second
	cfg.Timeline = true
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	res, err := Run(ctx, cfg)
	noErr(t, err)
	t.Logf("requests %d unsent %d p50 %dµs p90 %dµs timeline points %d", res.Requests, res.Unsent, res.Latency.P50, res.Latency.P90, len(res.Timeline))
	ok(t, res.Unsent <= int64(cfg.Connections)+2, "unsent %d: slots due after the interruption were never due", res.Unsent)
	ok(t, res.Latency.P50 > 1, "p50 %dµs: the not-yet-due slots entered the histogram at 1µs", res.Latency.P50)
}

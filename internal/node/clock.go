package node

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dhtkv/dhtkv/internal/hlc"
)

// registerClock exports what the clock's persisted bound costs the
// requests (hlc.Stats): its writes, each waited for by the request that
// made it, and the requests that waited for another's write.
func registerClock(reg prometheus.Registerer, c *hlc.Clock) {
	counter := func(name, help string, f func(hlc.Stats) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return f(c.Stats()) })
	}
	reg.MustRegister(
		counter("dhtkv_clock_bound_writes_total",
			"Writes of the clock's persisted bound (a synced store write about every 50 ms under steady versions; hlc.PersistWindow), failed ones included.",
			func(s hlc.Stats) float64 { return float64(s.Renewals) }),
		counter("dhtkv_clock_bound_write_failures_total",
			"Writes of the clock's persisted bound that failed.",
			func(s hlc.Stats) float64 { return float64(s.Failed) }),
		counter("dhtkv_clock_bound_write_seconds_total",
			"Time spent writing the clock's persisted bound, each write waited for by the request that made it.",
			func(s hlc.Stats) float64 { return s.RenewalTime.Seconds() }),
		counter("dhtkv_clock_bound_waits_total",
			"Requests that waited for another's write of the clock's bound: their version was beyond the bound written (after a pause, for a version observed well ahead, or while the disk syncs slower than half the window).",
			func(s hlc.Stats) float64 { return float64(s.Waits) }),
		counter("dhtkv_clock_bound_wait_seconds_total",
			"Time requests spent waiting for another's write of the clock's bound.",
			func(s hlc.Stats) float64 { return s.WaitTime.Seconds() }),
	)
}

package gc

import "github.com/prometheus/client_golang/prometheus"

// metrics are garbage collection's instruments: records removed, and the
// horizon below which writes are dropped.
type metrics struct {
	removed prometheus.Counter
	read    prometheus.Counter
	horizon prometheus.Gauge
}

func newMetrics() *metrics {
	return &metrics{
		removed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dhtkv_gc_removed_total",
			Help: "Tombstones and expired values removed by garbage collection once every replica had them.",
		}),
		read: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dhtkv_gc_index_entries_read_total",
			Help: "Index entries garbage-collection passes read (--gc-rate paces them).",
		}),
		horizon: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dhtkv_gc_horizon_timestamp_seconds",
			Help: "The highest partition's garbage-collection horizon (Unix seconds): writes with older versions of keys of that partition that hold nothing are dropped. 0 until something was removed.",
		}),
	}
}

func (m *metrics) register(reg prometheus.Registerer) { reg.MustRegister(m.removed, m.read, m.horizon) }

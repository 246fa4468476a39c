package handoff

import "github.com/prometheus/client_golang/prometheus"

// metrics are hinted handoff's instruments, by peer.
type metrics struct {
	stored, replayed *prometheus.CounterVec
	dropped          *prometheus.CounterVec
	pending          *prometheus.GaugeVec
}

func newMetrics() *metrics {
	return &metrics{
		stored: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dhtkv_hints_stored_total",
			Help: "Hints stored for a replica whose write failed or timed out, by peer.",
		}, []string{"peer"}),
		replayed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dhtkv_hints_replayed_total",
			Help: "Hints delivered to their replica and deleted, by peer.",
		}, []string{"peer"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dhtkv_hints_dropped_total",
			Help: "Hints not kept or not delivered, by peer and reason (window: older than --hint-window; cap: over --hint-max-bytes; error: the store failed; left: the peer left the cluster; moved: a membership change moved the hint's partition away from the peer). Anti-entropy repairs what they carried, but for moved, which carry nothing the peer holds.",
		}, []string{"peer", "reason"}),
		pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dhtkv_hints_pending_bytes",
			Help: "Bytes of hints waiting for delivery, by peer.",
		}, []string{"peer"}),
	}
}

func (m *metrics) register(reg prometheus.Registerer) {
	reg.MustRegister(m.stored, m.replayed, m.dropped, m.pending)
}

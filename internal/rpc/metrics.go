package rpc

import "github.com/prometheus/client_golang/prometheus"

// Metrics are node-to-node traffic's instruments: the batches the client
// sends, and those the server refuses as late (Server.Late).
type Metrics struct {
	batchOps *prometheus.HistogramVec
	// Late counts the batches this node refused for arriving after their
	// sender's deadline (Server.Late).
	Late prometheus.Counter
}

// NewMetrics creates the instruments and registers them with reg (nil: not
// registered, still counted).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		batchOps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dhtkv_peer_batch_operations",
			Help:    "Replica operations per internal batch request sent, by peer.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11),
		}, []string{"peer"}),
		Late: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dhtkv_peer_batches_late_total",
			Help: "Internal batches this node received after their sender's deadline (X-Dhtkv-Deadline) and did not serve: sent while it was paused or stalled, and long given up by their sender.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.batchOps, m.Late)
	}
	return m
}

// batchOpsFor resolves one peer's histogram once, so a batch costs no label
// lookup. A nil *Metrics gives an unregistered one.
func (m *Metrics) batchOpsFor(peer string) prometheus.Observer {
	if m == nil {
		m = NewMetrics(nil)
	}
	return m.batchOps.WithLabelValues(peer)
}

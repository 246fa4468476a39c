package rpc

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the node-to-node client's instruments.
type Metrics struct {
	batchOps *prometheus.HistogramVec
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
	}
	if reg != nil {
		reg.MustRegister(m.batchOps)
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

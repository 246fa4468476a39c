package rpc

import "github.com/prometheus/client_golang/prometheus"

// Metrics are node-to-node traffic's instruments: the batches the client
// sends, the peers it holds silent (silent.go), and the batches the
// server refuses as late (Server.Late).
type Metrics struct {
	batchOps   *prometheus.HistogramVec
	silent     *prometheus.GaugeVec
	silences   *prometheus.CounterVec
	failedFast *prometheus.CounterVec
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
		silent: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dhtkv_peer_silent",
			Help: "1 while this node holds the peer silent: a batch went unanswered for half the replica timeout, and calls to the peer fail at once until it answers a ping.",
		}, []string{"peer"}),
		silences: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dhtkv_peer_silences_total",
			Help: "Times the peer turned silent (dhtkv_peer_silent).",
		}, []string{"peer"}),
		failedFast: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dhtkv_peer_calls_failed_fast_total",
			Help: "Replica calls failed without a request because the peer was silent (dhtkv_peer_silent): writes among them became hints.",
		}, []string{"peer"}),
		Late: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dhtkv_peer_batches_late_total",
			Help: "Internal batches this node received after their sender's deadline (X-Dhtkv-Deadline) and did not serve: sent while it was paused or stalled, and long given up by their sender.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.batchOps, m.silent, m.silences, m.failedFast, m.Late)
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

// silenceFor resolves one peer's silence instruments once. A nil
// *Metrics gives unregistered ones.
func (m *Metrics) silenceFor(peer string) *peerSilence {
	if m == nil {
		m = NewMetrics(nil)
	}
	return &peerSilence{
		gauge:      m.silent.WithLabelValues(peer),
		silences:   m.silences.WithLabelValues(peer),
		failedFast: m.failedFast.WithLabelValues(peer),
	}
}

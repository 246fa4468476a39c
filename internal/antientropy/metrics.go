package antientropy

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are anti-entropy's instruments: exchanges by result, their
// duration, keys repaired by direction, bytes by kind, and per peer what
// the last exchange found, when one last succeeded, and the running one's
// progress.
type metrics struct {
	exchanges   *prometheus.CounterVec
	duration    prometheus.Histogram
	keys        *prometheus.CounterVec
	bytes       *prometheus.CounterVec
	differing   *prometheus.GaugeVec
	lastSuccess *prometheus.GaugeVec
	progress    *prometheus.GaugeVec
}

func newMetrics() *metrics {
	m := &metrics{
		exchanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dhtkv_antientropy_exchanges_total",
			Help: "Anti-entropy exchanges this node started, by result (ok: nothing left differing; failed).",
		}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dhtkv_antientropy_exchange_duration_seconds",
			Help:    "Duration of one anti-entropy exchange with a peer.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 10), // 10 ms to 45 min
		}),
		keys: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dhtkv_antientropy_keys_total",
			Help: "Keys anti-entropy found differing, by direction (pulled: repaired here; pushed: repaired at the peer; failed: left differing).",
		}, []string{"direction"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dhtkv_antientropy_bytes_total",
			Help: "Bytes anti-entropy exchanged, by kind (summary: hashes and key lists; records: keys and envelopes pulled and pushed).",
		}, []string{"kind"}),
		differing: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dhtkv_antientropy_partitions_differing",
			Help: "Partitions whose hashes differed at the start of the last exchange with a peer.",
		}, []string{"peer"}),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dhtkv_antientropy_last_success_timestamp_seconds",
			Help: "When the last exchange with a peer that left nothing differing started (Unix seconds).",
		}, []string{"peer"}),
		progress: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dhtkv_antientropy_exchange_progress_ratio",
			Help: "How far the running (or last) exchange with a peer got, 0 to 1.",
		}, []string{"peer"}),
	}
	// The counters' label values are known: exported from the start, at
	// 0, so that panels show 0 before the first exchange, not "No data".
	// The per-peer gauges appear with a peer's first exchange: before it
	// there is nothing true to report (no success time, no differences
	// found).
	for _, r := range []string{"ok", "failed"} {
		m.exchanges.WithLabelValues(r)
	}
	for _, d := range []string{"pulled", "pushed", "failed"} {
		m.keys.WithLabelValues(d)
	}
	for _, k := range []string{"summary", "records"} {
		m.bytes.WithLabelValues(k)
	}
	return m
}

func (m *metrics) register(reg prometheus.Registerer) {
	reg.MustRegister(m.exchanges, m.duration, m.keys, m.bytes, m.differing, m.lastSuccess, m.progress)
}

// observeExchange counts one finished exchange.
func (m *metrics) observeExchange(st ExchangeStats, err error) {
	result := "ok"
	if err != nil {
		result = "failed"
	} else {
		m.lastSuccess.WithLabelValues(st.Peer).Set(float64(st.Started.UnixMilli()) / 1e3)
	}
	m.exchanges.WithLabelValues(result).Inc()
	m.duration.Observe(st.Duration.Seconds())
	m.keys.WithLabelValues("pulled").Add(float64(st.Pulled))
	m.keys.WithLabelValues("pushed").Add(float64(st.Pushed))
	m.keys.WithLabelValues("failed").Add(float64(st.Failed))
	m.bytes.WithLabelValues("summary").Add(float64(st.SummaryBytes))
	m.bytes.WithLabelValues("records").Add(float64(st.RecordBytes))
	m.differing.WithLabelValues(st.Peer).Set(float64(st.PartitionsDiffering))
}

package scan

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the range streams' instruments.
type Metrics struct {
	// Aborts counts streams ended before their last record, by reason
	// (AbortClientGone, ...).
	Aborts *prometheus.CounterVec
	// Records counts records streamed.
	Records prometheus.Counter
	// Releases counts the iterators streams released while their client
	// was not reading (BodyOptions.ReleaseAfter).
	Releases prometheus.Counter
}

// NewMetrics creates the instruments and registers them with reg (nil: not
// registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Aborts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dhtkv_scan_aborts_total",
			Help: "Range streams ended before their last record, by reason.",
		}, []string{"reason"}),
		Records: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dhtkv_scan_records_total",
			Help: "Records streamed by range scans.",
		}),
		Releases: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dhtkv_scan_iterator_releases_total",
			Help: "Iterators released by range streams whose client stopped reading (a write blocked past the release threshold, 100 ms by default).",
		}),
	}
	// Every reason is exported from the start, at 0: a panel or an
	// alert on a reason that never happened shows 0, not "No data".
	for _, reason := range []string{AbortClientGone, AbortClientTimeout, AbortSourceError, AbortShutdown} {
		m.Aborts.WithLabelValues(reason)
	}
	if reg != nil {
		reg.MustRegister(m.Aborts, m.Records, m.Releases)
	}
	return m
}

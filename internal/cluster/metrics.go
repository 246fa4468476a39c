package cluster

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dhtkv/dhtkv/internal/metrics"
	"github.com/dhtkv/dhtkv/internal/rpc"
)

// coordMetrics are the coordinator's instruments. They always exist (a
// coordinator without a registry counts into unregistered ones), so the
// request path has no nil checks.
type coordMetrics struct {
	replicaLat *prometheus.HistogramVec
	replicaErr *prometheus.CounterVec
	// stragglers counts replica calls still running when the coordinator
	// answered the client; they finish in the background.
	stragglers prometheus.Counter
	// hedgedReads counts reads that asked their spare replicas because the
	// first ack replicas had not all answered within the hedge delay.
	hedgedReads prometheus.Counter
	// inFlight is the number of replica calls started and not yet finished.
	inFlight prometheus.Gauge
	// repairs counts replicas written to by read repair, by mode
	// (blocking, async: the background queue) and result (ok, failed,
	// dropped: the queue was full).
	repairs *prometheus.CounterVec
	// failWait is the time failed writes waited before answering, for
	// their versions to be in every clock's past (Coordinator.failLate).
	failWait prometheus.Counter
}

func newCoordMetrics() *coordMetrics {
	m := &coordMetrics{
		replicaLat: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dhtkv_replica_request_duration_seconds",
			Help:    "Coordinator fan-out latency of one replica call, by peer and operation.",
			Buckets: metrics.LatencyBuckets(),
		}, []string{"peer", "op"}),
		replicaErr: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dhtkv_replica_failures_total",
			Help: "Failed replica calls, by peer, operation and reason (timeout, silent: failed without a request because the peer left a batch unanswered, or error).",
		}, []string{"peer", "op", "reason"}),
		stragglers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dhtkv_coordinator_stragglers_total",
			Help: "Replica calls still running when the coordinator answered; they complete in the background.",
		}),
		hedgedReads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dhtkv_coordinator_hedged_reads_total",
			Help: "Reads that asked their spare replicas after the hedge delay.",
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dhtkv_coordinator_replica_calls_in_flight",
			Help: "Replica calls started and not yet finished.",
		}),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dhtkv_read_repairs_total",
			Help: "Stale replicas written to by read repair, by mode (blocking before the reply, async in the background) and result (ok, failed, dropped when the queue was full).",
		}, []string{"mode", "result"}),
		failWait: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dhtkv_coordinator_failed_write_wait_seconds_total",
			Help: "Time failed writes waited before answering, until their version was --max-clock-skew in this node's past, so that a write begun after the failure beats it.",
		}),
	}
	// Every mode and result read repair counts is exported from the
	// start, at 0, so that the dashboard's panel shows 0 before the
	// first repair rather than "No data".
	for _, mr := range [][2]string{{"blocking", "ok"}, {"blocking", "failed"}, {"async", "ok"}, {"async", "failed"}, {"async", "dropped"}} {
		m.repairs.WithLabelValues(mr[0], mr[1])
	}
	return m
}

// register adds the instruments, and the hedge delay read at scrape time,
// to reg.
func (m *coordMetrics) register(reg prometheus.Registerer, hedgeDelay func() float64) {
	reg.MustRegister(m.replicaLat, m.replicaErr, m.stragglers, m.hedgedReads, m.inFlight, m.repairs, m.failWait)
	if hedgeDelay != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dhtkv_coordinator_read_hedge_delay_seconds",
			Help: "How long a read now waits for its first ack replicas before asking the others (adapts to the fastest peer's 95th-percentile read latency).",
		}, hedgeDelay))
	}
}

// callMetrics are one peer's instruments for one kind of call, resolved
// once per peer so that a call costs no label lookup.
type callMetrics struct {
	latency                prometheus.Observer
	timeouts, silent, errs prometheus.Counter
}

func (m *coordMetrics) calls(peer, op string) callMetrics {
	return callMetrics{
		latency:  m.replicaLat.WithLabelValues(peer, op),
		timeouts: m.replicaErr.WithLabelValues(peer, op, "timeout"),
		silent:   m.replicaErr.WithLabelValues(peer, op, "silent"),
		errs:     m.replicaErr.WithLabelValues(peer, op, "error"),
	}
}

// observe records one replica call that started at start and ended at end.
// A call failed because its peer is silent was never sent: it has no
// latency of the peer's to record.
func (cm callMetrics) observe(start, end time.Time, err error) {
	if errors.Is(err, rpc.ErrSilent) {
		cm.silent.Inc()
		return
	}
	cm.latency.Observe(end.Sub(start).Seconds())
	switch {
	case err == nil:
	case errors.Is(err, rpc.ErrTimeout):
		cm.timeouts.Inc()
	default:
		cm.errs.Inc()
	}
}

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
	// inFlight is the number of replica goroutines running.
	inFlight prometheus.Gauge
	// repairs counts replicas written to by read repair, by mode
	// (blocking, async: the background queue) and result (ok, failed,
	// dropped: the queue was full).
	repairs *prometheus.CounterVec
	// rebuilding is 1 while the local replica copies its share.
	rebuilding prometheus.Gauge
	// rebuildRecords counts records copied by rebuilds.
	rebuildRecords prometheus.Counter
	// formed is 1 once every peer has answered (rebuild.go).
	formed prometheus.Gauge
	// Anti-entropy (antientropy.go): exchanges by result, their duration,
	// keys repaired by direction, bytes by kind, and per peer what the last
	// exchange found, when one last succeeded, and the running one's
	// progress.
	aeExchanges   *prometheus.CounterVec
	aeDuration    prometheus.Histogram
	aeKeys        *prometheus.CounterVec
	aeBytes       *prometheus.CounterVec
	aeDiffering   *prometheus.GaugeVec
	aeLastSuccess *prometheus.GaugeVec
	aeProgress    *prometheus.GaugeVec
	// Garbage collection (gc.go): records removed, and the horizon below
	// which writes are dropped.
	gcRemoved prometheus.Counter
	gcHorizon prometheus.Gauge
	// Membership (view.go, move.go): the installed map's epoch; records
	// and bytes copied in for partitions gained; records dropped with
	// partitions no longer held.
	epoch       prometheus.Gauge
	moveRecords prometheus.Counter
	moveBytes   prometheus.Counter
	moveDropped prometheus.Counter
}

func newCoordMetrics() *coordMetrics {
	return &coordMetrics{
		replicaLat: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dhtkv_replica_request_duration_seconds",
			Help:    "Coordinator fan-out latency of one replica call, by peer and operation.",
			Buckets: metrics.LatencyBuckets(),
		}, []string{"peer", "op"}),
		replicaErr: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dhtkv_replica_failures_total",
			Help: "Failed replica calls, by peer, operation and reason (timeout or error).",
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
			Help: "Replica call goroutines currently running.",
		}),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dhtkv_read_repairs_total",
			Help: "Stale replicas written to by read repair, by mode (blocking before the reply, async in the background) and result (ok, failed, dropped when the queue was full).",
		}, []string{"mode", "result"}),
		rebuilding: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dhtkv_rebuilding",
			Help: "1 while this node copies its share from its peers after starting with an empty data directory; its replica is not read meanwhile.",
		}),
		rebuildRecords: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dhtkv_rebuild_records_total",
			Help: "Records copied from peers by rebuilds.",
		}),
		formed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dhtkv_cluster_formed",
			Help: "1 once this node has seen every other node answer: a member starting with an empty data directory from then on rebuilds before serving reads.",
		}),
		aeExchanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dhtkv_antientropy_exchanges_total",
			Help: "Anti-entropy exchanges this node started, by result (ok: nothing left differing; failed).",
		}, []string{"result"}),
		aeDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dhtkv_antientropy_exchange_duration_seconds",
			Help:    "Duration of one anti-entropy exchange with a peer.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 10), // 10 ms to 45 min
		}),
		aeKeys: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dhtkv_antientropy_keys_total",
			Help: "Keys anti-entropy found differing, by direction (pulled: repaired here; pushed: repaired at the peer; failed: left differing).",
		}, []string{"direction"}),
		aeBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dhtkv_antientropy_bytes_total",
			Help: "Bytes anti-entropy exchanged, by kind (summary: hashes and key lists; records: keys and envelopes pulled and pushed).",
		}, []string{"kind"}),
		aeDiffering: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dhtkv_antientropy_partitions_differing",
			Help: "Partitions whose hashes differed at the start of the last exchange with a peer.",
		}, []string{"peer"}),
		aeLastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dhtkv_antientropy_last_success_timestamp_seconds",
			Help: "When the last exchange with a peer that left nothing differing started (Unix seconds).",
		}, []string{"peer"}),
		gcRemoved: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dhtkv_gc_removed_total",
			Help: "Tombstones and expired values removed by garbage collection once every replica had them.",
		}),
		gcHorizon: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dhtkv_gc_horizon_timestamp_seconds",
			Help: "The garbage-collection horizon (Unix seconds): writes with older versions are dropped. 0 until something was removed.",
		}),
		aeProgress: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dhtkv_antientropy_exchange_progress_ratio",
			Help: "How far the running (or last) exchange with a peer got, 0 to 1.",
		}, []string{"peer"}),
		epoch: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dhtkv_cluster_map_epoch",
			Help: "The epoch of the cluster map this node has installed.",
		}),
		moveRecords: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dhtkv_membership_moved_records_total",
			Help: "Records copied to this node for partitions it gained in membership changes.",
		}),
		moveBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dhtkv_membership_moved_bytes_total",
			Help: "Bytes (records and summaries) exchanged to copy partitions this node gained in membership changes.",
		}),
		moveDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dhtkv_membership_dropped_records_total",
			Help: "Records deleted with partitions this node no longer holds after membership changes.",
		}),
	}
}

// observeExchange counts one finished anti-entropy exchange.
func (m *coordMetrics) observeExchange(st ExchangeStats, err error) {
	result := "ok"
	if err != nil {
		result = "failed"
	} else {
		m.aeLastSuccess.WithLabelValues(st.Peer).Set(float64(st.Started.UnixMilli()) / 1e3)
	}
	m.aeExchanges.WithLabelValues(result).Inc()
	m.aeDuration.Observe(st.Duration.Seconds())
	m.aeKeys.WithLabelValues("pulled").Add(float64(st.Pulled))
	m.aeKeys.WithLabelValues("pushed").Add(float64(st.Pushed))
	m.aeKeys.WithLabelValues("failed").Add(float64(st.Failed))
	m.aeBytes.WithLabelValues("summary").Add(float64(st.SummaryBytes))
	m.aeBytes.WithLabelValues("records").Add(float64(st.RecordBytes))
	m.aeDiffering.WithLabelValues(st.Peer).Set(float64(st.PartitionsDiffering))
}

// register adds the instruments, and the hedge delay read at scrape time,
// to reg.
func (m *coordMetrics) register(reg prometheus.Registerer, hedgeDelay func() float64) {
	reg.MustRegister(m.replicaLat, m.replicaErr, m.stragglers, m.hedgedReads, m.inFlight, m.repairs, m.rebuilding, m.rebuildRecords, m.formed,
		m.aeExchanges, m.aeDuration, m.aeKeys, m.aeBytes, m.aeDiffering, m.aeLastSuccess, m.aeProgress, m.gcRemoved, m.gcHorizon,
		m.epoch, m.moveRecords, m.moveBytes, m.moveDropped)
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
	latency        prometheus.Observer
	timeouts, errs prometheus.Counter
}

func (m *coordMetrics) calls(peer, op string) callMetrics {
	return callMetrics{
		latency:  m.replicaLat.WithLabelValues(peer, op),
		timeouts: m.replicaErr.WithLabelValues(peer, op, "timeout"),
		errs:     m.replicaErr.WithLabelValues(peer, op, "error"),
	}
}

// observe records one replica call that started at start and returns the
// time it ended.
func (cm callMetrics) observe(start time.Time, err error) time.Time {
	end := time.Now()
	cm.latency.Observe(end.Sub(start).Seconds())
	switch {
	case err == nil:
	case errors.Is(err, rpc.ErrTimeout):
		cm.timeouts.Inc()
	default:
		cm.errs.Inc()
	}
	return end
}

// handoffMetrics are hinted handoff's instruments (handoff.go), by peer.
type handoffMetrics struct {
	stored, replayed *prometheus.CounterVec
	dropped          *prometheus.CounterVec
	pending          *prometheus.GaugeVec
}

func newHandoffMetrics() *handoffMetrics {
	return &handoffMetrics{
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
			Help: "Hints not kept or not delivered, by peer and reason (window: older than --hint-window; cap: over --hint-max-bytes; error: the store failed). Anti-entropy repairs what they carried.",
		}, []string{"peer", "reason"}),
		pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dhtkv_hints_pending_bytes",
			Help: "Bytes of hints waiting for delivery, by peer.",
		}, []string{"peer"}),
	}
}

func (m *handoffMetrics) register(reg prometheus.Registerer) {
	reg.MustRegister(m.stored, m.replayed, m.dropped, m.pending)
}

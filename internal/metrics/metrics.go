// Package metrics holds a node's Prometheus registry and the instruments the
// request path updates. Each node has its own registry (tests run several
// nodes in one process); it is served on the admin listener at /metrics.
//
// Counters that the hot path touches are resolved once at start-up into
// arrays indexed by operation and status, so a request costs two atomic adds
// and a histogram observation, with no label hashing.
package metrics

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Op is a kind of request, a label value of the request metrics.
type Op int

const (
	OpGet Op = iota
	OpPut
	OpDelete
	OpStatus
	OpScan
	OpInternalBatch
	OpInternalScan
	OpOther
	nOps
)

var opNames = [nOps]string{"get", "put", "delete", "status", "scan", "internal_batch", "internal_scan", "other"}

func (o Op) String() string { return opNames[o] }

// codes are the statuses the API answers with; others are counted through
// the slow path.
var codes = []int{200, 201, 202, 400, 403, 404, 405, 413, 500, 503, 504}

// Metrics is one node's set of instruments.
type Metrics struct {
	Registry *prometheus.Registry

	requests   *prometheus.CounterVec
	reqFast    [nOps][]prometheus.Counter // by codes index
	latency    [nOps]prometheus.Observer
	replicaLat *prometheus.HistogramVec
	replicaErr *prometheus.CounterVec
	batchOps   *prometheus.HistogramVec

	// Stragglers counts replica calls still running when the coordinator
	// answered the client; they finish in the background.
	Stragglers prometheus.Counter
	// HedgedReads counts reads that asked their spare replicas because the
	// first ack replicas had not all answered within the hedge delay.
	HedgedReads prometheus.Counter
	// InFlightReplicaCalls is the number of replica goroutines running.
	InFlightReplicaCalls prometheus.Gauge
	// ScanAborts counts range streams ended early (client gone, error).
	ScanAborts *prometheus.CounterVec
	// ScanRecords counts records streamed by range scans.
	ScanRecords prometheus.Counter
}

// New creates the instruments and registers them, the Go runtime and process
// collectors on a fresh registry.
func New() *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{Registry: reg}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dhtkv_requests_total",
		Help: "HTTP requests answered, by operation and status code.",
	}, []string{"op", "code"})
	lat := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "dhtkv_request_duration_seconds",
		Help: "Time from parsed request to response ready, by operation.",
		// 50µs .. ~3.3s: a cache hit is tens of µs, a synced write ~0.3ms+,
		// a replica timeout hundreds of ms.
		Buckets: prometheus.ExponentialBuckets(50e-6, 2, 17),
	}, []string{"op"})
	m.replicaLat = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "dhtkv_replica_request_duration_seconds",
		Help:    "Coordinator fan-out latency of one replica call, by peer and operation.",
		Buckets: prometheus.ExponentialBuckets(50e-6, 2, 17),
	}, []string{"peer", "op"})
	m.replicaErr = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dhtkv_replica_failures_total",
		Help: "Failed replica calls, by peer, operation and reason (timeout or error).",
	}, []string{"peer", "op", "reason"})
	m.batchOps = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "dhtkv_peer_batch_operations",
		Help:    "Replica operations per internal batch request sent, by peer.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 11),
	}, []string{"peer"})
	m.Stragglers = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "dhtkv_coordinator_stragglers_total",
		Help: "Replica calls still running when the coordinator answered; they complete in the background.",
	})
	m.HedgedReads = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "dhtkv_coordinator_hedged_reads_total",
		Help: "Reads that asked their spare replicas after the hedge delay.",
	})
	m.InFlightReplicaCalls = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "dhtkv_coordinator_replica_calls_in_flight",
		Help: "Replica call goroutines currently running.",
	})
	m.ScanAborts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dhtkv_scan_aborts_total",
		Help: "Range streams ended before their last record, by reason.",
	}, []string{"reason"})
	m.ScanRecords = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "dhtkv_scan_records_total",
		Help: "Records streamed by range scans.",
	})
	for op := Op(0); op < nOps; op++ {
		m.latency[op] = lat.WithLabelValues(op.String())
		m.reqFast[op] = make([]prometheus.Counter, len(codes))
		for i, c := range codes {
			m.reqFast[op][i] = m.requests.WithLabelValues(op.String(), strconv.Itoa(c))
		}
	}
	reg.MustRegister(m.requests, lat, m.replicaLat, m.replicaErr, m.batchOps, m.Stragglers, m.HedgedReads,
		m.InFlightReplicaCalls, m.ScanAborts, m.ScanRecords,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Request records one answered request. A nil *Metrics records nothing.
func (m *Metrics) Request(op Op, code int, elapsed time.Duration) {
	if m == nil {
		return
	}
	m.latency[op].Observe(elapsed.Seconds())
	for i, c := range codes {
		if c == code {
			m.reqFast[op][i].Inc()
			return
		}
	}
	m.requests.WithLabelValues(op.String(), strconv.Itoa(code)).Inc()
}

// RegisterHedgeDelay exports the coordinator's current read hedge delay,
// read at scrape time.
func (m *Metrics) RegisterHedgeDelay(delay func() float64) {
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "dhtkv_coordinator_read_hedge_delay_seconds",
		Help: "How long a read now waits for its first ack replicas before asking the others (adapts to the fastest peer's 95th-percentile read latency).",
	}, delay))
}

// PeerMetrics are the per-peer instruments, resolved once per peer.
type PeerMetrics struct {
	GetLatency, PutLatency   prometheus.Observer
	GetTimeouts, PutTimeouts prometheus.Counter
	GetErrors, PutErrors     prometheus.Counter
	// BatchOps observes how many operations each batch sent carried.
	BatchOps prometheus.Observer
}

// Peer resolves the instruments for one peer URL. A nil *Metrics returns nil.
func (m *Metrics) Peer(url string) *PeerMetrics {
	if m == nil {
		return nil
	}
	return &PeerMetrics{
		GetLatency:  m.replicaLat.WithLabelValues(url, "get"),
		PutLatency:  m.replicaLat.WithLabelValues(url, "put"),
		GetTimeouts: m.replicaErr.WithLabelValues(url, "get", "timeout"),
		PutTimeouts: m.replicaErr.WithLabelValues(url, "put", "timeout"),
		GetErrors:   m.replicaErr.WithLabelValues(url, "get", "error"),
		PutErrors:   m.replicaErr.WithLabelValues(url, "put", "error"),
		BatchOps:    m.batchOps.WithLabelValues(url),
	}
}

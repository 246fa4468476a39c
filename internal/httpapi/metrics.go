package httpapi

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dhtkv/dhtkv/internal/metrics"
	"github.com/dhtkv/dhtkv/internal/scan"
)

// Op is a kind of request, a label value of the request metrics.
type Op int

// The kinds of request, by path and method.
const (
	OpGet Op = iota
	OpPut
	OpDelete
	OpStatus
	OpScan
	OpInternalBatch
	OpInternalScan
	OpInternalSummary
	OpInternalMap
	OpInternalReach
	OpInternalLog
	OpHead
	OpOther
	nOps
)

var opNames = [nOps]string{"get", "put", "delete", "status", "scan", "internal_batch", "internal_scan", "internal_summary", "internal_map", "internal_reach", "internal_maplog", "head", "other"}

func (o Op) String() string { return opNames[o] }

// codes are the statuses the API answers with; others are counted through
// the slow path.
var codes = []int{101, 200, 201, 202, 304, 400, 403, 404, 405, 409, 413, 500, 503, 504}

// Metrics are the request instruments. The counters the hot path touches
// are resolved once into arrays indexed by operation and status, so a
// request costs two atomic adds and a histogram observation, with no label
// hashing.
type Metrics struct {
	requests *prometheus.CounterVec
	reqFast  [nOps][]prometheus.Counter // by codes index
	latency  [nOps]prometheus.Observer
	// Scan counts the range streams' records and aborts.
	Scan *scan.Metrics
}

// NewMetrics creates the instruments and registers them with reg (nil: not
// registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dhtkv_requests_total",
		Help: "HTTP requests answered, by operation and status code.",
	}, []string{"op", "code"})
	lat := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "dhtkv_request_duration_seconds",
		Help:    "Time from parsed request to response ready, by operation.",
		Buckets: metrics.LatencyBuckets(),
	}, []string{"op"})
	for op := Op(0); op < nOps; op++ {
		m.latency[op] = lat.WithLabelValues(op.String())
		m.reqFast[op] = make([]prometheus.Counter, len(codes))
		for i, c := range codes {
			m.reqFast[op][i] = m.requests.WithLabelValues(op.String(), strconv.Itoa(c))
		}
	}
	m.Scan = scan.NewMetrics(reg)
	if reg != nil {
		reg.MustRegister(m.requests, lat)
	}
	return m
}

// Register adds the gauges of what the server holds against its caps,
// read at scrape time: request body buffers against
// --max-inflight-body-bytes, values being sent against
// --max-inflight-response-bytes, range streams against --max-scans.
func (s *Server) Register(reg prometheus.Registerer) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dhtkv_request_body_bytes",
			Help: "Bytes of the buffers holding the bodies of requests in flight (charged against --max-inflight-body-bytes; 503 beyond).",
		}, func() float64 { return float64(s.bodyBytes.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dhtkv_request_body_max_bytes",
			Help: "The budget of request body buffers (--max-inflight-body-bytes); 0: none.",
		}, func() float64 { return float64(s.Limits.MaxInflightBodyBytes) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dhtkv_response_held_bytes",
			Help: "Bytes of the values answered by reference and not yet written to their clients (charged against --max-inflight-response-bytes; 503 beyond).",
		}, func() float64 { return float64(s.heldBytes.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dhtkv_response_held_max_bytes",
			Help: "The budget of values being sent (--max-inflight-response-bytes); 0: none.",
		}, func() float64 { return float64(s.Limits.MaxInflightResponseBytes) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dhtkv_scans_open",
			Help: "Range streams in flight, public and internal (429 beyond --max-scans).",
		}, func() float64 { return float64(s.scans.open()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dhtkv_scans_max",
			Help: "The cap on range streams in flight (--max-scans).",
		}, func() float64 { return float64(s.maxScans()) }),
	)
}

// Request records one answered request.
func (m *Metrics) Request(op Op, code int, elapsed time.Duration) {
	m.latency[op].Observe(elapsed.Seconds())
	for i, c := range codes {
		if c == code {
			m.reqFast[op][i].Inc()
			return
		}
	}
	m.requests.WithLabelValues(op.String(), strconv.Itoa(code)).Inc()
}

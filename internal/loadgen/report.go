package loadgen

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// ErrorCounts are the transport errors of a run, split like wrk's socket
// errors.
type ErrorCounts struct {
	Connect int64 `json:"connect"`
	Timeout int64 `json:"timeout"`
	Other   int64 `json:"other"`
}

// LatencySummary holds the reported percentiles in microseconds. A struct
// rather than a map keeps the JSON keys in percentile order.
type LatencySummary struct {
	P50    int64   `json:"50"`
	P75    int64   `json:"75"`
	P90    int64   `json:"90"`
	P99    int64   `json:"99"`
	P999   int64   `json:"99.9"`
	P9999  int64   `json:"99.99"`
	P99999 int64   `json:"99.999"`
	P100   int64   `json:"100"`
	Mean   float64 `json:"mean"`
	StdDev float64 `json:"stddev"`
}

// reportPercentiles are the rows of the latency table, as in wrk2.
var reportPercentiles = []float64{50, 75, 90, 99, 99.9, 99.99, 99.999, 100}

// spectrumTicks is the number of percentile steps per halving of the
// distance to 100%: wrk2's detailed spectrum (hdr_percentiles_print with
// 5 ticks) gives 10 rows up to 50%, 5 more up to 75%, and so on.
const spectrumTicks = 5

// SpectrumPoint is one row of the detailed percentile spectrum: Percentile
// percent of the recorded requests took at most US microseconds, and
// TotalCount of them did (wrk2's Value, Percentile as a percentage, and
// TotalCount columns).
type SpectrumPoint struct {
	Percentile float64 `json:"percentile"`
	US         int64   `json:"us"`
	TotalCount int64   `json:"total_count"`
}

// Result is the outcome of a run. Its JSON form is parsed by other tools:
// field names are a stable interface.
type Result struct {
	Mode          string           `json:"mode"`
	Workload      string           `json:"workload"`
	Dist          string           `json:"dist"`
	Targets       []string         `json:"targets"`
	Connections   int              `json:"connections"`
	Rate          float64          `json:"rate"`
	DurationS     float64          `json:"duration_s"` // measured, not configured
	Keyspace      uint64           `json:"keyspace"`
	ValueSize     int              `json:"value_size"`
	Ack           int              `json:"ack"`
	From          int              `json:"from"`
	Requests      int64            `json:"requests"`
	ThroughputRPS float64          `json:"throughput_rps"`
	Status        map[string]int64 `json:"status"`
	Non2xx        int64            `json:"non_2xx"`
	Errors        ErrorCounts      `json:"errors"`
	Latency       LatencySummary   `json:"latency_us"`
	// LatencyByOp is a mixed workload's Latency for its GETs ("get") and
	// PUTs ("put") apart; absent for the other workloads. It holds the
	// requests sent only: an unsent slot (Unsent) had no operation drawn
	// yet, so it counts in Latency and not here, and a run with unsent
	// slots is judged by Latency.
	LatencyByOp map[string]LatencySummary `json:"latency_by_op_us,omitempty"`
	// Spectrum is the whole latency distribution, from 0% to 100%, at
	// wrk2's percentile steps; empty when nothing was recorded.
	Spectrum []SpectrumPoint `json:"latency_spectrum_us"`
	// Unsent counts constant-rate requests scheduled inside the measured
	// window that were never sent (drain limit reached or run interrupted).
	// It is omitted when zero so that the usual output is exactly the schema.
	Unsent int64 `json:"unsent,omitempty"`
	// Timeline is the run second by second (Config.Timeline; absent
	// without it).
	Timeline []TimelinePoint `json:"timeline,omitempty"`
	// Marked sums up the requests of Config.Mark's window; absent when
	// it was never opened.
	Marked *MarkedWindow `json:"marked,omitempty"`

	cfg  Config
	hist *hdrhistogram.Histogram
	// What the vegeta report needs beyond the rest (see recorder).
	errText           [numErrKinds]string
	bytesIn, bytesOut int64
	first, last, end  time.Time
}

// ErrorCount is the number of requests that got no HTTP answer.
func (r *Result) ErrorCount() int64 {
	return r.Errors.Connect + r.Errors.Timeout + r.Errors.Other
}

// ServerErrors counts 5xx answers: those mean the system failed a request,
// unlike a 404 on a GET, which is a valid answer.
func (r *Result) ServerErrors() int64 {
	var n int64
	for code, c := range r.Status {
		if v, err := strconv.Atoi(code); err == nil && v >= 500 {
			n += c
		}
	}
	return n
}

// Succeeded counts the requests the system served: 2xx answers, and 404,
// which is a valid answer to a GET of an absent key. Anything else (no
// answer, 5xx, another 4xx such as a bad ack or an oversized value) is a
// failure.
func (r *Result) Succeeded() int64 {
	var n int64
	for code, c := range r.Status {
		if v, err := strconv.Atoi(code); err == nil && (v/100 == 2 || v == 404) {
			n += c
		}
	}
	return n
}

// newResult builds the report of a run from its merged recorder; origin is
// the start of the measured window.
func newResult(cfg Config, rec *recorder, origin time.Time, elapsed time.Duration, unsent int64) *Result {
	r := &Result{
		Mode:        cfg.Mode(),
		Workload:    string(cfg.Workload),
		Dist:        string(cfg.Dist),
		Targets:     append([]string(nil), cfg.Targets...),
		Connections: cfg.Connections,
		Rate:        cfg.Rate,
		DurationS:   roundTo(elapsed.Seconds(), 3),
		Keyspace:    cfg.Keyspace,
		ValueSize:   cfg.ValueSize,
		Ack:         cfg.Ack,
		From:        cfg.From,
		Requests:    rec.requests,
		Status:      map[string]int64{},
		Errors: ErrorCounts{
			Connect: rec.errs[errConnect],
			Timeout: rec.errs[errTimeout],
			Other:   rec.errs[errOther],
		},
		Spectrum: spectrum(rec.hist),
		Unsent:   unsent,
		Timeline: timelinePoints(rec, min(elapsed, cfg.Duration)),
		Marked:   markedWindow(cfg.Mark, rec, origin),
		cfg:      cfg,
		hist:     rec.hist,
		errText:  rec.errText,
		bytesIn:  rec.bytesIn, bytesOut: rec.bytesOut,
		first: rec.first, last: rec.last, end: rec.end,
	}
	if elapsed > 0 {
		r.ThroughputRPS = roundTo(float64(rec.requests)/elapsed.Seconds(), 2)
	}
	for code, n := range rec.status {
		if n == 0 {
			continue
		}
		r.Status[strconv.Itoa(code)] = n
		if code < 200 || code > 299 {
			r.Non2xx += n
		}
	}
	r.Latency = summarize(rec.hist)
	r.LatencyByOp = rec.ops.summaries()
	return r
}

// summarize is h's reported percentiles.
func summarize(h *hdrhistogram.Histogram) LatencySummary {
	v := h.ValueAtPercentilesSlice(reportPercentiles)
	return LatencySummary{
		P50: v[0], P75: v[1], P90: v[2], P99: v[3],
		P999: v[4], P9999: v[5], P99999: v[6], P100: v[7],
		Mean: roundTo(h.Mean(), 1), StdDev: roundTo(h.StdDev(), 1),
	}
}

// spectrum is h's detailed percentile spectrum, the rows wrk2 --latency
// prints; never nil, so that the JSON has [] rather than null.
func spectrum(h *hdrhistogram.Histogram) []SpectrumPoint {
	out := []SpectrumPoint{}
	if h.TotalCount() == 0 {
		return out
	}
	for _, b := range h.CumulativeDistributionWithTicks(spectrumTicks) {
		out = append(out, SpectrumPoint{Percentile: b.Quantile, US: b.ValueAt, TotalCount: b.Count})
	}
	return out
}

// roundTo rounds to the given number of decimals: the JSON carries no more
// precision than the measurement has.
func roundTo(f float64, decimals int) float64 {
	p := math.Pow10(decimals)
	return math.Round(f*p) / p
}

// WriteJSON writes the result as one JSON object on one line.
func (r *Result) WriteJSON(w io.Writer) error {
	if err := json.NewEncoder(w).Encode(r); err != nil {
		return fmt.Errorf("write json result: %w", err)
	}
	return nil
}

// WriteText writes the result in wrk2's layout so that figures can be read
// side by side with wrk2 runs.
func (r *Result) WriteText(w io.Writer) error {
	return r.writeText(w, false)
}

// writeText is WriteText, and WriteWrk2 with withSpectrum.
func (r *Result) writeText(w io.Writer, withSpectrum bool) error {
	var b strings.Builder
	more := ""
	if len(r.Targets) > 1 {
		more = fmt.Sprintf(" (+%d more)", len(r.Targets)-1)
	}
	fmt.Fprintf(&b, "Running %v test @ %s%s\n", r.cfg.Duration, r.Targets[0], more)
	fmt.Fprintf(&b, "  %s\n", r.describe())
	b.WriteString("  Latency Distribution (HdrHistogram - Recorded Latency)\n")
	l := r.Latency
	for i, us := range []int64{l.P50, l.P75, l.P90, l.P99, l.P999, l.P9999, l.P99999, l.P100} {
		fmt.Fprintf(&b, "%7.3f%%%10s\n", reportPercentiles[i], fmtMS(us))
	}
	writeByOp(&b, "  ", r.LatencyByOp)
	if withSpectrum {
		if err := r.writeSpectrum(&b); err != nil {
			return err
		}
	}
	fmt.Fprintf(&b, "  %d requests in %.2fs\n", r.Requests, r.DurationS)
	fmt.Fprintf(&b, "  Requests/sec: %9.2f\n", r.ThroughputRPS)
	b.WriteString("  Status:")
	for code, n := range r.statusByCode() {
		if n > 0 {
			fmt.Fprintf(&b, " %d=%d", code, n)
		}
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "  Non-2xx responses: %d\n", r.Non2xx)
	fmt.Fprintf(&b, "  Socket errors: connect %d, timeout %d, other %d\n",
		r.Errors.Connect, r.Errors.Timeout, r.Errors.Other)
	if r.Unsent > 0 {
		fmt.Fprintf(&b, "  Unsent: %d scheduled requests never sent (drain limit %v reached, or the run interrupted); the latencies count each from when it was due to when it was given up\n", r.Unsent, r.cfg.Drain)
	}
	if m := r.Marked; m != nil {
		to := "the end"
		if m.ToS != nil {
			to = fmt.Sprintf("%.1fs", *m.ToS)
		}
		fmt.Fprintf(&b, "  Marked window %.1fs to %s: %d requests, %d failed; p50 %s, p99 %s, p99.9 %s, max %s\n",
			m.FromS, to, m.Requests, m.Failures, fmtMS(m.Latency.P50), fmtMS(m.Latency.P99), fmtMS(m.Latency.P999), fmtMS(m.Latency.P100))
		writeByOp(&b, "    ", m.LatencyByOp)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write text result: %w", err)
	}
	return nil
}

// writeByOp writes a line for each operation of a mix (ops), GETs first.
func writeByOp(b *strings.Builder, indent string, ops map[string]LatencySummary) {
	for _, name := range []string{"get", "put"} {
		if l, ok := ops[name]; ok {
			fmt.Fprintf(b, "%s%s: p50 %s, p90 %s, p99 %s, p99.9 %s, max %s\n", indent, strings.ToUpper(name),
				fmtMS(l.P50), fmtMS(l.P90), fmtMS(l.P99), fmtMS(l.P999), fmtMS(l.P100))
		}
	}
}

// describe is the settings line under the header.
func (r *Result) describe() string {
	c := &r.cfg
	wl := string(c.Workload)
	if c.Workload == WorkloadMixed {
		wl = fmt.Sprintf("mixed (read ratio %.2f)", c.ReadRatio)
	}
	dist := string(c.Dist)
	if c.Dist == DistZipf {
		dist = fmt.Sprintf("zipf (s=%g, v=%g)", c.ZipfS, c.ZipfV)
	}
	mode := "closed loop"
	if c.Rate > 0 {
		mode = fmt.Sprintf("rate %g/s (constant)", c.Rate)
	}
	s := fmt.Sprintf("workload %s, dist %s, keyspace %d, value %d B, %d connections, %s, ack/from %s/%s",
		wl, dist, c.Keyspace, c.ValueSize, c.Connections, mode, orDash(c.Ack), orDash(c.From))
	if c.Warmup > 0 {
		s += fmt.Sprintf(", warm-up %v", c.Warmup)
	}
	return s
}

// statusByCode returns the status counts indexed by code, in code order.
func (r *Result) statusByCode() []int64 {
	out := make([]int64, maxStatus)
	for k, n := range r.Status {
		if code, err := strconv.Atoi(k); err == nil && code >= 0 && code < maxStatus {
			out[code] = n
		}
	}
	return out
}

func orDash(n int) string {
	if n == 0 {
		return "-"
	}
	return strconv.Itoa(n)
}

// fmtMS renders microseconds as wrk2 does for typical server latencies.
func fmtMS(us int64) string {
	return fmt.Sprintf("%.2fms", float64(us)/1000)
}

// timelinePoints is rec's timeline, nil when it kept none: a point for
// every second of the measured window as it lasted (window), those
// without a recorded request included.
func timelinePoints(rec *recorder, window time.Duration) []TimelinePoint {
	if rec.timeline == nil {
		return nil
	}
	pts := rec.timeline.points()
	for n := int((window + time.Second - 1) / time.Second); len(pts) < n; {
		pts = append(pts, TimelinePoint{Second: len(pts)})
	}
	return pts
}

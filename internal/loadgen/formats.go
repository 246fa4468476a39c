package loadgen

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// Output names a report format (dhtkv-load --output).
type Output string

// The report formats Result.Write knows.
const (
	// OutputText is wrk2's summary: the settings, the latency table at
	// wrk2's eight percentiles, throughput, statuses and errors.
	OutputText Output = "text"
	// OutputWrk2 is OutputText with the detailed percentile spectrum that
	// wrk2 --latency prints after the table, byte for byte in wrk2's
	// layout (so HdrHistogram's plotter and wrk2 parsers read it).
	OutputWrk2 Output = "wrk2"
	// OutputJSON is dhtkv-load's own JSON: one Result object on one line.
	OutputJSON Output = "json"
	// OutputVegeta is the object vegeta report -type=json prints, with
	// vegeta's field names, units and definitions (see VegetaMetrics).
	OutputVegeta Output = "vegeta"
)

// Outputs lists the report formats in the order usage messages name them.
var Outputs = []Output{OutputText, OutputWrk2, OutputJSON, OutputVegeta}

// ParseOutput checks a format name.
func ParseOutput(s string) (Output, error) {
	for _, o := range Outputs {
		if string(o) == s {
			return o, nil
		}
	}
	return "", fmt.Errorf("output %q: must be text, wrk2, json or vegeta", s)
}

// Write writes the result in format o.
func (r *Result) Write(w io.Writer, o Output) error {
	switch o {
	case OutputText:
		return r.WriteText(w)
	case OutputWrk2:
		return r.WriteWrk2(w)
	case OutputJSON:
		return r.WriteJSON(w)
	case OutputVegeta:
		return r.WriteVegeta(w)
	}
	return fmt.Errorf("write result: unknown output %q", o)
}

// wrk2SpectrumHeader is the header hdr_percentiles_print writes in its
// CLASSIC format ("%12s %12s %12s %12s\n\n"), which wrk2 --latency prints.
var wrk2SpectrumHeader = fmt.Sprintf("%12s %12s %12s %12s\n\n", "Value", "Percentile", "TotalCount", "1/(1-Percentile)")

// WriteWrk2 writes the text report with, after the latency table, wrk2
// --latency's "Detailed Percentile spectrum": Value (ms), Percentile (a
// fraction), TotalCount and 1/(1-Percentile) rows at 5 ticks per half
// distance, the histogram's mean, standard deviation, maximum and count,
// and wrk2's dashed rule.
func (r *Result) WriteWrk2(w io.Writer) error {
	return r.writeText(w, true)
}

// writeSpectrum writes the spectrum block of WriteWrk2.
func (r *Result) writeSpectrum(b *strings.Builder) error {
	if r.hist == nil {
		return errors.New("write wrk2 result: no histogram (a result read back from JSON has none)")
	}
	// hdrhistogram-go prints the rows and the footer in hdr_percentiles_print's
	// formats, values scaled from µs to ms as wrk2 does, but a header of its
	// own, tab-separated: that one is replaced by wrk2's.
	var spec bytes.Buffer
	if _, err := r.hist.PercentilesPrint(&spec, spectrumTicks, 1000); err != nil {
		return fmt.Errorf("write wrk2 result: %w", err)
	}
	_, rows, found := bytes.Cut(spec.Bytes(), []byte("\n\n"))
	if !found {
		return errors.New("write wrk2 result: no header in hdrhistogram's spectrum")
	}
	b.WriteString("\n  Detailed Percentile spectrum:\n")
	b.WriteString(wrk2SpectrumHeader)
	b.Write(rows)
	b.WriteString("----------------------------------------------------------\n")
	return nil
}

// VegetaMetrics is the object vegeta report -type=json prints
// (github.com/tsenart/vegeta lib.Metrics, without the optional buckets):
// the same field names, durations in nanoseconds, times in RFC 3339. The
// definitions are vegeta's, not the rest of this package's:
//
//   - Requests counts every request, answered or not; StatusCodes counts
//     them by status, "0" for those that got no answer.
//   - Success is the fraction answered 2xx or 3xx: a 404 counts as a
//     failure here (vegeta's rule), where Result.Succeeded counts it as
//     served.
//   - Earliest and Latest are the first and last request's start (on a
//     constant-rate schedule, when it was due: latency runs from there),
//     End the latest time one ended; Duration is Latest - Earliest, Wait
//     End - Latest, Rate Requests / Duration, Throughput the successful
//     requests / (Duration + Wait).
//   - Latencies come from the HdrHistogram (microsecond resolution, 3
//     significant digits), so they cover the answered and the timed-out
//     requests, not those refused before an answer; Total is their mean
//     times their number.
//   - BytesIn and BytesOut count the answered requests' body bytes.
//   - Errors are the distinct errors: for each failing status, its code
//     and reason ("404 Not Found"), then the first error of each kind
//     (connect, timeout, other) that got no answer.
type VegetaMetrics struct {
	Latencies   VegetaLatencies `json:"latencies"`
	BytesIn     VegetaBytes     `json:"bytes_in"`
	BytesOut    VegetaBytes     `json:"bytes_out"`
	Earliest    time.Time       `json:"earliest"`
	Latest      time.Time       `json:"latest"`
	End         time.Time       `json:"end"`
	Duration    time.Duration   `json:"duration"`
	Wait        time.Duration   `json:"wait"`
	Requests    uint64          `json:"requests"`
	Rate        float64         `json:"rate"`
	Throughput  float64         `json:"throughput"`
	Success     float64         `json:"success"`
	StatusCodes map[string]int  `json:"status_codes"`
	Errors      []string        `json:"errors"`
}

// VegetaLatencies is vegeta's LatencyMetrics, in nanoseconds.
type VegetaLatencies struct {
	Total time.Duration `json:"total"`
	Mean  time.Duration `json:"mean"`
	P50   time.Duration `json:"50th"`
	P90   time.Duration `json:"90th"`
	P95   time.Duration `json:"95th"`
	P99   time.Duration `json:"99th"`
	Max   time.Duration `json:"max"`
	Min   time.Duration `json:"min"`
}

// VegetaBytes is vegeta's ByteMetrics.
type VegetaBytes struct {
	Total uint64  `json:"total"`
	Mean  float64 `json:"mean"`
}

// Vegeta returns the result as vegeta's report.
func (r *Result) Vegeta() (*VegetaMetrics, error) {
	if r.hist == nil {
		return nil, errors.New("vegeta report: no histogram (a result read back from JSON has none)")
	}
	m := &VegetaMetrics{
		Requests:    uint64(max(r.Requests, 0)),
		StatusCodes: map[string]int{},
		Errors:      []string{},
	}
	if r.Requests == 0 {
		return m, nil // what vegeta prints for no results: zeros
	}
	m.Earliest, m.Latest, m.End = r.first, r.last, r.end
	m.Duration, m.Wait = r.last.Sub(r.first), r.end.Sub(r.last)
	success := 0
	for code, n := range r.statusByCode() {
		if n == 0 {
			continue
		}
		m.StatusCodes[strconv.Itoa(code)] = int(n)
		if code >= 200 && code < 400 {
			success += int(n)
		} else {
			m.Errors = append(m.Errors, fmt.Sprintf("%d %s", code, fasthttp.StatusMessage(code)))
		}
	}
	if n := r.ErrorCount(); n > 0 {
		m.StatusCodes["0"] = int(n)
	}
	for _, e := range r.errText {
		if e != "" {
			m.Errors = append(m.Errors, e)
		}
	}
	m.Rate = float64(r.Requests)
	m.Throughput = float64(success)
	if secs := m.Duration.Seconds(); secs > 0 {
		m.Rate /= secs
		m.Throughput /= (m.Duration + m.Wait).Seconds()
	}
	m.Success = float64(success) / float64(r.Requests)
	m.BytesIn = VegetaBytes{Total: uint64(r.bytesIn), Mean: float64(r.bytesIn) / float64(r.Requests)}
	m.BytesOut = VegetaBytes{Total: uint64(r.bytesOut), Mean: float64(r.bytesOut) / float64(r.Requests)}

	h := r.hist
	if n := h.TotalCount(); n > 0 {
		us := func(v int64) time.Duration { return time.Duration(v) * time.Microsecond }
		v := h.ValueAtPercentiles([]float64{50, 90, 95, 99})
		m.Latencies = VegetaLatencies{
			Total: time.Duration(h.Mean() * float64(n) * float64(time.Microsecond)),
			Mean:  time.Duration(h.Mean() * float64(time.Microsecond)),
			P50:   us(v[50]), P90: us(v[90]), P95: us(v[95]), P99: us(v[99]),
			Max: us(h.Max()), Min: us(h.Min()),
		}
	}
	return m, nil
}

// WriteVegeta writes the result as vegeta report -type=json does: one
// VegetaMetrics object on one line.
func (r *Result) WriteVegeta(w io.Writer) error {
	m, err := r.Vegeta()
	if err != nil {
		return err
	}
	if err := json.NewEncoder(w).Encode(m); err != nil {
		return fmt.Errorf("write vegeta result: %w", err)
	}
	return nil
}

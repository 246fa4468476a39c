package loadgen

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		noErr(t, os.WriteFile(path, got, 0o644))
	}
	want, err := os.ReadFile(path)
	noErr(t, err)
	eq(t, string(want), string(got), "%s (go test -run %s -update rewrites it)", path, t.Name())
}

func TestParseOutput(t *testing.T) {
	for _, o := range Outputs {
		got, err := ParseOutput(string(o))
		noErr(t, err)
		eq(t, o, got, "output")
	}
	for _, bad := range []string{"", "JSON", "wrk", "csv"} {
		_, err := ParseOutput(bad)
		ok(t, err != nil && strings.Contains(err.Error(), "must be text, wrk2, json or vegeta"), "%q: %v", bad, err)
	}
}

// Every output of the known result, and of a run in which nothing was
// recorded, writes and parses as its format says; Write picks the writer.
func TestOutputsParse(t *testing.T) {
	empty := newResult(testConfig("http://127.0.0.1:1"), newRecorder(), time.Time{}, time.Second, 0)
	for _, res := range []*Result{knownResult(t), empty} {
		for _, o := range Outputs {
			var b bytes.Buffer
			noErr(t, res.Write(&b, o))
			switch o {
			case OutputJSON, OutputVegeta:
				var m map[string]any
				noErr(t, json.Unmarshal(b.Bytes(), &m))
				eq(t, 1, strings.Count(b.String(), "\n"), "%s: one line", o)
			case OutputText:
				ok(t, strings.HasPrefix(b.String(), "Running "), "%s: %s", o, b.String())
			case OutputWrk2:
				rows := parseSpectrum(t, b.String())
				ok(t, len(rows) > 0, "%s: spectrum rows in\n%s", o, b.String())
			}
		}
	}
	noErr(t, empty.Write(&bytes.Buffer{}, OutputJSON))
	var b bytes.Buffer
	noErr(t, empty.WriteJSON(&b))
	ok(t, strings.Contains(b.String(), `"latency_spectrum_us":[]`), "an empty spectrum is [], not null: %s", b.String())
	ok(t, knownResult(t).Write(&b, "csv") != nil, "unknown output")
}

// spectrumRow is one row of wrk2's detailed spectrum.
type spectrumRow struct {
	valueMS, fraction float64
	count             int64
	inverse           string
}

// parseSpectrum reads the detailed spectrum of a wrk2 report as
// HdrHistogram's plotter does: the rows of four numbers after the header.
func parseSpectrum(t *testing.T, report string) []spectrumRow {
	t.Helper()
	_, after, found := strings.Cut(report, "  Detailed Percentile spectrum:\n")
	ok(t, found, "no spectrum in\n%s", report)
	sc := bufio.NewScanner(strings.NewReader(after))
	var rows []spectrumRow
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 0 && strings.HasPrefix(f[0], "#") {
			break // the footer
		}
		if len(f) != 4 || f[0] == "Value" {
			continue
		}
		v, err1 := strconv.ParseFloat(f[0], 64)
		p, err2 := strconv.ParseFloat(f[1], 64)
		n, err3 := strconv.ParseInt(f[2], 10, 64)
		ok(t, err1 == nil && err2 == nil && err3 == nil, "row %q", sc.Text())
		rows = append(rows, spectrumRow{v, p, n, f[3]})
	}
	return rows
}

// The wrk2 output: the text report with wrk2 --latency's spectrum block,
// in wrk2's exact layout, after the percentile table.
func TestWrk2Report(t *testing.T) {
	var b bytes.Buffer
	noErr(t, knownResult(t).WriteWrk2(&b))
	golden(t, "wrk2.txt", b.Bytes())

	out := b.String()
	var text bytes.Buffer
	noErr(t, knownResult(t).WriteText(&text))
	table, rest, _ := strings.Cut(text.String(), "  1004 requests")
	ok(t, strings.HasPrefix(out, table), "the text report's table comes first")
	ok(t, strings.HasSuffix(out, "----------------------------------------------------------\n  1004 requests"+rest), "then the rule and the text report's rest")
	ok(t, strings.Contains(out, "\n  Detailed Percentile spectrum:\n       Value   Percentile   TotalCount 1/(1-Percentile)\n\n"), "wrk2's header in\n%s", out)
	for _, l := range []string{
		"#[Mean    =        0.501, StdDeviation   =        0.289]\n",
		"#[Max     =        1.000, Total count    =         1001]\n",
	} {
		ok(t, strings.Contains(out, l), "footer line %q in\n%s", l, out)
	}

	rows := parseSpectrum(t, out)
	eq(t, 47, len(rows), "rows")
	eq(t, spectrumRow{0.001, 0, 1, "1.00"}, rows[0], "first row")
	eq(t, spectrumRow{0.501, 0.5, 501, "2.00"}, rows[5], "50%% row")
	eq(t, spectrumRow{0.901, 0.9, 901, "10.00"}, rows[17], "90%% row")
	eq(t, spectrumRow{1, 1, 1001, "inf"}, rows[len(rows)-1], "last row")
	// The same rows as the JSON's spectrum.
	for i, p := range knownResult(t).Spectrum {
		eq(t, float64(p.US)/1000, rows[i].valueMS, "row %d value", i)
		eq(t, p.TotalCount, rows[i].count, "row %d count", i)
	}
}

// vegetaFields are the keys of vegeta report -type=json's object
// (tsenart/vegeta lib/metrics.go, README "report -type=json"), without
// the optional buckets.
var vegetaFields = []string{"latencies", "bytes_in", "bytes_out", "earliest", "latest", "end",
	"duration", "wait", "requests", "rate", "throughput", "success", "status_codes", "errors"}

func TestVegetaReport(t *testing.T) {
	var b bytes.Buffer
	noErr(t, knownResult(t).WriteVegeta(&b))
	golden(t, "vegeta.json", b.Bytes())

	var got map[string]any
	noErr(t, json.Unmarshal(b.Bytes(), &got))
	keys := func(m map[string]any) []string {
		var ks []string
		for k := range m {
			ks = append(ks, k)
		}
		slices.Sort(ks)
		return ks
	}
	eq(t, slices.Sorted(slices.Values(vegetaFields)), keys(got), "fields")
	lat := got["latencies"].(map[string]any)
	eq(t, []string{"50th", "90th", "95th", "99th", "max", "mean", "min", "total"}, keys(lat), "latency fields")
	ms := float64(time.Millisecond)
	// Nanoseconds; the percentiles are the HdrHistogram's.
	eq(t, map[string]any{
		"total": 501_499_999.0, "mean": 500_999.0, "50th": 0.501 * ms, "90th": 0.901 * ms,
		"95th": 0.951 * ms, "99th": 0.991 * ms, "max": 1 * ms, "min": 0.001 * ms,
	}, lat, "latencies")
	eq(t, map[string]any{"total": 99000.0, "mean": 99000.0 / 1004}, got["bytes_in"], "bytes_in: the 200s' bodies")
	eq(t, map[string]any{"total": 0.0, "mean": 0.0}, got["bytes_out"], "bytes_out: no PUT")
	eq(t, "2026-11-24T10:00:00Z", got["earliest"], "earliest")
	eq(t, "2026-11-24T10:00:01.998Z", got["latest"], "latest: the last request's start")
	eq(t, "2026-11-24T10:00:01.999Z", got["end"], "end: and its end")
	eq(t, 1998*ms, got["duration"], "duration")
	eq(t, 1*ms, got["wait"], "wait")
	eq(t, 1004.0, got["requests"], "requests")
	eq(t, 1004/1.998, got["rate"], "rate")
	eq(t, 990/1.999, got["throughput"], "throughput: successes over duration + wait")
	eq(t, 990.0/1004, got["success"], "success: 2xx and 3xx only")
	eq(t, map[string]any{"200": 990.0, "404": 10.0, "0": 4.0}, got["status_codes"], "status codes: 0 for no answer")
	eq(t, []any{"404 Not Found", fasthttp.ErrDialTimeout.Error(), "unexpected EOF"}, got["errors"], "errors")

	// The type decodes its own output.
	var m VegetaMetrics
	noErr(t, json.Unmarshal(b.Bytes(), &m))
	eq(t, uint64(1004), m.Requests, "requests")
	eq(t, 1998*time.Millisecond, m.Duration, "duration")
}

// A run that recorded nothing prints vegeta's zeros, with {} and [].
func TestVegetaReportEmpty(t *testing.T) {
	var b bytes.Buffer
	noErr(t, newResult(testConfig("http://127.0.0.1:1"), newRecorder(), time.Time{}, time.Second, 0).WriteVegeta(&b))
	ok(t, strings.Contains(b.String(), `"requests":0,"rate":0,"throughput":0,"success":0,"status_codes":{},"errors":[]}`), "%s", b.String())
}

// A real run's vegeta report: the body bytes each way, the times between
// the run's, and every request counted once by status.
func TestVegetaReportOfRun(t *testing.T) {
	l := newRequestLog()
	cfg := testConfig(startServer(t, okHandler(l)))
	cfg.Workload = WorkloadMixed
	cfg.ReadRatio = 0.5
	cfg.MaxRequests = 300
	cfg.Duration = 10 * time.Second
	before := time.Now()
	res, err := Run(t.Context(), cfg)
	noErr(t, err)
	after := time.Now()
	m, err := res.Vegeta()
	noErr(t, err)

	l.mu.Lock()
	gets, puts := l.methods["GET"], l.methods["PUT"]
	l.mu.Unlock()
	eq(t, 300, gets+puts, "requests the server got")
	eq(t, uint64(300), m.Requests, "requests")
	eq(t, map[string]int{"200": gets, "201": puts}, m.StatusCodes, "status codes")
	eq(t, 1.0, m.Success, "success")
	eq(t, []string{}, m.Errors, "errors")
	eq(t, uint64(gets*len("value")), m.BytesIn.Total, "bytes in: the GETs' bodies")
	eq(t, uint64(puts*cfg.ValueSize), m.BytesOut.Total, "bytes out: the PUTs' bodies")
	ok(t, !m.Earliest.Before(before) && m.Earliest.Before(m.Latest) && !m.End.Before(m.Latest) && !m.End.After(after),
		"times: %v <= %v < %v <= %v <= %v", before, m.Earliest, m.Latest, m.End, after)
	ok(t, m.Latencies.Min > 0 && m.Latencies.Min <= m.Latencies.P50 && m.Latencies.P99 <= m.Latencies.Max, "latencies %+v", m.Latencies)
}

package loadgen

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// knownStart is when knownResult's first request started.
var knownStart = time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)

// knownResult records latencies 1..1000µs (all exactly representable at 3
// significant digits), one request every 2 ms from knownStart, 10 of them
// as 404s, plus 4 errors; the 200s received 100 bytes each.
func knownResult(t *testing.T) *Result {
	t.Helper()
	rec := newRecorder()
	for us := 1; us <= 1000; us++ {
		status, body := 200, 100
		if us%100 == 0 {
			status, body = 404, 0
		}
		start := knownStart.Add(time.Duration(us-1) * 2 * time.Millisecond)
		rec.record(opGet, status, nil, start, start.Add(time.Duration(us)*time.Microsecond))
		rec.recordBytes(body, 0)
	}
	// Errors that got no answer, no bytes: a failed connect records no
	// latency; the connection lost after 1 ms (EOF) records its 1 ms.
	at := knownStart.Add(time.Second)
	for _, err := range []error{fasthttp.ErrDialTimeout, fasthttp.ErrDialTimeout, fasthttp.ErrDialTimeout, io.ErrUnexpectedEOF} {
		rec.record(opGet, 0, err, at, at.Add(time.Millisecond))
	}
	cfg := DefaultConfig()
	cfg.Targets = []string{"http://127.0.0.1:8080", "http://127.0.0.1:8081", "http://127.0.0.1:8082"}
	cfg.Rate = 20000
	cfg.Ack, cfg.From = 2, 3
	return newResult(cfg, rec, time.Time{}, 2*time.Second, 0)
}

func TestTextReportLayout(t *testing.T) {
	var b bytes.Buffer
	noErr(t, knownResult(t).WriteText(&b))
	want := []string{
		"Running 30s test @ http://127.0.0.1:8080 (+2 more)",
		"  workload get, dist uniform, keyspace 100000, value 1024 B, 64 connections, rate 20000/s (constant), ack/from 2/3",
		"  Latency Distribution (HdrHistogram - Recorded Latency)",
		" 50.000%    0.50ms",
		" 75.000%    0.75ms",
		" 90.000%    0.90ms",
		" 99.000%    0.99ms",
		" 99.900%    1.00ms",
		" 99.990%    1.00ms",
		" 99.999%    1.00ms",
		"100.000%    1.00ms",
		"  1004 requests in 2.00s",
		"  Requests/sec:    502.00",
		"  Status: 200=990 404=10",
		"  Non-2xx responses: 10",
		"  Socket errors: connect 3, timeout 0, other 1",
	}
	got := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	eq(t, len(want), len(got), "line count of\n%s", b.String())
	for i := range min(len(want), len(got)) {
		eq(t, want[i], got[i], "line %d", i+1)
	}
}

func TestTextReportClosedLoopAndUnsent(t *testing.T) {
	res := knownResult(t)
	res.cfg.Rate = 0
	res.cfg.Ack, res.cfg.From = 0, 0
	res.cfg.Workload = WorkloadMixed
	res.cfg.Dist = DistZipf
	res.Unsent = 7
	var b bytes.Buffer
	noErr(t, res.WriteText(&b))
	for _, line := range []string{
		"  workload mixed (read ratio 0.90), dist zipf (s=1.1, v=1), keyspace 100000, value 1024 B, 64 connections, closed loop, ack/from -/-\n",
		"  Unsent: 7 scheduled requests never sent (drain limit 10s reached, or the run interrupted); the latencies count each from when it was due to when it was given up\n",
	} {
		ok(t, strings.Contains(b.String(), line), "missing %q in\n%s", line, b.String())
	}
}

func TestJSONReport(t *testing.T) {
	var b bytes.Buffer
	noErr(t, knownResult(t).WriteJSON(&b))
	out := b.String()
	eq(t, 1, strings.Count(out, "\n"), "lines")

	var got map[string]any
	noErr(t, json.Unmarshal(b.Bytes(), &got))
	keys := []string{"mode", "workload", "dist", "targets", "connections", "rate", "duration_s",
		"keyspace", "value_size", "ack", "from", "requests", "throughput_rps", "status",
		"non_2xx", "errors", "latency_us", "latency_spectrum_us"}
	for _, k := range keys {
		_, present := got[k]
		ok(t, present, "field %q missing", k)
	}
	eq(t, len(keys), len(got), "no extra fields when nothing is unsent")
	want := map[string]any{
		"mode":           "rate",
		"workload":       "get",
		"dist":           "uniform",
		"targets":        []any{"http://127.0.0.1:8080", "http://127.0.0.1:8081", "http://127.0.0.1:8082"},
		"connections":    64.0,
		"rate":           20000.0,
		"duration_s":     2.0,
		"keyspace":       100000.0,
		"value_size":     1024.0,
		"ack":            2.0,
		"from":           3.0,
		"requests":       1004.0,
		"throughput_rps": 502.0,
		"status":         map[string]any{"200": 990.0, "404": 10.0},
		"non_2xx":        10.0,
		"errors":         map[string]any{"connect": 3.0, "timeout": 0.0, "other": 1.0},
		"latency_us": map[string]any{
			"50": 501.0, "75": 751.0, "90": 901.0, "99": 991.0, "99.9": 1000.0,
			"99.99": 1000.0, "99.999": 1000.0, "100": 1000.0, "mean": 501.0, "stddev": 289.0,
		},
	}
	for k, v := range want {
		eq(t, v, got[k], "field %q", k)
	}
	// The spectrum: wrk2's rows, from the first value (0%) to the last
	// (100%), percentiles and counts rising.
	spec := got["latency_spectrum_us"].([]any)
	eq(t, 47, len(spec), "spectrum rows")
	eq(t, map[string]any{"percentile": 0.0, "us": 1.0, "total_count": 1.0}, spec[0], "first row (0%%)")
	eq(t, map[string]any{"percentile": 50.0, "us": 501.0, "total_count": 501.0}, spec[5], "50%% row")
	eq(t, map[string]any{"percentile": 100.0, "us": 1000.0, "total_count": 1001.0}, spec[len(spec)-1], "last row")
	for i := 1; i < len(spec); i++ {
		a, b := spec[i-1].(map[string]any), spec[i].(map[string]any)
		ok(t, a["percentile"].(float64) < b["percentile"].(float64), "percentiles rise at row %d", i)
		ok(t, a["total_count"].(float64) <= b["total_count"].(float64), "counts rise at row %d", i)
	}

	// Percentiles are written in order, as in the documented schema.
	ok(t, strings.Contains(out, `"latency_us":{"50":501,"75":751,"90":901,"99":991,"99.9":1000,`), "order in %s", out)

	res := knownResult(t)
	res.Unsent = 5
	b.Reset()
	noErr(t, res.WriteJSON(&b))
	ok(t, strings.Contains(b.String(), `"unsent":5`), "unsent shown when non-zero: %s", b.String())
}

func TestRecorderClampsAndClassifies(t *testing.T) {
	rec := newRecorder()
	rec.record(opGet, 200, nil, knownStart, knownStart)                  // below 1µs
	rec.record(opGet, 200, nil, knownStart, knownStart.Add(3*time.Hour)) // beyond the range
	rec.record(opGet, 0, errTimeoutForTest, knownStart, knownStart.Add(3*time.Second))
	eq(t, int64(3), rec.requests, "requests")
	eq(t, int64(3), rec.hist.TotalCount(), "timeouts enter the histogram")
	eq(t, int64(1), rec.hist.Min(), "min")
	ok(t, rec.hist.ValuesAreEquivalent(histMaxUS, rec.hist.Max()), "max %d", rec.hist.Max())
	eq(t, int64(1), rec.errs[errTimeout], "timeouts")
	eq(t, int64(1), rec.failures(), "failures")
}

// TestSucceeded: what counts as a request the system served.
func TestSucceeded(t *testing.T) {
	for _, tc := range []struct {
		status map[string]int64
		want   int64
	}{
		{nil, 0},
		{map[string]int64{"200": 3, "201": 4, "202": 5}, 12},
		{map[string]int64{"404": 2, "500": 1, "503": 1}, 2},
		{map[string]int64{"400": 5, "413": 1, "504": 2}, 0},
		{map[string]int64{"201": 1, "504": 9}, 1},
	} {
		r := &Result{Status: tc.status}
		if got := r.Succeeded(); got != tc.want {
			t.Errorf("%v: Succeeded() = %d, want %d", tc.status, got, tc.want)
		}
	}
}

package main

import (
	"bytes"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/dhtkv/dhtkv/internal/loadgen"
)

// plotDir is where a test draws its plots: $DHTKV_PLOT_DIR, to look at
// them, or a temporary directory.
func plotDir(t *testing.T) string {
	if dir := os.Getenv("DHTKV_PLOT_DIR"); dir != "" {
		return dir
	}
	return t.TempDir()
}

// syntheticSearch is a saturation search with every kind of step the plot
// draws: the closed-loop probe, passing steps, a failing step and a retry.
func syntheticSearch() *Search {
	res := func(rate, got float64, p99us int64) *Run {
		return &Run{Result: &LoadResult{Mode: "rate", Rate: rate, Requests: 1000, ThroughputRPS: got, Latency: Latency{P99: p99us}}}
	}
	closed := res(0, 30000, 95_000)
	closed.Result.Mode = "closed"
	return &Search{Upper: 30000, Saturation: 21000, Steps: []Step{
		{Run: closed, Reason: "closed loop"},
		{Run: res(15000, 14990, 2_100), Rate: 15000, Pass: true},
		{Run: res(21000, 20950, 7_800), Rate: 21000, Pass: true},
		{Run: res(25500, 24100, 31_000), Rate: 25500},
		{Run: res(25500, 24800, 12_500), Rate: 25500},
		{Run: nil, Rate: 27000}, // a step whose run failed: skipped, not fatal
	}}
}

func TestPlots(t *testing.T) {
	fixed, err := ParseLoadResult([]byte(sampleJSON))
	if err != nil {
		t.Fatal(err)
	}
	ceiling := Latency{P50: 300, P75: 380, P90: 520, P99: 1400, P999: 3100, P9999: 6000, P99999: 7000, P100: 8000}
	curves := []LatencyCurve{CurveFromSummary("node-get at 6400 rps", fixed.Latency), CurveFromSummary("ceiling-get at 24000 rps", ceiling)}
	dir := plotDir(t)
	for _, ext := range []string{"svg", "png"} {
		t.Run(ext, func(t *testing.T) {
			lat := filepath.Join(dir, "node-get-latency."+ext)
			if err := PercentilePlot(lat, "node-get: latency by percentile", curves); err != nil {
				t.Fatal(err)
			}
			thr := filepath.Join(dir, "node-get-throughput."+ext)
			if err := ThroughputPlot(thr, "node-get: saturation search", syntheticSearch(), 10*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			for path, want := range map[string][]string{
				lat: {"percentile", "latency (ms)", "50%", "90%", "99%", "99.9%", "99.99%", "node-get at 6400 rps", "ceiling-get at 24000 rps"},
				thr: {"throughput achieved (requests/s)", "p99 latency (ms)", "step passed", "step failed", "closed loop (upper bound)", "p99 threshold 10.00 ms", "saturation point 21000 rps"},
			} {
				b, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				if len(b) < 5000 {
					t.Errorf("%s: only %d bytes", path, len(b))
				}
				if _, err := os.Stat(path + ".tmp"); err == nil {
					t.Errorf("%s: temporary file left behind", path)
				}
				if ext == "png" {
					if !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
						t.Errorf("%s: not a PNG", path)
					}
					continue
				}
				for _, s := range want {
					if !strings.Contains(string(b), ">"+s+"<") {
						t.Errorf("%s: no text %q", path, s)
					}
				}
			}
		})
	}
}

func TestPlotsRejectEmptyData(t *testing.T) {
	dir := t.TempDir()
	if err := PercentilePlot(filepath.Join(dir, "a.svg"), "t", []LatencyCurve{{Label: "none"}}); err == nil {
		t.Error("percentile plot without points: no error")
	}
	if err := ThroughputPlot(filepath.Join(dir, "b.svg"), "t", &Search{Steps: []Step{{Rate: 5}}}, time.Millisecond); err == nil {
		t.Error("throughput plot without results: no error")
	}
	if err := ThroughputPlot(filepath.Join(dir, "c.svg"), "t", nil, time.Millisecond); err == nil {
		t.Error("throughput plot of nil search: no error")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("files written for empty data: %v", ents)
	}
}

func TestPercentileAxis(t *testing.T) {
	for _, tc := range []struct {
		pct, x float64
	}{{50, 2}, {90, 10}, {99, 100}, {99.9, 1000}, {99.99, 10000}} {
		if got := percentileX(tc.pct); got < tc.x*0.999999 || got > tc.x*1.000001 {
			t.Errorf("percentileX(%g) = %g, want %g", tc.pct, got, tc.x)
		}
	}
	for _, tc := range []struct {
		min, max float64
		want     string
	}{
		{percentileX(40), percentileX(99.99), "50% 90% 99% 99.9% 99.99%"}, // a summary's points
		{1, percentileX(99.9), "50% 90% 99% 99.9%"},                       // a spectrum's, from 0%
	} {
		var labels []string
		for _, tk := range percentileTicks(tc.min, tc.max) {
			if tk.Label != "" {
				labels = append(labels, tk.Label)
			}
		}
		if got := strings.Join(labels, " "); got != tc.want {
			t.Errorf("[%g, %g]: ticks %s, want %s", tc.min, tc.max, got, tc.want)
		}
	}
}

// TestRenderPlotsForReport draws a scenario's plots where the report links
// them, and removes a stale picture once its data is gone.
func TestRenderPlotsForReport(t *testing.T) {
	dir := t.TempDir()
	r := sampleResult(t)
	tl := realTimeline(t)
	r.Fixed = &Run{Spec: RunSpec{Duration: 3 * time.Second}, Result: tl, Stdout: "{}"}
	a, err := renderPlots(dir, r)
	if err != nil {
		t.Fatal(err)
	}
	if a.Latency != "node-get-latency.svg" || a.Throughput != "node-get-throughput.svg" || a.Timeline != "node-get-timeline.svg" || len(a.Notes) != 0 {
		t.Fatalf("artifacts %+v", a)
	}
	r.Plots = a
	md := RenderScenario(r)
	if !strings.Contains(md, "Latency is measured from each request's intended send time") || !strings.Contains(md, "counted the same way, by the second they were due") {
		t.Error("report has no timeline caption")
	}
	for _, name := range []string{a.Latency, a.Throughput, a.Timeline} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Error(err)
		}
		if !strings.Contains(md, "]("+name+")") {
			t.Errorf("report does not link %s", name)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, a.Latency))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), ">ceiling-get at 8000 rps<") {
		t.Error("latency plot has no ceiling curve")
	}

	r.Fixed, r.Search = nil, &Search{}
	a, err = renderPlots(dir, r)
	if err != nil {
		t.Fatal(err)
	}
	if a.Latency != "" || a.Throughput != "" || a.Timeline != "" || len(a.Notes) != 3 {
		t.Errorf("artifacts without data %+v", a)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("stale plots kept: %v", ents)
	}
}

func TestInsideTicks(t *testing.T) {
	var labels []string
	for _, tk := range (inside{evenTicks{}}).Ticks(0, 30200) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	if got := strings.Join(labels, " "); got != "0 10000 20000" {
		t.Errorf("labels %s", got)
	}
}

func TestLogTicks(t *testing.T) {
	for _, tc := range []struct {
		min, max float64
		want     string
	}{
		{1.5, 150, "2 5 10 20 50 100"},
		{0.8, 12, "1 2 5 10"},
		{6.3, 19.5, "8 10 12 14 16 18"}, // under a decade: evenly spaced
		{0.02, 0.09, "0.02 0.04 0.06 0.08"},
		{0.08, 5000, "0.1 1 10 100 1000"}, // over three decades: powers of ten
	} {
		var labels []string
		for _, tk := range (logTicks{}).Ticks(tc.min, tc.max) {
			if tk.Label != "" {
				labels = append(labels, tk.Label)
			}
		}
		if got := strings.Join(labels, " "); got != tc.want {
			t.Errorf("[%g, %g]: labels %s, want %s", tc.min, tc.max, got, tc.want)
		}
	}
}

// spectrumResult is a result with the spectrum dhtkv-load reports, of a
// long-tailed distribution: most requests near base, a few far beyond.
func spectrumResult(base time.Duration) *LoadResult {
	h := hdrhistogram.New(1, 60_000_000, 3)
	r := rand.New(rand.NewPCG(1, 2))
	for range 200_000 {
		us := float64(base.Microseconds()) * math.Exp(r.NormFloat64()*0.6)
		if r.IntN(1000) == 0 {
			us *= 20 // the tail: a stall now and then
		}
		_ = h.RecordValue(int64(us))
	}
	res := &LoadResult{Mode: "rate", Rate: 8000, Requests: h.TotalCount()}
	for _, b := range h.CumulativeDistributionWithTicks(5) {
		res.Spectrum = append(res.Spectrum, loadgen.SpectrumPoint{Percentile: b.Quantile, US: b.ValueAt, TotalCount: b.Count})
	}
	return res
}

// CurveFromResult draws the whole spectrum, from 0% and without the 100%
// row, and falls back on the summary for a result without one; the plot
// of spectra has its x axis from 0%.
func TestSpectrumCurve(t *testing.T) {
	res := spectrumResult(time.Millisecond)
	c := CurveFromResult("node", res)
	if len(c.Points) != len(res.Spectrum)-1 || c.Points[0].Percentile != 0 || c.Points[len(c.Points)-1].Percentile >= 100 {
		t.Fatalf("%d points of %d rows, first %+v, last %+v", len(c.Points), len(res.Spectrum), c.Points[0], c.Points[len(c.Points)-1])
	}
	if len(c.Points) <= denseCurve {
		t.Errorf("only %d points: drawn with markers", len(c.Points))
	}
	fixed, err := ParseLoadResult([]byte(sampleJSON))
	if err != nil {
		t.Fatal(err)
	}
	if s := CurveFromResult("old", fixed); len(s.Points) != 7 || s.Points[0].Percentile != 50 {
		t.Errorf("summary curve %+v", s)
	}

	dir := plotDir(t)
	for _, ext := range []string{"svg", "png"} {
		path := filepath.Join(dir, "spectrum-latency."+ext)
		curves := []LatencyCurve{c, CurveFromResult("ceiling", spectrumResult(300*time.Microsecond))}
		if err := PercentilePlot(path, "node-get: latency by percentile, fixed-rate run", curves); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if ext == "svg" {
			for _, s := range []string{">50%<", ">99.9%<", ">node<", ">ceiling<", ">latency (ms)<"} {
				if !strings.Contains(string(b), s) {
					t.Errorf("%s: no text %q", path, s)
				}
			}
		}
	}
}

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// realTimeline is testdata/timeline.json: dhtkv-load --json --timeline
// output of 3 s at 2000 rps against the baseline server.
func realTimeline(t *testing.T) *LoadResult {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "timeline.json"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := ParseLoadResult(b)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestParseTimeline(t *testing.T) {
	r := realTimeline(t)
	if len(r.Timeline) != 3 {
		t.Fatalf("timeline of %d seconds, want 3: %+v", len(r.Timeline), r.Timeline)
	}
	var sum int64
	for i, p := range r.Timeline {
		if p.Second != i || p.Requests != 2000 || p.Failures != 0 {
			t.Errorf("second %d: %+v", i, p)
		}
		if !(0 < p.P50US && p.P50US <= p.P99US && p.P99US <= p.MaxUS) {
			t.Errorf("second %d: latencies out of order: %+v", i, p)
		}
		sum += p.Requests
	}
	if sum != r.Requests {
		t.Errorf("timeline counts %d requests, the result %d", sum, r.Requests)
	}
	// The sample caught a stall of the machine in its second second; the
	// timeline places it there, where the run's percentiles cannot.
	if tl := r.Timeline; tl[1].P99US < 100_000 || tl[0].P99US > 50_000 || tl[2].P99US > 50_000 {
		t.Errorf("the stall is not in second 1: %+v", tl)
	}
}

func TestParseRejectsBadTimeline(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "timeline.json"))
	if err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string][2]string{
		"gap":                 {`"second":1,`, `"second":2,`},
		"negative":            {`"second":0,"requests":2000`, `"second":0,"requests":-1`},
		"failures > requests": {`"second":2,"requests":2000,"failures":0`, `"second":2,"requests":2000,"failures":2001`},
	} {
		bad := strings.Replace(string(b), edit[0], edit[1], 1)
		if bad == string(b) {
			t.Fatalf("%s: edit %q not applied", name, edit[0])
		}
		if _, err := ParseLoadResult([]byte(bad)); err == nil || !strings.Contains(err.Error(), "timeline") {
			t.Errorf("%s: err %v, want a timeline error", name, err)
		}
	}
}

// stallTimeline is 40 s at 1000 rps with a second of failures and a
// second without any answer, for the plot's long-run and failure paths.
func stallTimeline() []TimelinePoint {
	var tl []TimelinePoint
	for i := range 40 {
		p := TimelinePoint{Second: i, Requests: 1000, P50US: 300 + int64(i), P99US: 2000, MaxUS: 4000}
		switch i {
		case 17:
			p = TimelinePoint{Second: i} // nothing due got an answer in time
		case 18:
			p.Failures, p.P99US, p.MaxUS = 120, 900_000, 1_400_000
		case 39:
			p.Requests = 500 // the window ends half-way through it
		}
		tl = append(tl, p)
	}
	return tl
}

func TestTimelinePlot(t *testing.T) {
	dir := plotDir(t)
	r := realTimeline(t)
	for _, tc := range []struct {
		name   string
		tl     []TimelinePoint
		window time.Duration
		rate   float64
		want   []string
		not    []string
	}{
		{"real", r.Timeline, 3 * time.Second, r.Rate,
			[]string{"max", "p99", "p50", "latency (ms)", "requests/s", "requests per second", "target 2000 rps", "seconds into the measured run (by intended send time)"},
			[]string{"failed per second"}},
		{"stall", stallTimeline(), 39500 * time.Millisecond, 1000,
			[]string{"max", "p50", "failed per second", "target 1000 rps", "1000"}, nil},
	} {
		for _, ext := range []string{"svg", "png"} {
			path := filepath.Join(dir, tc.name+"-timeline."+ext)
			if err := TimelinePlot(path, tc.name+": second by second", tc.tl, tc.window, tc.rate); err != nil {
				t.Fatal(err)
			}
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
				if !strings.HasPrefix(string(b), "\x89PNG\r\n\x1a\n") {
					t.Errorf("%s: not a PNG", path)
				}
				continue
			}
			for _, s := range tc.want {
				if !strings.Contains(string(b), ">"+s+"<") {
					t.Errorf("%s: no text %q", path, s)
				}
			}
			for _, s := range tc.not {
				if strings.Contains(string(b), ">"+s+"<") {
					t.Errorf("%s: text %q", path, s)
				}
			}
		}
	}
	// The caller's timeline is left as it was by the padding of short ones.
	short := r.Timeline[:2:3]
	if err := TimelinePlot(filepath.Join(dir, "short-timeline.svg"), "short", short, 5*time.Second, 2000); err != nil {
		t.Fatal(err)
	}
	if r.Timeline[2].Requests != 2000 {
		t.Error("padding wrote into the caller's timeline")
	}
}

func TestTimelinePlotRejectsEmpty(t *testing.T) {
	dir := t.TempDir()
	for name, tl := range map[string][]TimelinePoint{
		"none":  nil,
		"zeros": {{Second: 0}, {Second: 1}},
		"gap":   {{Second: 0, Requests: 5, P50US: 1, P99US: 1, MaxUS: 1}, {Second: 2, Requests: 5, P50US: 1, P99US: 1, MaxUS: 1}},
	} {
		if err := TimelinePlot(filepath.Join(dir, name+".svg"), "t", tl, time.Second, 5); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("files written for empty data: %v", ents)
	}
}

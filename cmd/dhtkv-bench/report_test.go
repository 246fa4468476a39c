package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const sampleJSON = `{"mode":"rate","workload":"get","dist":"uniform","targets":["http://127.0.0.1:8080"],"connections":64,"rate":8000,"duration_s":30.0,"keyspace":100000,"value_size":1024,"ack":0,"from":0,"requests":240000,"throughput_rps":7999.5,"status":{"200":239990,"404":10},"non_2xx":10,"errors":{"connect":0,"timeout":0,"other":0},"latency_us":{"50":520,"75":710,"90":980,"99":2100,"99.9":5310,"99.99":9020,"99.999":11200,"100":12010,"mean":560.2,"stddev":120.5}}`

func TestParseLoadResult(t *testing.T) {
	r, err := ParseLoadResult([]byte("\n" + sampleJSON + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if r.Requests != 240000 || r.Latency.P999 != 5310 || r.Status["404"] != 10 || r.Rate != 8000 || r.Latency.Mean != 560.2 {
		t.Errorf("parsed %+v", r)
	}
	if r.ServerErrors() != 0 || r.ErrorCount() != 0 {
		t.Errorf("errors %d %d", r.ServerErrors(), r.ErrorCount())
	}
	for _, bad := range []string{"", "not json", sampleJSON + sampleJSON, `{"requests":1}`} {
		if _, err := ParseLoadResult([]byte(bad)); err == nil {
			t.Errorf("no error for %.40q", bad)
		}
	}
}

func TestLoadRunnerArgs(t *testing.T) {
	l := &loadRunner{targets: []string{"http://127.0.0.1:1", "http://127.0.0.1:2"}, keyspace: 100, valueSize: 1024,
		connections: 64, ack: 2, from: 3, timeout: 2 * time.Second}
	got := strings.Join(l.args(RunSpec{Workload: "mixed", ReadRatio: 0.9, Rate: 1234, Duration: 5 * time.Second, Warmup: time.Second}), " ")
	want := "--targets http://127.0.0.1:1,http://127.0.0.1:2 --workload mixed --read-ratio 0.9 --dist uniform --keyspace 100 --value-size 1024 " +
		"--ack 2 --from 3 --connections 64 --rate 1234 --duration 5s --warmup 1s --timeout 2s --drain 2.5s --json"
	if got != want {
		t.Errorf("args\n got %s\nwant %s", got, want)
	}
	l.ack = 0
	got = strings.Join(l.args(RunSpec{Workload: "get", Duration: time.Second, Fill: 100}), " ")
	if strings.Contains(got, "--ack") || strings.Contains(got, "--drain") || !strings.Contains(got, "--rate 0 ") || !strings.Contains(got, "--fill 100") || strings.Contains(got, "--timeline") {
		t.Errorf("args %s", got)
	}
	got = strings.Join(l.args(RunSpec{Workload: "get", Rate: 100, Duration: time.Second, Timeline: true}), " ")
	if !strings.HasSuffix(got, " --timeline --json") {
		t.Errorf("args with a timeline: %s", got)
	}
}

func TestShellJoin(t *testing.T) {
	got := shellJoin([]string{"bin/dhtkv-load", "--targets", "http://127.0.0.1:1", "it's", ""})
	want := `bin/dhtkv-load --targets http://127.0.0.1:1 'it'\''s' ''`
	if got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

func sampleResult(t *testing.T) *ScenarioResult {
	t.Helper()
	fixed, err := ParseLoadResult([]byte(sampleJSON))
	if err != nil {
		t.Fatal(err)
	}
	closed := &LoadResult{Mode: "closed", Connections: 64, Requests: 50000, ThroughputRPS: 10000, Latency: Latency{P50: 5000, P99: 20000, P999: 30000}}
	step := &LoadResult{Mode: "rate", Rate: 10000, Connections: 64, Requests: 40000, ThroughputRPS: 9000, Latency: Latency{P99: 40000}}
	return &ScenarioResult{
		Name: "node-get", Title: "GET, one dhtkv node (--sync=true)", Workload: "get",
		Machine:     Machine{NProc: 2, CPUModel: "Test CPU", MemTotal: "24.0 GiB", GoVersion: "go1.26", GitRev: "abc", Date: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)},
		SystemNotes: []string{"system: one dhtkv node"},
		Servers:     []string{"bin/dhtkv --listen 127.0.0.1:1"},
		FillRun: &Run{Command: "bin/dhtkv-load --fill 100000", Elapsed: 3 * time.Second,
			Stderr: "level=INFO msg=\"fill starting\"\nlevel=INFO msg=\"fill done\" keys=100000 keys_per_s=23142\n",
			Result: &LoadResult{Requests: 500, Status: map[string]int64{"200": 500}}},
		Search: &Search{Upper: 10000, Saturation: 8000, Steps: []Step{
			{Run: &Run{Command: "bin/dhtkv-load --rate 0", Result: closed}, Reason: "closed loop"},
			{Run: &Run{Command: "bin/dhtkv-load --rate 8000", Result: fixed}, Rate: 8000, Pass: true, Reason: "ok"},
			{Run: &Run{Command: "bin/dhtkv-load --rate 10000", Result: step}, Rate: 10000, Reason: "p99 | too high"},
		}},
		Threshold: 10 * time.Millisecond, FixedFrac: 0.8, FixedRate: 6400,
		Fixed:    &Run{Command: "bin/dhtkv-load --rate 6400", Result: fixed, Stdout: sampleJSON + "\n", Stderr: "level=INFO msg=done\n"},
		Ceiling:  &CeilingFigure{Scenario: "ceiling-get", Saturation: 32000, Upper: 40000, Fixed: fixed},
		Profiles: &ProfileArtifacts{Node: "http://127.0.0.1:2", CPUSVG: "node-get-cpu.svg", AllocSVG: "node-get-alloc.svg", CPUTopFlat: "FLAT\n", CPUTopCum: "CUM\n", AllocTop: "ALLOC\n", Notes: []string{"a note"}},
		Pinning:  "pinned (--pin=auto: 4 cores): servers on cores 0-1, dhtkv-load on cores 2-3 (taskset)",
		Pinned:   true,
		CPU:      &CPUUsage{Procs: 1, Ticks: 1440, Hz: 100, Window: 30 * time.Second, Requests: 240000},
	}
}

func TestRenderScenario(t *testing.T) {
	s := sampleResult(t)
	md := RenderScenario(s)
	for _, want := range []string{
		"# node-get — GET, one dhtkv node (--sync=true)",
		"| saturation point (highest rate with p99 ≤ 10.00 ms and ≥ 95% throughput) | 8000 rps |",
		"| ratio to ceiling | **0.25** |",
		"2 × Test CPU",
		"| 520 µs | 710 µs | 980 µs | 2.10 ms | 5.31 ms | 9.02 ms | 11.20 ms | 12.01 ms | 560 µs | 120 µs |",
		"Status codes: 200 × 239990, 404 × 10",
		"| 2 | rate | 10000 | 9000 | 0 µs | 40.00 ms | 0 µs | 0 | **fail**: p99 \\| too high |",
		"Chosen saturation point: **8000 rps**",
		"[![CPU flame graph](node-get-cpu.svg)](node-get-cpu.svg)",
		"(node-get-alloc.svg)",
		"```text\nFLAT\n```", "```text\nCUM\n```", "```text\nALLOC\n```",
		"- a note",
		"Ratio of saturation points: 8000 / 32000 = **0.25** (closed-loop ratio 0.25)",
		"bin/dhtkv-load --fill 100000\nbin/dhtkv-load --rate 0\nbin/dhtkv-load --rate 8000\nbin/dhtkv-load --rate 10000\nbin/dhtkv-load --rate 6400\n```",
		"level=INFO msg=done",
		"The load generator reported: `level=INFO msg=\"fill done\" keys=100000 keys_per_s=23142`",
		"GET check of the filled keys: 500 requests, status codes 200 × 500.",
		`"throughput_rps":7999.5`,
		"| server CPU per request (user+system, the server process) | 60.0 µs (0.48 cores busy) |",
		"- pinning: pinned (--pin=auto: 4 cores): servers on cores 0-1",
		"Server CPU: 14.40 s of user and system time (1440 ticks at 100 per second, `/proc/PID/stat`) of the server process over 30.0 s",
		"Node 1 was being profiled",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if strings.Contains(md, "Quick mode") || strings.Contains(md, "This scenario failed") {
		t.Error("full, successful report mentions quick mode or failure")
	}
}

func TestRenderScenarioDegraded(t *testing.T) {
	s := sampleResult(t)
	s.Quick = true
	s.Ceiling, s.CeilingNote = nil, "Not measured: the ceiling was not found at /x, so no ratio is given."
	s.Profiles = nil
	s.Search.Saturation = 0
	s.CPU, s.CPUNote = nil, "the run ended | early"
	s.Err = errors.New("fixed-rate run: boom\nwith newline")
	md := RenderScenario(s)
	for _, want := range []string{
		"**Quick mode**",
		"**This scenario failed**: fixed-rate run: boom with newline",
		"none of the tried rates passed",
		"| ratio to ceiling | not available: Not measured: the ceiling was not found at /x",
		"No step passed",
		"| server CPU per request | not measured: the run ended \\| early |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if strings.Contains(md, "## Profiles") || strings.Contains(md, "**0.") {
		t.Error("degraded report shows profiles or a ratio")
	}
	if s.Ratio() != 0 {
		t.Error("ratio without a ceiling")
	}
}

func TestRenderSummary(t *testing.T) {
	node := sampleResult(t)
	ceil := sampleResult(t)
	ceil.Name, ceil.IsCeiling, ceil.Ceiling, ceil.Profiles = "ceiling-get", true, nil, nil
	broken := sampleResult(t)
	broken.Name, broken.Search, broken.Fixed, broken.Ceiling, broken.Profiles, broken.Err = "cluster-get", nil, nil, nil, nil, errors.New("x")
	broken.CPU = nil
	md := RenderSummary([]*ScenarioResult{ceil, node, broken}, node.Machine, false, 10*time.Millisecond, []string{"data: 100 keys"})
	for _, want := range []string{
		"| ceiling-get | 8000 | 8000 | 520 µs | 2.10 ms | 5.31 ms | 60.0 µs | reference | [ceiling-get.md](ceiling-get.md) | — | — |",
		"| node-get | 8000 | 8000 | 520 µs | 2.10 ms | 5.31 ms | 60.0 µs | 0.25 | [node-get.md](node-get.md) | [svg](node-get-cpu.svg) | [svg](node-get-alloc.svg) |",
		"| cluster-get | — | — | — | — | — | — | — (failed) | [cluster-get.md](cluster-get.md) | — | — |",
		"- data: 100 keys",
		"`make bench` on 2026-01-02 03:04 UTC",
		"| node-get | 8000 | 8000 | 520 µs | 2.10 ms | 5.31 ms | 60.0 µs | 0.25 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("summary lacks %q in\n%s", want, md)
		}
	}
}

func TestSplicePreservesProse(t *testing.T) {
	doc := "# Reports\n\nHand-written intro.\n\n" + beginMarker + "\nold table\n" + endMarker + "\n\n## Notes\n\nMore prose, kept.\n"
	got, err := Splice(doc, "new table\n")
	if err != nil {
		t.Fatal(err)
	}
	want := "# Reports\n\nHand-written intro.\n\n" + beginMarker + "\nnew table\n" + endMarker + "\n\n## Notes\n\nMore prose, kept.\n"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	again, err := Splice(got, "new table")
	if err != nil || again != got {
		t.Errorf("splicing twice changed the document: %v\n%s", err, again)
	}
}

func TestSpliceNoMarkers(t *testing.T) {
	got, err := Splice("", "table")
	if err != nil || got != beginMarker+"\ntable\n"+endMarker+"\n" {
		t.Errorf("empty doc: %q, %v", got, err)
	}
	got, err = Splice("# Prose without newline", "table")
	if err != nil || got != "# Prose without newline\n\n"+beginMarker+"\ntable\n"+endMarker+"\n" {
		t.Errorf("doc without markers: %q, %v", got, err)
	}
}

func TestSpliceRejectsBrokenMarkers(t *testing.T) {
	for _, doc := range []string{
		"x " + beginMarker + " y",
		"x " + endMarker + " y",
		endMarker + "\n" + beginMarker,
		beginMarker + endMarker + beginMarker + endMarker,
	} {
		if _, err := Splice(doc, "t"); err == nil {
			t.Errorf("no error for %q", doc)
		}
	}
}

func TestUpdateReadme(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "README.md")
	if err := UpdateReadme(path, "one"); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	prose := "Intro by hand.\n\n" + string(b) + "\nOutro by hand.\n"
	if err := os.WriteFile(path, []byte(prose), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := UpdateReadme(path, "two"); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(path)
	want := "Intro by hand.\n\n" + beginMarker + "\ntwo\n" + endMarker + "\n\nOutro by hand.\n"
	if string(b) != want {
		t.Errorf("got\n%s\nwant\n%s", b, want)
	}
}

package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"testing"

	"github.com/dhtkv/dhtkv/cmd/dhtkv-bench/flamegraph"
)

// TestRenderProfilesKeepsRaw renders this test process's own allocation
// profile and checks that the profile is kept beside its flame graph in a
// form pprof reads back, and that a missing profile removes the files an
// earlier run left.
func TestRenderProfilesKeepsRaw(t *testing.T) {
	var raw bytes.Buffer
	if err := pprof.Lookup("allocs").WriteTo(&raw, 0); err != nil {
		t.Fatal(err)
	}
	alloc, err := flamegraph.Parse(&raw)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, stale := range []string{"node-get-cpu.svg", "node-get-cpu.pb.gz"} {
		if err := os.WriteFile(filepath.Join(dir, stale), []byte("old run"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	a, err := renderProfiles(dir, "node-get", "get at 1 rps", &Profiles{Node: "http://n1", Alloc: alloc, CPUErr: errors.New("connection refused")})
	if err != nil {
		t.Fatal(err)
	}
	if a.CPUSVG != "" || a.CPURaw != "" || a.AllocSVG != "node-get-alloc.svg" || a.AllocRaw != "node-get-alloc.pb.gz" {
		t.Fatalf("artifacts %+v", a)
	}
	if len(a.Notes) != 1 || !strings.Contains(a.Notes[0], "connection refused") {
		t.Errorf("notes %q", a.Notes)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if got := strings.Join(names, " "); got != "node-get-alloc.pb.gz node-get-alloc.svg" {
		t.Errorf("files %s", got)
	}
	f, err := os.Open(filepath.Join(dir, a.AllocRaw))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	back, err := flamegraph.Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := flamegraph.SampleIndex(back, "alloc_space")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := flamegraph.SampleIndex(alloc, "alloc_space")
	if got, want := flamegraph.Total(back, idx), flamegraph.Total(alloc, want); got != want || got == 0 {
		t.Errorf("kept profile totals %d bytes, rendered one %d", got, want)
	}

	s := sampleResult(t)
	s.Profiles = a
	md := RenderScenario(s)
	if !strings.Contains(md, "[node-get-alloc.pb.gz](node-get-alloc.pb.gz)") || !strings.Contains(md, "go tool pprof -http=: node-get-alloc.pb.gz") {
		t.Errorf("report does not link the raw profile:\n%s", md)
	}
	if sum := RenderSummary([]*ScenarioResult{s}, s.Machine, false, s.Threshold, nil); !strings.Contains(sum, "| — | [svg](node-get-alloc.svg) [pb.gz](node-get-alloc.pb.gz) |") {
		t.Errorf("summary does not link the raw profile:\n%s", sum)
	}
}

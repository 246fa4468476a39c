package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"os"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	os.Exit(m.Run())
}

// modelRunner pretends to be a server with a fixed capacity: a closed loop
// gets the capacity, a constant rate below it is served with low latency,
// above it throughput caps and p99 explodes.
type modelRunner struct {
	capacity float64
	p99Low   int64 // µs below capacity
	calls    []RunSpec
	failAt   int // return an error on this call (1-based); 0 = never
}

func (m *modelRunner) Run(_ context.Context, spec RunSpec) (*Run, error) {
	m.calls = append(m.calls, spec)
	if m.failAt == len(m.calls) {
		return &Run{Spec: spec}, errors.New("boom")
	}
	r := &LoadResult{Mode: "rate", Rate: spec.Rate, Connections: 64, Requests: 1000, Latency: Latency{P99: m.p99Low}}
	switch {
	case spec.Rate == 0:
		r.Mode, r.ThroughputRPS, r.Latency.P99 = "closed", m.capacity, 50_000
	case spec.Rate <= m.capacity:
		r.ThroughputRPS = spec.Rate
	default:
		r.ThroughputRPS, r.Latency.P99 = m.capacity, 200_000
	}
	return &Run{Spec: spec, Result: r, Command: "dhtkv-load ..."}, nil
}

func testSearchConfig() SearchConfig {
	return SearchConfig{
		Fractions: []float64{0.5, 0.7, 0.85, 1.0}, Refine: 1, Descend: 2,
		P99Threshold: 10 * time.Millisecond, MinThroughput: 0.95, MaxFailFrac: 0.01,
		StepDuration: time.Second, Warmup: time.Second,
	}
}

func rates(calls []RunSpec) []float64 {
	var out []float64
	for _, c := range calls {
		out = append(out, c.Rate)
	}
	return out
}

func TestSearchAllPass(t *testing.T) {
	// Pacing can beat the closed loop: every ladder step passes.
	m := &modelRunner{capacity: 10_000, p99Low: 2_000}
	s, err := FindSaturation(context.Background(), m, RunSpec{Workload: "get"}, testSearchConfig())
	if err != nil {
		t.Fatal(err)
	}
	want := []float64{0, 5000, 7000, 8500, 10000}
	if got := rates(m.calls); !equalF(got, want) {
		t.Errorf("rates tried %v, want %v", got, want)
	}
	if s.Upper != 10_000 || s.Saturation != 10_000 {
		t.Errorf("upper %v saturation %v", s.Upper, s.Saturation)
	}
	if FixedRate(s, 0.8) != 8000 {
		t.Errorf("fixed rate %v, want 8000", FixedRate(s, 0.8))
	}
	if m.calls[0].Duration != time.Second || m.calls[1].Warmup != time.Second || m.calls[1].Workload != "get" {
		t.Errorf("spec not propagated: %+v", m.calls[1])
	}
}

func TestSearchStopsAtFirstFailureAndRefines(t *testing.T) {
	// The closed loop reports 10k, but only 8k can be sustained at low latency.
	m := &modelRunner{capacity: 10_000, p99Low: 2_000}
	runner := &cappedRunner{modelRunner: m, sustainable: 8_000}
	s, err := FindSaturation(context.Background(), runner, RunSpec{Workload: "put"}, testSearchConfig())
	if err != nil {
		t.Fatal(err)
	}
	// 0.5, 0.7 pass; 0.85 (8500) fails; bisection tries 7750 and passes.
	want := []float64{0, 5000, 7000, 8500, 7750}
	if got := rates(m.calls); !equalF(got, want) {
		t.Errorf("rates tried %v, want %v", got, want)
	}
	if s.Saturation != 7750 {
		t.Errorf("saturation %v, want 7750", s.Saturation)
	}
	if len(s.Steps) != 5 || s.Steps[3].Pass || !s.Steps[4].Pass {
		t.Errorf("steps %+v", s.Steps)
	}
}

// cappedRunner makes rates above sustainable fail on latency.
type cappedRunner struct {
	*modelRunner
	sustainable float64
}

func (c *cappedRunner) Run(ctx context.Context, spec RunSpec) (*Run, error) {
	r, err := c.modelRunner.Run(ctx, spec)
	if err == nil && spec.Rate > c.sustainable {
		r.Result.Latency.P99 = 50_000
	}
	return r, err
}

func TestSearchDescendsWhenEverythingFails(t *testing.T) {
	m := &modelRunner{capacity: 10_000, p99Low: 2_000}
	runner := &cappedRunner{modelRunner: m, sustainable: 2_000}
	s, err := FindSaturation(context.Background(), runner, RunSpec{}, testSearchConfig())
	if err != nil {
		t.Fatal(err)
	}
	// Halving finds 1250; bisection towards the failing 2500 then finds 1875.
	want := []float64{0, 5000, 2500, 1250, 1875}
	if got := rates(m.calls); !equalF(got, want) {
		t.Errorf("rates tried %v, want %v", got, want)
	}
	if s.Saturation != 1875 {
		t.Errorf("saturation %v, want 1875", s.Saturation)
	}
}

func TestSearchNothingPasses(t *testing.T) {
	m := &modelRunner{capacity: 10_000, p99Low: 20_000} // p99 always above 10 ms
	s, err := FindSaturation(context.Background(), m, RunSpec{}, testSearchConfig())
	if err != nil {
		t.Fatal(err)
	}
	if s.Saturation != 0 {
		t.Errorf("saturation %v, want 0", s.Saturation)
	}
	if got := FixedRate(s, 0.8); got != 1000 { // 0.8 × lowest tried (1250)
		t.Errorf("fixed rate %v, want 1000", got)
	}
}

func TestSearchPropagatesErrors(t *testing.T) {
	m := &modelRunner{capacity: 10_000, p99Low: 2_000, failAt: 3}
	s, err := FindSaturation(context.Background(), m, RunSpec{}, testSearchConfig())
	if err == nil {
		t.Fatal("want error")
	}
	if s.Saturation != 5000 || len(s.Steps) != 2 {
		t.Errorf("partial search lost: %+v", s)
	}
	m = &modelRunner{capacity: 0.5}
	if _, err := FindSaturation(context.Background(), m, RunSpec{}, testSearchConfig()); err == nil {
		t.Error("want error when the closed loop completes nothing")
	}
}

func TestJudge(t *testing.T) {
	cfg := testSearchConfig()
	ok := func() *LoadResult {
		return &LoadResult{Requests: 10_000, ThroughputRPS: 1000, Latency: Latency{P99: 3000}, Status: map[string]int64{"200": 9990, "404": 10}}
	}
	if pass, why := Judge(ok(), 1000, cfg); !pass {
		t.Errorf("ok run failed: %s", why)
	}
	for name, mutate := range map[string]func(*LoadResult){
		"slow":      func(r *LoadResult) { r.Latency.P99 = 10_001 },
		"behind":    func(r *LoadResult) { r.ThroughputRPS = 940 },
		"unsent":    func(r *LoadResult) { r.Unsent = 3 },
		"5xx":       func(r *LoadResult) { r.Status["503"] = 200 },
		"timeouts":  func(r *LoadResult) { r.Errors.Timeout = 101 },
		"no answer": func(r *LoadResult) { r.Requests = 0 },
	} {
		r := ok()
		mutate(r)
		if pass, why := Judge(r, 1000, cfg); pass {
			t.Errorf("%s: passed (%s)", name, why)
		}
	}
	r := ok()
	r.Errors.Timeout = 100 // exactly 1%: allowed
	if pass, why := Judge(r, 1000, cfg); !pass {
		t.Errorf("1%% errors failed: %s", why)
	}
}

func equalF(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Abs(a[i]-b[i]) > 0.5 {
			return false
		}
	}
	return true
}

// flakyRunner fails the first attempt at each listed rate on latency.
type flakyRunner struct {
	*modelRunner
	flaky map[float64]bool
}

func (f *flakyRunner) Run(ctx context.Context, spec RunSpec) (*Run, error) {
	r, err := f.modelRunner.Run(ctx, spec)
	if err == nil && f.flaky[spec.Rate] {
		delete(f.flaky, spec.Rate)
		r.Result.Latency.P99 = 80_000
	}
	return r, err
}

func TestSearchRetriesNoise(t *testing.T) {
	m := &modelRunner{capacity: 10_000, p99Low: 2_000}
	runner := &flakyRunner{modelRunner: m, flaky: map[float64]bool{7000: true}}
	cfg := testSearchConfig()
	cfg.Retries = 1
	s, err := FindSaturation(context.Background(), runner, RunSpec{}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := []float64{0, 5000, 7000, 7000, 8500, 10000}
	if got := rates(m.calls); !equalF(got, want) {
		t.Errorf("rates tried %v, want %v", got, want)
	}
	if s.Saturation != 10_000 || s.Steps[2].Pass || !s.Steps[3].Pass {
		t.Errorf("saturation %v, steps %+v", s.Saturation, s.Steps)
	}

	// A real limit fails twice and stops the ladder.
	m = &modelRunner{capacity: 10_000, p99Low: 2_000}
	s, err = FindSaturation(context.Background(), &cappedRunner{modelRunner: m, sustainable: 6_000}, RunSpec{}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	want = []float64{0, 5000, 7000, 7000, 6000}
	if got := rates(m.calls); !equalF(got, want) {
		t.Errorf("rates tried %v, want %v", got, want)
	}
	if s.Saturation != 6000 {
		t.Errorf("saturation %v, want 6000", s.Saturation)
	}
}

func TestSearchRejectsFailingClosedLoop(t *testing.T) {
	m := &erroringRunner{}
	s, err := FindSaturation(context.Background(), m, RunSpec{}, testSearchConfig())
	if err == nil || len(s.Steps) != 1 {
		t.Fatalf("err %v, steps %d; want an error and the probe recorded", err, len(s.Steps))
	}
}

// erroringRunner answers like a load generator whose requests time out.
type erroringRunner struct{}

func (erroringRunner) Run(_ context.Context, spec RunSpec) (*Run, error) {
	r := &LoadResult{Mode: "closed", Requests: 72, ThroughputRPS: 20, Status: map[string]int64{"201": 8}}
	r.Errors.Timeout = 64
	return &Run{Spec: spec, Result: r}, nil
}

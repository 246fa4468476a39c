package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Bench runs all systems and scenarios and writes the reports.
type Bench struct {
	cfg      Config
	machine  Machine
	pin      Pinning // where the servers and the load generator run
	hz       int     // clock ticks per second of /proc/PID/stat
	procs    *Procs
	tmp      string
	ceilings map[string]*CeilingFigure // by workload, filled as the baseline runs
	results  []*ScenarioResult
}

// Run executes the benchmark. Scenario failures do not stop the other
// scenarios: each gets a report saying what failed, and Run returns an error
// at the end. Cancelling ctx (Ctrl-C) stops at once.
func (b *Bench) Run(ctx context.Context) error {
	b.ceilings = make(map[string]*CeilingFigure)
	b.procs = &Procs{}
	defer b.procs.StopAll()

	tmp, err := os.MkdirTemp("", "dhtkv-bench-*")
	if err != nil {
		return fmt.Errorf("create temp dir: %w", err)
	}
	b.tmp = tmp
	keep := b.cfg.Keep
	defer func() {
		b.procs.StopAll() // before removing their data directories
		if keep {
			slog.Info("kept temp dir", "path", tmp)
			return
		}
		os.RemoveAll(tmp)
	}()
	slog.Info("bench starting", "quick", b.cfg.Quick, "tmp", tmp, "out", b.cfg.Out)

	if err := b.checkBinaries(); err != nil {
		return err
	}
	if err := os.MkdirAll(b.cfg.Out, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", b.cfg.Out, err)
	}
	b.machine = detectMachine(ctx, b.cfg.Repo)
	if b.pin, err = choosePinning(b.cfg.Pin, allowedCPUs(), lookTaskset()); err != nil {
		return err
	}
	b.hz = clockTicks(ctx)
	slog.Info("placement", "pinning", b.pin.Describe())

	var failed []string
	for _, sys := range Systems() {
		if !b.selected(sys) {
			continue
		}
		for _, r := range b.runSystem(ctx, sys) {
			if r.Err != nil {
				failed = append(failed, r.Name)
			}
		}
		if ctx.Err() != nil {
			keep = true // the partial state is what a reader will want to look at
			return fmt.Errorf("interrupted; README summary not updated: %w", ctx.Err())
		}
	}
	if len(b.results) == 0 {
		return errors.New("no scenario selected")
	}
	block := RenderSummary(b.results, b.machine, b.cfg.Quick, b.cfg.P99Threshold, b.setupNotes())
	if err := UpdateReadme(filepath.Join(b.cfg.Out, "README.md"), block); err != nil {
		return err
	}
	slog.Info("summary written", "path", filepath.Join(b.cfg.Out, "README.md"))
	if len(failed) > 0 {
		keep = true
		return fmt.Errorf("scenarios failed: %s (logs kept in %s)", strings.Join(failed, ", "), tmp)
	}
	return nil
}

// selected applies --only, which names systems or scenarios.
func (b *Bench) selected(sys System) bool {
	if len(b.cfg.Only) == 0 || b.cfg.Only[sys.Name] {
		return true
	}
	for _, s := range sys.Scenarios {
		if b.cfg.Only[s.Name] {
			return true
		}
	}
	return false
}

// checkBinaries fails early, before any server starts, when a binary the
// selected systems need is missing. The baseline is needed whenever its
// system runs: dhtkv's figures mean little without the ratio to it.
func (b *Bench) checkBinaries() error {
	need := []string{filepath.Join(b.cfg.Bin, "dhtkv"), filepath.Join(b.cfg.Bin, "dhtkv-load")}
	for _, sys := range Systems() {
		if sys.Ceiling && b.selected(sys) {
			need = append(need, b.cfg.Baseline)
		}
	}
	for _, p := range need {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("need %s (run `make build`): %w", p, err)
		}
	}
	return nil
}

// runSystem starts sys, fills it and runs its scenarios, writing each
// scenario's report as soon as it is done so an interrupted run leaves
// whatever finished.
func (b *Bench) runSystem(ctx context.Context, sys System) []*ScenarioResult {
	var specs []ScenarioSpec
	for _, s := range sys.Scenarios {
		if len(b.cfg.Only) == 0 || b.cfg.Only[sys.Name] || b.cfg.Only[s.Name] {
			specs = append(specs, s)
		}
	}
	dir := filepath.Join(b.tmp, sys.Name)
	var out []*ScenarioResult
	finish := func(r *ScenarioResult) {
		b.results = append(b.results, r)
		out = append(out, r)
		plots, err := renderPlots(b.cfg.Out, r)
		if err != nil && r.Err == nil {
			r.Err = err
		}
		r.Plots = plots
		path := filepath.Join(b.cfg.Out, r.Name+".md")
		if err := os.WriteFile(path, []byte(RenderScenario(r)), 0o644); err != nil {
			slog.Error("write report", "path", path, "err", err)
			if r.Err == nil {
				r.Err = err
			}
		}
		if r.Err != nil {
			slog.Error("scenario failed", "scenario", r.Name, "err", r.Err)
		} else {
			slog.Info("scenario done", "scenario", r.Name, "report", path)
		}
	}
	failAll := func(template *ScenarioResult, err error) []*ScenarioResult {
		for _, s := range specs {
			r := *template
			r.Name, r.Title, r.Workload, r.Err = s.Name, s.Title, s.Workload, err
			finish(&r)
		}
		return out
	}

	slog.Info("starting system", "system", sys.Name)
	rs, err := b.start(ctx, sys, dir)
	tmpl := b.newResult(sys, ScenarioSpec{}, nil, nil)
	if err != nil {
		return failAll(tmpl, fmt.Errorf("start %s: %w", sys.Name, err))
	}
	defer rs.stop()
	tmpl.Servers = rs.commands

	runner := &loadRunner{
		bin: filepath.Join(b.cfg.Bin, "dhtkv-load"), displayBin: b.displayPath(filepath.Join(b.cfg.Bin, "dhtkv-load")),
		targets: rs.targets, keyspace: b.cfg.Fill, valueSize: b.cfg.ValueSize,
		connections: b.cfg.Connections, ack: sys.Ack, from: sys.From, timeout: b.cfg.Timeout,
		launch: b.pin.Launch(rs.split.Load), logDir: dir, prefix: sys.Name,
	}
	// The fill is followed by a 1 s closed-loop GET pass over the same keys,
	// which doubles as a check that the fill is readable.
	slog.Info("filling", "system", sys.Name, "keys", b.cfg.Fill)
	fill, err := runner.Run(ctx, RunSpec{Label: "fill", Workload: "get", Fill: b.cfg.Fill, Duration: time.Second})
	tmpl.FillRun = fill
	if err == nil {
		err = rs.checkAlive()
	}
	if err != nil {
		return failAll(tmpl, fmt.Errorf("fill %s: %w", sys.Name, err))
	}
	if n := fill.Result.Status["404"]; n > 0 {
		tmpl.SystemNotes = append(tmpl.SystemNotes, fmt.Sprintf("**warning**: the GET check after the fill got %d × 404 of %d requests: filled keys were not all readable", n, fill.Result.Requests))
	}
	slog.Info("filled", "system", sys.Name, "elapsed", fill.Elapsed.Round(time.Millisecond))

	for _, spec := range specs {
		r := b.newResult(sys, spec, rs, fill)
		r.SystemNotes = tmpl.SystemNotes
		runner.prefix = spec.Name
		runner.seq = 0
		b.runScenario(ctx, sys, spec, rs, runner, r)
		finish(r)
		if ctx.Err() != nil {
			break
		}
	}
	return out
}

// newResult fills in what a scenario report says about its set-up.
func (b *Bench) newResult(sys System, spec ScenarioSpec, rs *running, fill *Run) *ScenarioResult {
	r := &ScenarioResult{
		Name: spec.Name, Title: spec.Title, Workload: spec.Workload, IsCeiling: sys.Ceiling,
		Quick: b.cfg.Quick, Machine: b.machine, Threshold: b.cfg.P99Threshold, FixedFrac: b.cfg.FixedFrac,
		FillRun: fill, Pinning: b.pin.Describe(), Pinned: b.pin.Pinned,
	}
	if rs != nil {
		r.Servers = rs.commands
	}
	valueMiB := float64(b.cfg.Fill) * float64(b.cfg.ValueSize) / (1 << 20)
	r.SystemNotes = append(r.SystemNotes, "system: "+sys.Title)
	if sys.Ceiling {
		r.SystemNotes = append(r.SystemNotes, fmt.Sprintf("data: %d keys × %d B values (%.0f MiB) filled before the first scenario; the baseline keeps everything in memory",
			b.cfg.Fill, b.cfg.ValueSize, valueMiB))
	} else {
		r.SystemNotes = append(r.SystemNotes, fmt.Sprintf("data: %d keys × %d B values (%.0f MiB of values) filled before the first scenario, %.1f× the read cache of `--cache-bytes %d` (%.0f MiB), so most GETs miss the cache and go to Pebble",
			b.cfg.Fill, b.cfg.ValueSize, valueMiB, valueMiB/(float64(b.cfg.CacheBytes)/(1<<20)), b.cfg.CacheBytes, float64(b.cfg.CacheBytes)/(1<<20)))
	}
	if sys.Nodes > 1 {
		r.SystemNotes = append(r.SystemNotes, fmt.Sprintf("%d nodes on one machine; every request carries ack=%d&from=%d; the load generator spreads its connections round-robin over all nodes; profiles are taken from node 1 only", sys.Nodes, sys.Ack, sys.From))
	}
	r.SystemNotes = append(r.SystemNotes,
		fmt.Sprintf("load: %d connections in every run, uniform keys over the %d filled keys (every GET hits), %d B PUT bodies, %s request timeout", b.cfg.Connections, b.cfg.Fill, b.cfg.ValueSize, b.cfg.Timeout),
		fmt.Sprintf("runs: search steps %s each, measured run %s, each after a %s warm-up; scenarios on one system run in the order get, mixed, put on the same data", b.cfg.StepDuration, b.cfg.Duration, b.cfg.Warmup),
		"placement: "+b.pin.Placement(b.pin.Split(sys.Nodes)))
	return r
}

// runScenario searches the saturation point, then runs the measured
// fixed-rate run while profiling node 1. Errors land in r.Err.
func (b *Bench) runScenario(ctx context.Context, sys System, spec ScenarioSpec, rs *running, runner Runner, r *ScenarioResult) {
	slog.Info("scenario", "scenario", spec.Name)
	r.LoadStart = loadAvg()
	defer func() { r.LoadEnd = loadAvg() }()
	base := RunSpec{Label: spec.Name, Workload: spec.Workload, ReadRatio: spec.ReadRatio}
	search, err := FindSaturation(ctx, runner, base, b.searchConfig())
	r.Search = search
	if err != nil {
		r.Err = fmt.Errorf("saturation search: %w", errors.Join(err, rs.checkAlive()))
		return
	}
	r.FixedRate = FixedRate(search, b.cfg.FixedFrac)
	fixed := base
	fixed.Label, fixed.Rate, fixed.Duration, fixed.Warmup = "fixed", r.FixedRate, b.cfg.Duration, b.cfg.Warmup
	fixed.Timeline = true

	var profiles chan *Profiles
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if len(rs.admins) > 0 {
		profiles = make(chan *Profiles, 1)
		seconds := max(1, int(b.cfg.Duration/time.Second))
		go func() {
			profiles <- captureProfiles(pctx, rs.admins[0], b.cfg.Warmup, seconds, b.cfg.Contention, filepath.Dir(rs.procs[0].LogPath), spec.Name)
		}()
	}
	slog.Info("fixed-rate run", "scenario", spec.Name, "rate", r.FixedRate, "duration", b.cfg.Duration)
	meter := startCPUMeter(ctx, rs.pids(), b.cfg.Warmup)
	r.Fixed, err = runner.Run(ctx, fixed)
	if r.CPU, r.CPUNote = b.serverCPU(meter, r.Fixed); r.CPUNote != "" {
		slog.Warn("server cpu per request not measured", "scenario", spec.Name, "why", r.CPUNote)
	}
	if err != nil {
		r.Err = fmt.Errorf("fixed-rate run: %w", errors.Join(err, rs.checkAlive()))
		return
	}
	if err := rs.checkAlive(); err != nil {
		r.Err = err
	}
	if profiles != nil {
		p := <-profiles
		subtitle := fmt.Sprintf("%s at %.0f rps, node 1 (admin %s)", spec.Workload, r.FixedRate, strings.TrimPrefix(p.Node, "http://"))
		art, err := renderProfiles(b.cfg.Out, spec.Name, subtitle, p)
		if err != nil {
			r.Err = errors.Join(r.Err, err)
		}
		r.Profiles = art
	}

	if sys.Ceiling {
		r.CeilingNote = "This is the ceiling itself: the baseline server (cmd/dhtkv-baseline), an in-memory fasthttp server with dhtkv's entity API, the most the HTTP layer allows on this machine."
		b.ceilings[spec.Workload] = &CeilingFigure{Scenario: spec.Name, Saturation: search.Saturation, Upper: search.Upper, Fixed: r.Fixed.Result}
		return
	}
	switch c := b.ceilings[spec.Workload]; {
	case c != nil:
		r.Ceiling = c
		if c.Saturation <= 0 {
			r.CeilingNote = "The baseline found no saturation point for this workload in this run, so no ratio is given."
		}
	default:
		r.CeilingNote = "The baseline was not measured for this workload in this run (see --only), so no ratio is given."
	}
}

func (b *Bench) searchConfig() SearchConfig {
	return SearchConfig{
		Fractions:     b.cfg.Fractions,
		Refine:        b.cfg.Refine,
		Descend:       b.cfg.Descend,
		Retries:       b.cfg.Retries,
		P99Threshold:  b.cfg.P99Threshold,
		MinThroughput: 0.95,
		MaxFailFrac:   0.01,
		StepDuration:  b.cfg.StepDuration,
		Warmup:        b.cfg.Warmup,
	}
}

// setupNotes are the run-wide settings quoted above the summary table.
func (b *Bench) setupNotes() []string {
	notes := []string{
		fmt.Sprintf("data: %d keys × %d B filled per system; dhtkv nodes run with `--cache-bytes %d` (%.0f MiB), so the data is %.1f× the read cache",
			b.cfg.Fill, b.cfg.ValueSize, b.cfg.CacheBytes, float64(b.cfg.CacheBytes)/(1<<20),
			float64(b.cfg.Fill)*float64(b.cfg.ValueSize)/float64(b.cfg.CacheBytes)),
		fmt.Sprintf("load: `dhtkv-load`, %d connections, uniform keys; search steps %s, measured runs %s at %.0f%% of saturation, %s warm-up each",
			b.cfg.Connections, b.cfg.StepDuration, b.cfg.Duration, 100*b.cfg.FixedFrac, b.cfg.Warmup),
		"cluster: 3 nodes on this machine, ack=2 from=3, load spread over all three",
		"placement: " + b.pin.Describe(),
		"server CPU/request: user+system time of a system's server processes (/proc/PID/stat, summed over the cluster's three) over the fixed-rate run, per request; node 1 of dhtkv was being profiled meanwhile, the baseline was not",
		"ceiling: the baseline server `" + b.displayPath(b.cfg.Baseline) + "` (cmd/dhtkv-baseline): dhtkv's entity API and fasthttp settings over an in-memory map",
	}
	return notes
}

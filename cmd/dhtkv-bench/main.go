// Command dhtkv-bench is the driver behind `make bench` and `make
// bench-quick`. It starts the baseline (bin/dhtkv-baseline, an in-memory
// server with the same API, whose throughput is the ceiling dhtkv's figures
// are quoted against), one dhtkv node (with and without fsync) and a 3-node
// cluster, each fresh on loopback ports in a temporary directory; fills each;
// finds the saturation point of PUT, GET and mixed load with bin/dhtkv-load;
// measures a fixed rate below it while profiling the server; and writes a
// Markdown report with flame graphs per scenario plus a summary table in
// docs/reports/README.md. A quick run (--quick, make bench-quick) writes
// to bench-quick-out/ instead, and refuses docs/reports: its figures are
// not measurements, and the committed reports are a full run's.
//
// Everything runs on 127.0.0.1, and every child process is killed when the
// driver exits or is interrupted.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

func main() {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, nil)))
	cfg, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		slog.Error("bad arguments", "err", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	b := &Bench{cfg: cfg}
	err = b.Run(ctx)
	elapsed := time.Since(start).Round(time.Second)
	if err != nil {
		slog.Error("bench failed", "err", err, "elapsed", elapsed)
		stop()
		os.Exit(1)
	}
	slog.Info("bench done", "elapsed", elapsed, "reports", cfg.Out)
}

// Config is the driver's configuration after flags and mode defaults.
type Config struct {
	Quick        bool
	Out          string
	Bin          string
	Repo         string
	Baseline     string        // the baseline server binary
	Duration     time.Duration // the measured fixed-rate run
	StepDuration time.Duration // each saturation-search run
	Warmup       time.Duration
	P99Threshold time.Duration
	Timeout      time.Duration
	Keep         bool
	Connections  int
	Fill         int64
	CacheBytes   int64
	ValueSize    int
	Fractions    []float64
	Refine       int
	Descend      int
	Retries      int
	FixedFrac    float64
	Only         map[string]bool
	Pin          PinMode
	Contention   Contention // the mutex and block profiles' rates during the measured run
}

// modeDefaults are sized so `make bench` stays well under 30 minutes and
// `make bench-quick` under 3 on a 2-core machine (10 scenarios). The full
// fill is 100k × 1 KiB against a 16 MiB read cache: about 6× the cache, so
// reads exercise Pebble, yet the fill takes seconds rather than the minutes
// that 300k synced writes against the 64 MiB default cache would.
func modeDefaults(quick bool) Config {
	if quick {
		return Config{
			Duration: 2 * time.Second, StepDuration: 1500 * time.Millisecond, Warmup: 500 * time.Millisecond,
			Fill: 10_000, CacheBytes: 2 << 20, Fractions: []float64{0.6, 0.9}, Refine: 0, Descend: 1, Retries: 0,
		}
	}
	return Config{
		Duration: 30 * time.Second, StepDuration: 5 * time.Second, Warmup: 2 * time.Second,
		Fill: 100_000, CacheBytes: 16 << 20, Fractions: []float64{0.5, 0.7, 0.85, 1.0}, Refine: 1, Descend: 2, Retries: 1,
	}
}

func parseFlags(args []string) (Config, error) {
	fs := flag.NewFlagSet("dhtkv-bench", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "small data and short runs: checks that the benchmark works (< 3 min)")
	out := fs.String("out", "", "directory for reports, flame graphs and the README summary (default "+fullOut+", quick "+quickOut+"; quick mode refuses "+fullOut+")")
	bin := fs.String("bin", "bin", "directory holding dhtkv and dhtkv-load")
	baseline := fs.String("baseline", "", "the in-memory baseline server binary, built by make build (default: dhtkv-baseline in --bin)")
	duration := fs.Duration("duration", 0, "measured fixed-rate run (default 30s, quick 2s)")
	step := fs.Duration("step-duration", 0, "each saturation-search run (default 5s, quick 1.5s)")
	warmup := fs.Duration("warmup", 0, "warm-up before every run (default 2s, quick 500ms)")
	threshold := fs.Duration("p99-threshold", 10*time.Millisecond, "a search step fails if its p99 is above this")
	timeout := fs.Duration("timeout", 2*time.Second, "per-request timeout passed to dhtkv-load")
	keep := fs.Bool("keep", false, "keep the temporary directory (data, server logs, raw load output and profiles)")
	conns := fs.Int("connections", 64, "connections for every load run")
	fill := fs.Int64("fill", 0, "keys to fill per system (default 100000, quick 10000)")
	cache := fs.Int64("cache-bytes", 0, "dhtkv --cache-bytes (default 16 MiB, quick 2 MiB)")
	valueSize := fs.Int("value-size", 1024, "value size in bytes")
	fixedFrac := fs.Float64("fixed-fraction", 0.8, "fixed-rate run as a fraction of the saturation point")
	pin := pinFlag(fs)
	mutexFraction := fs.Int("mutex-profile-fraction", 100, "during each measured run, sample 1 in N contended mutex events on the profiled node (0: no mutex profile)")
	blockRate := fs.Duration("block-profile-rate", time.Millisecond, "during each measured run, sample blocking events on the profiled node, one per this much time blocked (0: no block profile)")
	only := fs.String("only", "", "comma-separated systems (ceiling for the baseline, node, node-nosync, cluster) or scenarios (e.g. node-get) to run")
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}

	cfg := modeDefaults(*quick)
	cfg.Quick, cfg.Keep, cfg.P99Threshold, cfg.Timeout = *quick, *keep, *threshold, *timeout
	cfg.Connections, cfg.ValueSize, cfg.FixedFrac = *conns, *valueSize, *fixedFrac
	cfg.Pin = *pin
	cfg.Contention = Contention{MutexFraction: *mutexFraction, BlockRate: *blockRate}
	if *mutexFraction < 0 || *blockRate < 0 {
		return cfg, errors.New("--mutex-profile-fraction and --block-profile-rate must be 0 or more")
	}
	for _, o := range []struct {
		dst *time.Duration
		v   time.Duration
	}{{&cfg.Duration, *duration}, {&cfg.StepDuration, *step}, {&cfg.Warmup, *warmup}} {
		if o.v > 0 {
			*o.dst = o.v
		}
	}
	if *fill > 0 {
		cfg.Fill = *fill
	}
	if *cache > 0 {
		cfg.CacheBytes = *cache
	}
	if cfg.Duration < time.Second {
		return cfg, fmt.Errorf("--duration %s: at least 1s, the granularity of CPU profiles", cfg.Duration)
	}
	if cfg.FixedFrac <= 0 || cfg.FixedFrac > 1 {
		return cfg, fmt.Errorf("--fixed-fraction %v: must be in (0, 1]", cfg.FixedFrac)
	}
	if cfg.Connections < 1 || cfg.ValueSize < 1 {
		return cfg, errors.New("--connections and --value-size must be positive")
	}
	if *only != "" {
		cfg.Only = make(map[string]bool)
		known := make(map[string]bool)
		for _, s := range Systems() {
			known[s.Name] = true
			for _, sc := range s.Scenarios {
				known[sc.Name] = true
			}
		}
		for _, n := range strings.Split(*only, ",") {
			n = strings.TrimSpace(n)
			if !known[n] {
				return cfg, fmt.Errorf("--only: unknown system or scenario %q", n)
			}
			cfg.Only[n] = true
		}
	}

	wd, err := os.Getwd()
	if err != nil {
		return cfg, fmt.Errorf("working directory: %w", err)
	}
	cfg.Repo = repoRoot(wd)
	abs := func(p string) string {
		if filepath.IsAbs(p) {
			return filepath.Clean(p)
		}
		return filepath.Join(wd, p)
	}
	if *out == "" {
		*out = fullOut
		if cfg.Quick {
			*out = quickOut
		}
	}
	cfg.Out, cfg.Bin = abs(*out), abs(*bin)
	if cfg.Quick && samePath(cfg.Out, filepath.Join(cfg.Repo, fullOut)) {
		return cfg, fmt.Errorf("--quick --out %s: quick-mode figures would overwrite the committed reports of a full run (and make later builds -dirty); write them elsewhere (default %s)", *out, quickOut)
	}
	cfg.Baseline = filepath.Join(cfg.Bin, "dhtkv-baseline")
	if *baseline != "" {
		cfg.Baseline = abs(*baseline)
	}
	return cfg, nil
}

// The reports' directories: a full run's, committed, relative to the
// repository; a quick run's by default, git-ignored, relative to the
// working directory.
const (
	fullOut  = "docs/reports"
	quickOut = "bench-quick-out"
)

// samePath reports whether the absolute, clean paths a and b name the same
// directory: the same path, or, where both exist, the same file.
func samePath(a, b string) bool {
	if a == b {
		return true
	}
	sa, errA := os.Stat(a)
	sb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(sa, sb)
}

// repoRoot walks up from dir to the directory holding go.mod, so that
// reports name the commit and show binaries relative to the repository from
// any subdirectory; it falls back to dir.
func repoRoot(dir string) string {
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			return dir
		}
	}
}

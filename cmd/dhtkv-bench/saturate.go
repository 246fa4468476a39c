package main

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"time"
)

// SearchConfig tunes the saturation search.
type SearchConfig struct {
	// Fractions of the closed-loop throughput tried in ascending order; the
	// ladder stops at the first failing step.
	Fractions []float64
	// Refine is the number of bisection steps between the highest passing
	// and the lowest failing rate.
	Refine int
	// Descend is how many times the rate is halved below the first fraction
	// when even that fails, before giving up.
	Descend int
	// Retries is how often a failing step is repeated before it counts as
	// failed. On a shared machine one neighbour's burst can push a short
	// run's p99 over the threshold; a second run at the same rate tells
	// noise from a limit.
	Retries       int
	P99Threshold  time.Duration
	MinThroughput float64 // fraction of the target rate a step must achieve, e.g. 0.95
	MaxFailFrac   float64 // fraction of requests allowed to fail (errors, 5xx, 4xx but 404)
	StepDuration  time.Duration
	Warmup        time.Duration
}

// Step is one run of the search and its verdict.
type Step struct {
	Run    *Run
	Rate   float64 // target rate; 0 for the closed-loop probe
	Pass   bool
	Bad    bool   // the closed-loop probe itself was unusable (too many failures)
	Reason string // why it passed or failed, for the report
}

// Search is the outcome of FindSaturation.
type Search struct {
	Upper      float64 // closed-loop throughput, the upper bound
	Steps      []Step  // every run, in order, including the closed-loop probe
	Saturation float64 // highest passing rate; 0 if none passed
}

// Judge decides whether a constant-rate run kept up with its target: it must
// deliver MinThroughput of the rate, keep p99 within the threshold, leave no
// scheduled request unsent, and fail at most MaxFailFrac of requests. 404s do
// not count as failures; they are answers.
func Judge(r *LoadResult, rate float64, cfg SearchConfig) (bool, string) {
	p99 := time.Duration(r.Latency.P99) * time.Microsecond
	failed := failedRequests(r)
	summary := fmt.Sprintf("%.0f rps (%.1f%% of target), p99 %s", r.ThroughputRPS, 100*r.ThroughputRPS/rate, fmtDur(p99))
	switch {
	case r.Requests == 0:
		return false, "no requests completed"
	case p99 > cfg.P99Threshold:
		return false, fmt.Sprintf("%s > %s", summary, fmtDur(cfg.P99Threshold))
	case r.ThroughputRPS < cfg.MinThroughput*rate:
		return false, fmt.Sprintf("%s: below %.0f%% of target", summary, 100*cfg.MinThroughput)
	case r.Unsent > 0:
		return false, fmt.Sprintf("%s: %d requests never sent (client saturated)", summary, r.Unsent)
	case float64(failed) > cfg.MaxFailFrac*float64(r.Requests):
		return false, fmt.Sprintf("%s: %d failed requests (errors, 5xx or 4xx but 404)", summary, failed)
	}
	return true, summary
}

// failedRequests counts the requests the system did not serve: no answer,
// 5xx, or a 4xx but 404 (a 429 of a connection cap, a 413, a 400).
func failedRequests(r *LoadResult) int64 {
	n := r.ErrorCount()
	for code, c := range r.Status {
		if v, err := strconv.Atoi(code); err != nil || v/100 != 2 && v != 404 {
			n += c
		}
	}
	return n
}

// FindSaturation finds the highest constant rate the system sustains. A
// closed-loop run gives an upper bound U (what the system does when pushed
// with no pacing); constant-rate steps at cfg.Fractions of U then climb until
// one fails, optional bisection narrows the gap, and if even the lowest
// fraction fails the rate is halved a few times. Closed-loop throughput alone
// would overstate capacity: it is reached at the price of unbounded queueing.
func FindSaturation(ctx context.Context, r Runner, base RunSpec, cfg SearchConfig) (*Search, error) {
	s := &Search{}
	probe := base
	probe.Label, probe.Rate = "closed", 0
	probe.Duration, probe.Warmup = cfg.StepDuration, cfg.Warmup
	run, err := r.Run(ctx, probe)
	if err != nil {
		return s, fmt.Errorf("closed-loop probe: %w", err)
	}
	s.Upper = run.Result.ThroughputRPS
	if res := run.Result; float64(failedRequests(res)) > cfg.MaxFailFrac*float64(max(res.Requests, 1)) {
		s.Steps = append(s.Steps, Step{Run: run, Bad: true, Reason: "closed loop: too many failed requests"})
		return s, fmt.Errorf("closed-loop probe: %d of %d requests failed (connect %d, timeout %d, other %d, 5xx %d, 4xx but 404 %d); a saturation search on this would be meaningless",
			failedRequests(res), res.Requests, res.Errors.Connect, res.Errors.Timeout, res.Errors.Other, res.ServerErrors(),
			failedRequests(res)-res.ErrorCount()-res.ServerErrors())
	}
	s.Steps = append(s.Steps, Step{Run: run, Reason: fmt.Sprintf("closed loop: %.0f rps, p99 %s (upper bound)",
		s.Upper, fmtDur(time.Duration(run.Result.Latency.P99)*time.Microsecond))})
	slog.Info("closed-loop upper bound", "scenario", base.Label, "rps", math.Round(s.Upper))
	if s.Upper < 1 {
		return s, fmt.Errorf("closed-loop probe completed %d requests; nothing to search", run.Result.Requests)
	}

	var lowFail float64 // lowest failing rate seen, 0 = none yet
	try := func(rate float64) (bool, error) {
		rate = math.Max(1, math.Round(rate))
		var pass bool
		for attempt := 0; attempt <= cfg.Retries && !pass; attempt++ {
			spec := base
			spec.Label = fmt.Sprintf("step%d-%.0f", len(s.Steps), rate)
			spec.Rate, spec.Duration, spec.Warmup = rate, cfg.StepDuration, cfg.Warmup
			run, err := r.Run(ctx, spec)
			if err != nil {
				return false, err
			}
			var why string
			pass, why = Judge(run.Result, rate, cfg)
			if attempt > 0 {
				why = "retry: " + why
			}
			if !pass && attempt < cfg.Retries {
				why += "; retrying once to rule out noise"
			}
			s.Steps = append(s.Steps, Step{Run: run, Rate: rate, Pass: pass, Reason: why})
			slog.Info("step", "scenario", base.Label, "rate", rate, "pass", pass, "why", why)
		}
		if pass {
			s.Saturation = math.Max(s.Saturation, rate)
		} else if lowFail == 0 || rate < lowFail {
			lowFail = rate
		}
		return pass, nil
	}

	for _, f := range cfg.Fractions {
		pass, err := try(f * s.Upper)
		if err != nil {
			return s, err
		}
		if !pass {
			break
		}
	}
	if s.Saturation == 0 && len(cfg.Fractions) > 0 {
		rate := cfg.Fractions[0] * s.Upper
		for range cfg.Descend {
			rate /= 2
			pass, err := try(rate)
			if err != nil {
				return s, err
			}
			if pass {
				break
			}
		}
	}
	for range cfg.Refine {
		if s.Saturation == 0 || lowFail == 0 {
			break
		}
		mid := (s.Saturation + lowFail) / 2
		// Closer than 5% of U is within run-to-run noise on a shared machine.
		if mid-s.Saturation < 0.05*s.Upper {
			break
		}
		if _, err := try(mid); err != nil {
			return s, err
		}
	}
	return s, nil
}

// FixedRate is the rate of the measured run: frac of the saturation point,
// or, if no step passed, frac of the lowest rate tried, so there is still a
// profile and a latency distribution to look at (the report says so).
func FixedRate(s *Search, frac float64) float64 {
	if s.Saturation > 0 {
		return math.Max(1, math.Round(frac*s.Saturation))
	}
	low := s.Upper
	for _, st := range s.Steps {
		if st.Rate > 0 && st.Rate < low {
			low = st.Rate
		}
	}
	return math.Max(1, math.Round(frac*low))
}

// fmtDur prints a latency with a unit a reader can compare at a glance.
func fmtDur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%d µs", d.Microseconds())
	}
}

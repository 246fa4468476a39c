package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/dhtkv/dhtkv/internal/loadgen"
)

// LoadResult is the single JSON object `dhtkv-load --json` prints; the
// generator's own type is the one definition of that schema.
type LoadResult = loadgen.Result

// Latency holds percentiles in microseconds.
type Latency = loadgen.LatencySummary

// ParseLoadResult decodes dhtkv-load's JSON output, with its timeline when
// the run had --timeline (LoadResult.Timeline). Anything but exactly one
// JSON object (ignoring surrounding whitespace) is an error, because a
// half-written result would silently skew the saturation search, and so is
// a timeline dhtkv-load cannot have written (checkTimeline).
func ParseLoadResult(out []byte) (*LoadResult, error) {
	dec := json.NewDecoder(bytes.NewReader(out))
	var r LoadResult
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("decode dhtkv-load JSON: %w", err)
	}
	if dec.More() {
		return nil, errors.New("decode dhtkv-load JSON: trailing data after the result object")
	}
	if r.Mode == "" {
		return nil, errors.New("decode dhtkv-load JSON: no mode field; not a result object")
	}
	if err := checkTimeline(r.Timeline); err != nil {
		return nil, fmt.Errorf("decode dhtkv-load JSON: %w", err)
	}
	return &r, nil
}

// RunSpec is what varies between load runs of one scenario.
type RunSpec struct {
	Label     string  // short name for logs and file names, e.g. "closed", "step3"
	Workload  string  // put, get, mixed
	ReadRatio float64 // for mixed
	Rate      float64 // requests/s; 0 = closed loop
	Duration  time.Duration
	Warmup    time.Duration
	Fill      int64 // >0: PUT k0..k(Fill-1) before the run
	Timeline  bool  // --timeline: the run second by second in the result
}

// Run is one executed dhtkv-load invocation and what it printed.
type Run struct {
	Spec    RunSpec
	Command string // shell-quoted command line, as a reader would retype it
	Result  *LoadResult
	Stdout  string
	Stderr  string
	Elapsed time.Duration
}

// Runner executes load runs; the saturation search depends only on this, so
// it can be tested against a model of a server.
type Runner interface {
	Run(ctx context.Context, spec RunSpec) (*Run, error)
}

// loadRunner runs bin/dhtkv-load against one system.
type loadRunner struct {
	bin         string   // path to dhtkv-load
	displayBin  string   // how the command is shown in reports (repo-relative)
	targets     []string // base URLs
	keyspace    int64
	valueSize   int
	connections int
	ack, from   int
	timeout     time.Duration
	launch      Launch // pinned to the load generator's cores, or not
	logDir      string // raw stdout/stderr of each run land here
	prefix      string // file name prefix, the scenario name
	seq         int
}

func (l *loadRunner) args(spec RunSpec) []string {
	a := []string{
		"--targets", strings.Join(l.targets, ","),
		"--workload", spec.Workload,
	}
	if spec.Workload == "mixed" {
		a = append(a, "--read-ratio", strconv.FormatFloat(spec.ReadRatio, 'f', -1, 64))
	}
	a = append(a,
		"--dist", "uniform",
		"--keyspace", strconv.FormatInt(l.keyspace, 10),
		"--value-size", strconv.Itoa(l.valueSize),
	)
	if l.ack > 0 {
		a = append(a, "--ack", strconv.Itoa(l.ack), "--from", strconv.Itoa(l.from))
	}
	a = append(a,
		"--connections", strconv.Itoa(l.connections),
		"--rate", strconv.FormatFloat(spec.Rate, 'f', 0, 64),
		"--duration", spec.Duration.String(),
		"--warmup", spec.Warmup.String(),
		"--timeout", l.timeout.String(),
	)
	if spec.Rate > 0 {
		// Requests an overloaded server could not take in time are sent late
		// for at most this long; a failing search step then costs seconds,
		// not the generator's 10 s default, and still counts as failing.
		a = append(a, "--drain", min(10*time.Second, max(time.Second, spec.Duration/2)).String())
	}
	if spec.Fill > 0 {
		a = append(a, "--fill", strconv.FormatInt(spec.Fill, 10))
	}
	if spec.Timeline {
		a = append(a, "--timeline")
	}
	return append(a, "--json")
}

// Run executes one dhtkv-load invocation. The child gets its own process
// group and is killed with it when ctx ends (Ctrl-C), and its output is kept
// in logDir for post-mortems.
func (l *loadRunner) Run(ctx context.Context, spec RunSpec) (*Run, error) {
	l.seq++
	args := l.args(spec)
	run := &Run{Spec: spec, Command: l.launch.Display(l.displayBin, args)}
	path, argv, env := l.launch.Command(l.bin, args)
	cmd := exec.CommandContext(ctx, path, argv...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	setProcessGroup(cmd)
	killGroupOnCancel(cmd)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	run.Elapsed = time.Since(start)
	run.Stdout, run.Stderr = stdout.String(), stderr.String()
	base := filepath.Join(l.logDir, fmt.Sprintf("%s-%02d-%s", l.prefix, l.seq, spec.Label))
	_ = os.WriteFile(base+".json", stdout.Bytes(), 0o644)
	_ = os.WriteFile(base+".stderr", stderr.Bytes(), 0o644)
	if ctx.Err() != nil {
		return run, fmt.Errorf("load run %s: %w", spec.Label, ctx.Err())
	}
	if err != nil {
		return run, fmt.Errorf("load run %s (%s): %w: %s", spec.Label, run.Command, err, lastLines(run.Stderr, 5))
	}
	res, err := ParseLoadResult(stdout.Bytes())
	if err != nil {
		return run, fmt.Errorf("load run %s: %w", spec.Label, err)
	}
	run.Result = res
	return run, nil
}

// shellJoin quotes args so the printed command can be pasted into a shell.
func shellJoin(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:,=@%+") == "" {
			out[i] = a
		} else {
			out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(out, " ")
}

// lastLines returns the last n non-empty lines of s, for error messages.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

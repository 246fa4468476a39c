package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Server CPU per request: the user and system time of a system's server
// processes (/proc/PID/stat, summed over the processes: one for a node,
// three for the cluster) over a scenario's fixed-rate run, divided by the
// requests that run counted. It is steadier than throughput on a shared
// machine, where another program's load moves rps but hardly the CPU a
// request costs.

// parseProcStat returns the user and system time, in clock ticks, of a
// /proc/PID/stat line: its fields 14 (utime) and 15 (stime), which for a
// process cover all its threads, those that ended included. The command
// name, field 2, is in parentheses and may itself hold spaces and
// parentheses, so fields are counted from the last ')'.
func parseProcStat(b []byte) (user, system uint64, err error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, errors.New("proc stat: no ')' closing the command name")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state), so field n is f[n-3].
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("proc stat: %d fields after the command name, want at least 13", len(f))
	}
	if user, err = strconv.ParseUint(f[11], 10, 64); err != nil {
		return 0, 0, fmt.Errorf("proc stat utime: %w", err)
	}
	if system, err = strconv.ParseUint(f[12], 10, 64); err != nil {
		return 0, 0, fmt.Errorf("proc stat stime: %w", err)
	}
	return user, system, nil
}

// procTicks is the user+system CPU time of pid in clock ticks.
func procTicks(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("cpu time of pid %d: %w", pid, err)
	}
	u, s, err := parseProcStat(b)
	if err != nil {
		return 0, fmt.Errorf("cpu time of pid %d: %w", pid, err)
	}
	return u + s, nil
}

// sumTicks is procTicks summed over pids.
func sumTicks(pids []int) (uint64, error) {
	var t uint64
	for _, pid := range pids {
		n, err := procTicks(pid)
		if err != nil {
			return 0, err
		}
		t += n
	}
	return t, nil
}

// clockTicks is the unit of /proc/PID/stat's times, the kernel's USER_HZ
// (`getconf CLK_TCK`): 100 on every architecture Go supports on Linux,
// which is the fallback when getconf is missing.
func clockTicks(ctx context.Context) int {
	out, err := exec.CommandContext(ctx, "getconf", "CLK_TCK").Output()
	if err == nil {
		if hz, err := strconv.Atoi(strings.TrimSpace(string(out))); err == nil && hz > 0 {
			return hz
		}
	}
	slog.Warn("getconf CLK_TCK failed; assuming 100 ticks per second", "err", err)
	return 100
}

// CPUUsage is the server CPU time of one fixed-rate run.
type CPUUsage struct {
	Procs    int           // server processes summed
	Ticks    uint64        // their user+system clock ticks over Window
	Hz       int           // clock ticks per second
	Window   time.Duration // wall time between the two samples
	Requests int64         // requests the run counted in its measured window
}

// CPU is the CPU time the servers used.
func (u *CPUUsage) CPU() time.Duration {
	if u.Hz <= 0 {
		return 0
	}
	return time.Duration(u.Ticks) * time.Second / time.Duration(u.Hz)
}

// PerRequest is the server CPU time per request, 0 without requests.
func (u *CPUUsage) PerRequest() time.Duration {
	if u.Requests <= 0 {
		return 0
	}
	return u.CPU() / time.Duration(u.Requests)
}

// Cores is how many cores the servers kept busy on average.
func (u *CPUUsage) Cores() float64 {
	if u.Window <= 0 {
		return 0
	}
	return u.CPU().Seconds() / u.Window.Seconds()
}

// cpuMeter samples the CPU time of a system's servers when the load
// generator's warm-up ends, and again when stopped after the run, so the
// difference covers the measured window (and the few milliseconds the
// generator takes to start and, at the end, to drain and exit).
type cpuMeter struct {
	pids   []int
	cancel context.CancelFunc
	done   chan struct{}
	t0     time.Time
	before uint64
	err    error // of the first sample, or why it was not taken
}

// startCPUMeter takes the first sample of pids once delay has passed.
func startCPUMeter(ctx context.Context, pids []int, delay time.Duration) *cpuMeter {
	ctx, cancel := context.WithCancel(ctx)
	m := &cpuMeter{pids: pids, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		select {
		case <-ctx.Done():
			m.err = errors.New("the run ended before its warm-up did")
			return
		case <-time.After(delay):
		}
		m.t0 = time.Now()
		m.before, m.err = sumTicks(pids)
	}()
	return m
}

// stop takes the second sample and returns the usage between the two in
// ticks of hz per second, without Requests, which the caller knows.
func (m *cpuMeter) stop(hz int) (*CPUUsage, error) {
	m.cancel()
	<-m.done
	if m.err != nil {
		return nil, fmt.Errorf("server cpu time: %w", m.err)
	}
	after, err := sumTicks(m.pids)
	if err != nil {
		return nil, fmt.Errorf("server cpu time after the run: %w", err)
	}
	if after < m.before {
		return nil, fmt.Errorf("server cpu time went back from %d to %d ticks: a process was replaced", m.before, after)
	}
	return &CPUUsage{Procs: len(m.pids), Ticks: after - m.before, Hz: hz, Window: time.Since(m.t0)}, nil
}

// cpuPerRequest is how a report quotes u's CPU per request: "61.3 µs",
// or "—" without a measurement.
func cpuPerRequest(u *CPUUsage) string {
	if u == nil || u.Requests <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f µs", float64(u.PerRequest())/float64(time.Microsecond))
}

// serverCPU ends meter after the fixed-rate run fixed and returns the
// servers' usage over it, or why there is none.
func (b *Bench) serverCPU(meter *cpuMeter, fixed *Run) (*CPUUsage, string) {
	u, err := meter.stop(b.hz)
	switch {
	case err != nil:
		return nil, err.Error()
	case fixed == nil || fixed.Result == nil || fixed.Result.Requests == 0:
		return nil, "the fixed-rate run has no requests to divide the CPU time by"
	}
	u.Requests = fixed.Result.Requests
	return u, ""
}

// cpuRow is the report's result-table row on server CPU, or "" when there
// was no fixed-rate run to measure.
func cpuRow(s *ScenarioResult) string {
	switch {
	case s.CPU != nil:
		return fmt.Sprintf("| server CPU per request (user+system, %s) | %s (%.2f cores busy) |\n", procsPhrase(s.CPU.Procs), cpuPerRequest(s.CPU), s.CPU.Cores())
	case s.CPUNote != "":
		return fmt.Sprintf("| server CPU per request | not measured: %s |\n", mdEscape(s.CPUNote))
	}
	return ""
}

// cpuSection says how the server CPU was measured, under the fixed-rate
// run's figures.
func cpuSection(s *ScenarioResult) string {
	u := s.CPU
	if u == nil {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Server CPU: %s of user and system time (%d ticks at %d per second, `/proc/PID/stat`) of %s over %.1f s, from the end of the warm-up to dhtkv-load's exit: %s per request, %.2f cores busy on average.",
		fmtDur(u.CPU()), u.Ticks, u.Hz, procsPhrase(u.Procs), u.Window.Seconds(), cpuPerRequest(u), u.Cores())
	if s.Profiles != nil {
		b.WriteString(" Node 1 was being profiled (CPU and allocations) meanwhile, which costs it some CPU.")
	}
	if !s.Pinned {
		b.WriteString(" Unpinned, the servers shared their cores with the load generator.")
	}
	b.WriteString("\n\n")
	return b.String()
}

func procsPhrase(n int) string {
	if n == 1 {
		return "the server process"
	}
	return fmt.Sprintf("all %d server processes", n)
}

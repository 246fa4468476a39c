package main

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	// A real line (dhtkv under load), and its command name made awkward.
	line := "12345 (dhtkv) S 1 12345 12345 0 -1 4194560 9120 0 0 0 1520 371 0 0 20 0 9 0 4455821 1650192384 21403 18446744073709551615 1 1 0 0 0 0 0 0 2143420159 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
	for _, comm := range []string{"(dhtkv)", "(a b) c) d)", "()"} {
		l := "12345 " + comm + line[len("12345 (dhtkv)"):]
		u, s, err := parseProcStat([]byte(l))
		if err != nil || u != 1520 || s != 371 {
			t.Errorf("%s: utime %d, stime %d, %v; want 1520, 371", comm, u, s, err)
		}
	}
	for _, bad := range []string{"", "12345 dhtkv S 1", "1 (x) S 1 2 3", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 x 371 0"} {
		if _, _, err := parseProcStat([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	if _, err := procTicks(os.Getpid()); err != nil {
		t.Errorf("this process's /proc/PID/stat: %v", err)
	}
	if _, err := procTicks(-1); err == nil {
		t.Error("no error for pid -1")
	}
}

func TestCPUUsage(t *testing.T) {
	u := &CPUUsage{Procs: 3, Ticks: 250, Hz: 100, Window: 2 * time.Second, Requests: 50_000}
	if u.CPU() != 2500*time.Millisecond || u.PerRequest() != 50*time.Microsecond || u.Cores() != 1.25 {
		t.Errorf("cpu %s, per request %s, cores %g", u.CPU(), u.PerRequest(), u.Cores())
	}
	if got := cpuPerRequest(u); got != "50.0 µs" {
		t.Errorf("cpuPerRequest %q", got)
	}
	if cpuPerRequest(nil) != "—" || cpuPerRequest(&CPUUsage{Hz: 100}) != "—" {
		t.Error("no measurement is not —")
	}
}

// TestCPUMeter burns a known CPU time in this process between the meter's
// two samples and checks the meter saw it, as getrusage did.
func TestCPUMeter(t *testing.T) {
	rusage := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	m := startCPUMeter(context.Background(), []int{os.Getpid()}, 0)
	<-m.done // the first sample is taken
	start := rusage()
	for rusage()-start < 200*time.Millisecond {
	}
	burnt := rusage() - start
	u, err := m.stop(clockTicks(context.Background()))
	if err != nil {
		t.Fatal(err)
	}
	// Ticks are 10 ms, and the process's other threads run meanwhile.
	if d := u.CPU() - burnt; u.Procs != 1 || d < -30*time.Millisecond || d > 100*time.Millisecond {
		t.Errorf("meter %s (%d ticks over %s), getrusage %s", u.CPU(), u.Ticks, u.Window, burnt)
	}

	ctx, cancel := context.WithCancel(context.Background())
	early := startCPUMeter(ctx, []int{os.Getpid()}, time.Hour)
	cancel()
	if _, err := early.stop(100); err == nil {
		t.Error("a meter stopped before its first sample gave a usage")
	}
	gone := startCPUMeter(context.Background(), []int{-1}, 0)
	if _, err := gone.stop(100); err == nil {
		t.Error("a meter of no process gave a usage")
	}
}

package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Machine describes where the numbers were taken; a figure from a 2-core
// shared VM means little without it.
type Machine struct {
	NProc     int
	CPUModel  string
	MemTotal  string
	Kernel    string
	GoVersion string
	LoadAvg   string // at the start of the run: a noisy neighbour shows here
	GitRev    string
	Date      time.Time
}

func detectMachine(ctx context.Context, repo string) Machine {
	m := Machine{
		NProc:     runtime.NumCPU(),
		CPUModel:  "unknown",
		MemTotal:  "unknown",
		GoVersion: runtime.Version(),
		Date:      time.Now().UTC(),
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				fields := strings.Fields(rest)
				if kb, err := strconv.ParseFloat(fields[0], 64); err == nil {
					m.MemTotal = strconv.FormatFloat(kb/(1<<20), 'f', 1, 64) + " GiB"
				}
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	m.LoadAvg = loadAvg()
	// The toolchain that built the binaries may differ from the driver's.
	if out, err := exec.CommandContext(ctx, "go", "version").Output(); err == nil {
		m.GoVersion = strings.TrimSpace(string(out))
	}
	cmd := exec.CommandContext(ctx, "git", "describe", "--always", "--dirty", "--abbrev=12")
	cmd.Dir = repo
	if out, err := cmd.Output(); err == nil {
		m.GitRev = strings.TrimSpace(string(out))
	} else {
		m.GitRev = "unknown (no commit yet?)"
	}
	return m
}

// loadAvg returns the 1, 5 and 15 minute load averages. On a shared 2-core
// machine a value well above 2 means someone else was competing for the CPU.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

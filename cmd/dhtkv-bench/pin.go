package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// Pinned mode: on a machine with enough cores, the servers run on the lower
// half of the cores and dhtkv-load on the upper half (taskset), each server
// with GOMAXPROCS equal to its cores, so that the generator's work does not
// land on the servers' cores and the figures are the servers' alone. On
// fewer cores, halves would leave a server one core or none, and the
// servers and the generator share every core, as they always did.

// PinMode is --pin.
type PinMode string

const (
	PinAuto PinMode = "auto" // pinned with at least minPinCores cores and taskset
	PinOn   PinMode = "on"   // pinned, or an error when that cannot be
	PinOff  PinMode = "off"  // never pinned
)

// minPinCores is the fewest cores on which --pin=auto pins: two for the
// servers and two for the generator.
const minPinCores = 4

// String implements flag.Value.
func (m *PinMode) String() string {
	if m == nil {
		return ""
	}
	return string(*m)
}

// Set implements flag.Value.
func (m *PinMode) Set(s string) error {
	switch v := PinMode(s); v {
	case PinAuto, PinOn, PinOff:
		*m = v
		return nil
	}
	return errors.New("want auto, on or off")
}

// pinFlag declares --pin on fs.
func pinFlag(fs *flag.FlagSet) *PinMode {
	m := PinAuto
	fs.Var(&m, "pin", fmt.Sprintf("run the servers and dhtkv-load on disjoint cores with taskset (servers on the lower half, each with GOMAXPROCS equal to its cores): auto (when the machine has at least %d cores and taskset), on or off", minPinCores))
	return &m
}

// CoreSplit is where a system's processes run when pinned.
type CoreSplit struct {
	Servers [][]int // the cores of each server process, in node order
	Load    []int   // dhtkv-load's cores
}

// SplitCores gives the lower half of cpus (rounded down) to the servers and
// the rest to the load generator. The servers' half is split among nodes
// in contiguous runs, the first nodes getting one core more when it does
// not divide evenly, so every system runs its servers on the same cores;
// with fewer server cores than nodes, every node gets the whole half
// (each its own GOMAXPROCS of them), as they would share it unpinned. cpus
// must hold at least two cores and nodes be at least one.
func SplitCores(cpus []int, nodes int) CoreSplit {
	half := len(cpus) / 2
	servers, load := cpus[:half:half], cpus[half:]
	s := CoreSplit{Load: slices.Clone(load)}
	if half < nodes {
		for range nodes {
			s.Servers = append(s.Servers, slices.Clone(servers))
		}
		return s
	}
	each, extra := half/nodes, half%nodes
	for i := range nodes {
		n := each
		if i < extra {
			n++
		}
		s.Servers = append(s.Servers, slices.Clone(servers[:n]))
		servers = servers[n:]
	}
	return s
}

// Pinning is the run's decision on pinning.
type Pinning struct {
	Mode    PinMode
	Pinned  bool
	CPUs    []int  // the cores the driver may run on, ascending
	Taskset string // its path; "" when not found
	Why     string // the reason for the decision, for the reports
}

// choosePinning decides for mode on a machine whose usable cores are cpus,
// with taskset at the given path ("" when it is missing). Only --pin=on
// can fail: it asks for what the machine cannot do.
func choosePinning(mode PinMode, cpus []int, taskset string) (Pinning, error) {
	p := Pinning{Mode: mode, CPUs: cpus, Taskset: taskset}
	n := len(cpus)
	switch {
	case mode == PinOff:
		p.Why = "--pin=off"
	case mode == PinOn && taskset == "":
		return p, fmt.Errorf("--pin=on: taskset not found (util-linux)")
	case mode == PinOn && n < 2:
		return p, fmt.Errorf("--pin=on: %d core, pinning needs at least 2", n)
	case mode == PinOn:
		p.Pinned, p.Why = true, "--pin=on"
	case mode != PinAuto:
		return p, fmt.Errorf("--pin %q: want auto, on or off", mode)
	case n < minPinCores:
		p.Why = fmt.Sprintf("--pin=auto: %d cores, pinning needs at least %d", n, minPinCores)
	case taskset == "":
		p.Why = "--pin=auto: taskset not found (util-linux)"
	default:
		p.Pinned, p.Why = true, fmt.Sprintf("--pin=auto: %d cores", n)
	}
	return p, nil
}

// Split is where a system of nodes servers runs: SplitCores when pinned,
// no cores (the whole machine) when not.
func (p Pinning) Split(nodes int) CoreSplit {
	if !p.Pinned {
		return CoreSplit{Servers: make([][]int, nodes)}
	}
	return SplitCores(p.CPUs, nodes)
}

// Launch starts a child on cores, or unpinned when Pinning is not.
func (p Pinning) Launch(cores []int) Launch {
	if !p.Pinned || len(cores) == 0 {
		return Launch{}
	}
	return Launch{Taskset: p.Taskset, Cores: cores}
}

// Describe is the run-wide sentence on pinning the reports quote.
func (p Pinning) Describe() string {
	if !p.Pinned {
		return fmt.Sprintf("unpinned (%s): the servers and dhtkv-load share cores %s, each with Go's default GOMAXPROCS", p.Why, formatCPUList(p.CPUs))
	}
	s := SplitCores(p.CPUs, 1)
	return fmt.Sprintf("pinned (%s): servers on cores %s, dhtkv-load on cores %s (taskset), the baseline and dhtkv-load with GOMAXPROCS equal to their cores, dhtkv with its own (at least --min-procs)",
		p.Why, formatCPUList(s.Servers[0]), formatCPUList(s.Load))
}

// Placement is the sentence on where one system's processes ran.
func (p Pinning) Placement(split CoreSplit) string {
	if !p.Pinned {
		return "the servers and the load generator share the machine's cores (unpinned), so the figures are for the pair, not the server alone"
	}
	var nodes []string
	for i, c := range split.Servers {
		nodes = append(nodes, fmt.Sprintf("node %d on cores %s", i+1, formatCPUList(c)))
	}
	if len(nodes) == 1 {
		nodes[0] = strings.Replace(nodes[0], "node 1", "the server", 1)
	}
	return fmt.Sprintf("pinned with taskset: %s; dhtkv-load on cores %s (GOMAXPROCS=%d)",
		strings.Join(nodes, ", "), formatCPUList(split.Load), len(split.Load))
}

// Launch is how a child process is started: directly, or under taskset on
// Cores with GOMAXPROCS set to their number, unless OwnProcs. taskset sets
// the affinity and then execs the program, so the child's PID is the
// program's.
type Launch struct {
	Taskset string
	Cores   []int
	// OwnProcs leaves GOMAXPROCS to the program: a dhtkv node runs at
	// least its --min-procs on fewer cores, which a GOMAXPROCS in its
	// environment would override.
	OwnProcs bool
}

// Command returns the program to exec, its arguments and the variables to
// add to the environment, for bin and args.
func (l Launch) Command(bin string, args []string) (string, []string, []string) {
	if len(l.Cores) == 0 {
		return bin, args, nil
	}
	argv := append([]string{"-c", formatCPUList(l.Cores), bin}, args...)
	if l.OwnProcs {
		return l.Taskset, argv, nil
	}
	return l.Taskset, argv, []string{"GOMAXPROCS=" + strconv.Itoa(len(l.Cores))}
}

// Display is the command line a reader would retype, displayBin standing
// for the binary: "GOMAXPROCS=2 taskset -c 0-1 bin/dhtkv ..." when pinned.
func (l Launch) Display(displayBin string, args []string) string {
	if len(l.Cores) == 0 {
		return shellJoin(append([]string{displayBin}, args...))
	}
	_, argv, env := l.Command(displayBin, args)
	return shellJoin(append(append(env, "taskset"), argv...))
}

// allowedCPUs are the cores this process may run on, ascending: its
// Cpus_allowed_list, which a container's cpuset or an outer taskset
// narrows, or 0..NumCPU-1 where /proc does not say.
func allowedCPUs() []int {
	if s, err := cpusAllowedList(os.Getpid()); err == nil {
		if cpus, err := parseCPUList(s); err == nil && len(cpus) > 0 {
			return cpus
		}
	}
	cpus := make([]int, runtime.NumCPU())
	for i := range cpus {
		cpus[i] = i
	}
	return cpus
}

// cpusAllowedList is the Cpus_allowed_list line of /proc/PID/status,
// e.g. "0-3,8".
func cpusAllowedList(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "", fmt.Errorf("affinity of pid %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("affinity of pid %d: no Cpus_allowed_list in /proc/%d/status", pid, pid)
}

// parseCPUList reads the kernel's CPU list format ("0-3,8,10-11") into
// ascending, distinct cores.
func parseCPUList(s string) ([]int, error) {
	var cpus []int
	for part := range strings.SplitSeq(strings.TrimSpace(s), ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("cpu list %q: bad core %q", s, lo)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("cpu list %q: bad range %q", s, part)
			}
		}
		for c := a; c <= b; c++ {
			cpus = append(cpus, c)
		}
	}
	slices.Sort(cpus)
	return slices.Compact(cpus), nil
}

// formatCPUList writes ascending cores in the kernel's and taskset's CPU
// list format, runs as ranges: 0-3,8.
func formatCPUList(cpus []int) string {
	var parts []string
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(cpus[i]))
		} else {
			parts = append(parts, strconv.Itoa(cpus[i])+"-"+strconv.Itoa(cpus[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// lookTaskset is taskset's path, "" when it is not installed.
func lookTaskset() string {
	p, err := exec.LookPath("taskset")
	if err != nil {
		return ""
	}
	return p
}

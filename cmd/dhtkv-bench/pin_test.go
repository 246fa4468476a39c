package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func cores(n int) []int {
	c := make([]int, n)
	for i := range c {
		c[i] = i
	}
	return c
}

func TestSplitCores(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cpus    []int
		nodes   int
		servers string // each node's cores, "|" between nodes
		load    string
	}{
		{"2 cores, node", cores(2), 1, "0", "1"},
		{"2 cores, cluster", cores(2), 3, "0|0|0", "1"},
		{"4 cores, node", cores(4), 1, "0-1", "2-3"},
		{"4 cores, cluster", cores(4), 3, "0-1|0-1|0-1", "2-3"}, // fewer server cores than nodes: shared
		{"5 cores, node", cores(5), 1, "0-1", "2-4"},            // the generator gets the odd core
		{"6 cores, cluster", cores(6), 3, "0|1|2", "3-5"},
		{"16 cores, node", cores(16), 1, "0-7", "8-15"},
		{"16 cores, cluster", cores(16), 3, "0-2|3-5|6-7", "8-15"}, // every server core used, the first nodes get the remainder
		{"cpuset 4-7,12-15, cluster", []int{4, 5, 6, 7, 12, 13, 14, 15}, 3, "4-5|6|7", "12-15"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := SplitCores(tc.cpus, tc.nodes)
			var got []string
			for _, c := range s.Servers {
				got = append(got, formatCPUList(c))
			}
			if g := strings.Join(got, "|"); g != tc.servers || formatCPUList(s.Load) != tc.load {
				t.Errorf("servers %s, load %s; want %s, %s", g, formatCPUList(s.Load), tc.servers, tc.load)
			}
			for _, c := range s.Servers {
				for _, core := range c {
					if slices.Contains(s.Load, core) {
						t.Errorf("core %d is both a server's and the generator's", core)
					}
				}
			}
		})
	}
}

func TestChoosePinning(t *testing.T) {
	for _, tc := range []struct {
		mode    PinMode
		n       int
		taskset string
		pinned  bool
		err     bool
	}{
		{PinAuto, 2, "/usr/bin/taskset", false, false},
		{PinAuto, 4, "/usr/bin/taskset", true, false},
		{PinAuto, 16, "", false, false},
		{PinOff, 16, "/usr/bin/taskset", false, false},
		{PinOn, 2, "/usr/bin/taskset", true, false},
		{PinOn, 1, "/usr/bin/taskset", false, true},
		{PinOn, 16, "", false, true},
		{"sometimes", 16, "/usr/bin/taskset", false, true},
	} {
		p, err := choosePinning(tc.mode, cores(tc.n), tc.taskset)
		if (err != nil) != tc.err || p.Pinned != tc.pinned {
			t.Errorf("%s on %d cores, taskset %q: pinned %v, err %v", tc.mode, tc.n, tc.taskset, p.Pinned, err)
			continue
		}
		if err != nil {
			continue
		}
		d := p.Describe()
		if want := map[bool]string{true: "pinned (", false: "unpinned ("}[tc.pinned]; !strings.HasPrefix(d, want) || !strings.Contains(d, string(tc.mode)) {
			t.Errorf("%s on %d cores: %q", tc.mode, tc.n, d)
		}
		split := p.Split(3)
		if len(split.Servers) != 3 {
			t.Errorf("%s: split of 3 nodes %+v", tc.mode, split)
		}
		if l := p.Launch(split.Servers[0]); (len(l.Cores) > 0) != tc.pinned {
			t.Errorf("%s on %d cores: launch %+v", tc.mode, tc.n, l)
		}
	}
	p, _ := choosePinning(PinAuto, cores(4), "/usr/bin/taskset")
	if d := p.Describe(); !strings.Contains(d, "servers on cores 0-1, dhtkv-load on cores 2-3") {
		t.Errorf("describe %q", d)
	}
	if pl := p.Placement(p.Split(3)); pl != "pinned with taskset: node 1 on cores 0-1, node 2 on cores 0-1, node 3 on cores 0-1; dhtkv-load on cores 2-3 (GOMAXPROCS=2)" {
		t.Errorf("placement %q", pl)
	}
}

func TestPinFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want PinMode
		err  bool
	}{{nil, PinAuto, false}, {[]string{"--pin=on"}, PinOn, false}, {[]string{"--pin", "off"}, PinOff, false}, {[]string{"--pin=yes"}, "", true}} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		m := pinFlag(fs)
		err := fs.Parse(tc.args)
		if (err != nil) != tc.err || (!tc.err && *m != tc.want) {
			t.Errorf("%v: %s, %v", tc.args, *m, err)
		}
	}
}

func TestCPUList(t *testing.T) {
	for in, want := range map[string]string{"0": "0", "0-3": "0-3", "0-1,3,5-7": "0-1,3,5-7", " 3,1,2,2 \n": "1-3"} {
		c, err := parseCPUList(in)
		if err != nil || formatCPUList(c) != want {
			t.Errorf("%q: %v %v, want %s", in, c, err, want)
		}
	}
	for _, bad := range []string{"", "a", "3-1", "1-", "-1", "1,,2"} {
		if c, err := parseCPUList(bad); err == nil {
			t.Errorf("%q: no error, %v", bad, c)
		}
	}
	if c := allowedCPUs(); len(c) == 0 || !slices.IsSorted(c) {
		t.Errorf("allowed cpus %v", c)
	}
}

func TestLaunchCommand(t *testing.T) {
	l := Launch{Taskset: "/usr/bin/taskset", Cores: []int{2, 3}}
	path, argv, env := l.Command("/abs/bin/dhtkv-load", []string{"--rate", "5"})
	if path != "/usr/bin/taskset" || strings.Join(argv, " ") != "-c 2-3 /abs/bin/dhtkv-load --rate 5" || strings.Join(env, " ") != "GOMAXPROCS=2" {
		t.Errorf("pinned: %s %v %v", path, argv, env)
	}
	if d := l.Display("bin/dhtkv-load", []string{"--rate", "5"}); d != "GOMAXPROCS=2 taskset -c 2-3 bin/dhtkv-load --rate 5" {
		t.Errorf("display %q", d)
	}
	own := Launch{Taskset: "/usr/bin/taskset", Cores: []int{0, 1}, OwnProcs: true}
	if _, argv, env := own.Command("/abs/bin/dhtkv", nil); strings.Join(argv, " ") != "-c 0-1 /abs/bin/dhtkv" || env != nil {
		t.Errorf("own procs: %v %v", argv, env)
	}
	path, argv, env = Launch{}.Command("bin/x", []string{"-a"})
	if path != "bin/x" || strings.Join(argv, " ") != "-a" || env != nil {
		t.Errorf("unpinned: %s %v %v", path, argv, env)
	}
}

// TestStartPinned starts a process the way the driver starts a server and
// checks that the kernel really holds it to its cores, with GOMAXPROCS set.
func TestStartPinned(t *testing.T) {
	taskset := lookTaskset()
	if taskset == "" {
		t.Skip("taskset not installed")
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip(err)
	}
	cpus := allowedCPUs()
	last := cpus[len(cpus)-1:]
	ps := &Procs{}
	defer ps.StopAll()
	log := filepath.Join(t.TempDir(), "sleep.log")
	for _, tc := range []struct {
		name   string
		launch Launch
		want   string
		env    string
	}{
		{"pinned", Launch{Taskset: taskset, Cores: last}, formatCPUList(last), "GOMAXPROCS=1"},
		{"unpinned", Launch{}, formatCPUList(cpus), ""},
	} {
		p, err := ps.Start(tc.name, sleep, "sleep", []string{"60"}, log, tc.launch)
		if err != nil {
			t.Fatal(err)
		}
		// taskset sets the affinity, then execs sleep: once the process
		// is sleep, its affinity is the one it keeps.
		if err := waitComm(p, "sleep", 10*time.Second); err != nil {
			t.Fatal(err)
		}
		got, err := cpusAllowedList(p.PID())
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("%s: Cpus_allowed_list %s, want %s", tc.name, got, tc.want)
		}
		environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p.PID()))
		if err != nil {
			t.Fatal(err)
		}
		if has := slices.Contains(strings.Split(string(environ), "\x00"), tc.env); tc.env != "" && !has {
			t.Errorf("%s: no %s in the environment", tc.name, tc.env)
		}
		if tc.launch.Cores != nil && !strings.HasPrefix(p.Command, "GOMAXPROCS=1 taskset -c ") {
			t.Errorf("%s: command %q", tc.name, p.Command)
		}
		p.Stop(5 * time.Second)
	}
}

// waitComm waits until p's command name is comm, or it exits.
func waitComm(p *Proc, comm string, timeout time.Duration) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(timeout)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p.PID()))
		if err == nil && strings.TrimSpace(string(b)) == comm {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before it was %s: %v", p.Name, comm, p.waitErr)
		case <-deadline:
			return fmt.Errorf("%s: not %s after %s (%q, %v)", p.Name, comm, timeout, b, err)
		case <-tick.C:
		}
	}
}

// TestLoadRunnerPinned runs the load runner's command under taskset with a
// stand-in for dhtkv-load that reports, in its JSON, the cores it may run
// on and its GOMAXPROCS.
func TestLoadRunnerPinned(t *testing.T) {
	taskset := lookTaskset()
	if taskset == "" {
		t.Skip("taskset not installed")
	}
	dir := t.TempDir()
	fake := filepath.Join(dir, "dhtkv-load")
	script := "#!/bin/sh\n" +
		`cpus=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)` + "\n" +
		`echo "{\"mode\":\"rate\",\"dist\":\"$cpus\",\"workload\":\"$GOMAXPROCS\"}"` + "\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	cpus := allowedCPUs()
	first := cpus[:1]
	l := &loadRunner{bin: fake, displayBin: "bin/dhtkv-load", targets: []string{"http://127.0.0.1:1"}, connections: 1, timeout: time.Second,
		launch: Launch{Taskset: taskset, Cores: first}, logDir: dir, prefix: "t"}
	run, err := l.Run(t.Context(), RunSpec{Label: "pinned", Workload: "get", Duration: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if run.Result.Dist != formatCPUList(first) || run.Result.Workload != "1" {
		t.Errorf("dhtkv-load ran on cores %q with GOMAXPROCS %q, want %s and 1", run.Result.Dist, run.Result.Workload, formatCPUList(first))
	}
	if want := "GOMAXPROCS=1 taskset -c " + formatCPUList(first) + " bin/dhtkv-load --targets"; !strings.HasPrefix(run.Command, want) {
		t.Errorf("command %q, want it to start %q", run.Command, want)
	}
}

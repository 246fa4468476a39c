package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ScenarioSpec is one workload measured on one system.
type ScenarioSpec struct {
	Name      string // report file stem, e.g. "node-put-nosync"
	Title     string
	Workload  string
	ReadRatio float64
}

// System is a server set-up started fresh, filled once, and then measured
// under each of its scenarios in order.
type System struct {
	Name      string
	Title     string
	Ceiling   bool // the in-memory baseline server, no admin port
	Nodes     int
	Sync      bool
	Ack, From int // 0 = let the server choose (single node)
	Scenarios []ScenarioSpec
}

// Systems lists what `make bench` measures. The baseline runs first so
// every dhtkv report can quote its figure, the ceiling. The baseline's
// system and scenarios keep the name "ceiling" that reports and docs cite. On each system, reads run before writes: the
// write scenario churns the store, and reads should see the state the fill
// left, not one disturbed by an earlier write run.
func Systems() []System {
	sc := func(prefix, suffix, titleSuffix string, workloads ...string) []ScenarioSpec {
		var out []ScenarioSpec
		for _, w := range workloads {
			s := ScenarioSpec{Name: prefix + "-" + w + suffix, Workload: w}
			switch w {
			case "get":
				s.Title = "GET" + titleSuffix
			case "put":
				s.Title = "PUT" + titleSuffix
			case "mixed":
				s.Title, s.ReadRatio = "mixed 90% GET / 10% PUT"+titleSuffix, 0.9
			}
			out = append(out, s)
		}
		return out
	}
	return []System{
		{Name: "ceiling", Title: "ceiling: the in-memory baseline server (cmd/dhtkv-baseline)", Ceiling: true, Nodes: 1,
			Scenarios: sc("ceiling", "", ", ceiling", "get", "mixed", "put")},
		{Name: "node", Title: "one dhtkv node, --sync=true", Nodes: 1, Sync: true,
			Scenarios: sc("node", "", ", one dhtkv node (--sync=true)", "get", "mixed", "put")},
		{Name: "node-nosync", Title: "one dhtkv node, --sync=false", Nodes: 1, Sync: false,
			Scenarios: sc("node", "-nosync", ", one dhtkv node (--sync=false)", "put")},
		{Name: "cluster", Title: "3-node dhtkv cluster, ack=2 from=3, --sync=true", Nodes: 3, Sync: true, Ack: 2, From: 3,
			Scenarios: sc("cluster", "", ", 3-node cluster (ack=2, from=3)", "get", "mixed", "put")},
	}
}

// running is a started system.
type running struct {
	procs    []*Proc
	targets  []string // public base URLs
	admins   []string // admin base URLs (empty for the baseline)
	commands []string
	split    CoreSplit // the servers' and the generator's cores when pinned
}

// pids are the server processes' ids, for their CPU time.
func (r *running) pids() []int {
	pids := make([]int, len(r.procs))
	for i, p := range r.procs {
		pids[i] = p.PID()
	}
	return pids
}

func (r *running) stop() {
	for _, p := range r.procs {
		p.Stop(10 * time.Second)
	}
}

// checkAlive returns an error naming the first server that has exited, so a
// crash is reported as a crash and not as a slow run.
func (r *running) checkAlive() error {
	for _, p := range r.procs {
		if done, err := p.Exited(); done {
			return fmt.Errorf("%s exited (%v); log %s:\n%s", p.Name, err, p.LogPath, tailFile(p.LogPath, 15))
		}
	}
	return nil
}

// start launches sys on fresh loopback ports and data directories under dir
// and waits until every node is ready.
func (b *Bench) start(ctx context.Context, sys System, dir string) (*running, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	r := &running{split: b.pin.Split(sys.Nodes)}
	if sys.Ceiling {
		ports, err := freePorts(1)
		if err != nil {
			return nil, err
		}
		addr := "127.0.0.1:" + strconv.Itoa(ports[0])
		args := []string{"--listen", addr}
		p, err := b.procs.Start("baseline", b.cfg.Baseline, b.displayPath(b.cfg.Baseline), args, filepath.Join(dir, "baseline.log"), b.pin.Launch(r.split.Servers[0]))
		if err != nil {
			return nil, err
		}
		r.procs, r.targets, r.commands = []*Proc{p}, []string{"http://" + addr}, []string{p.Command}
		if err := waitReady(ctx, p, "http://"+addr+"/v0/status", 200, 30*time.Second); err != nil {
			r.stop()
			return nil, err
		}
		return r, nil
	}

	ports, err := freePorts(2 * sys.Nodes)
	if err != nil {
		return nil, err
	}
	var urls []string
	for i := range sys.Nodes {
		urls = append(urls, "http://127.0.0.1:"+strconv.Itoa(ports[2*i]))
	}
	for i := range sys.Nodes {
		listen := "127.0.0.1:" + strconv.Itoa(ports[2*i])
		admin := "127.0.0.1:" + strconv.Itoa(ports[2*i+1])
		data := filepath.Join(dir, fmt.Sprintf("node%d", i+1))
		args := []string{
			"--listen", listen,
			"--data-dir", data,
			"--admin-listen", admin,
			"--cache-bytes", strconv.FormatInt(b.cfg.CacheBytes, 10),
			"--sync=" + strconv.FormatBool(sys.Sync),
		}
		if sys.Nodes > 1 {
			args = append(args, "--cluster", strings.Join(urls, ","), "--self", urls[i])
		}
		name := fmt.Sprintf("%s-node%d", sys.Name, i+1)
		bin := filepath.Join(b.cfg.Bin, "dhtkv")
		launch := b.pin.Launch(r.split.Servers[i])
		launch.OwnProcs = true // --min-procs (cmd/dhtkv)
		p, err := b.procs.Start(name, bin, b.displayPath(bin), args, filepath.Join(dir, name+".log"), launch)
		if err != nil {
			r.stop()
			return nil, err
		}
		r.procs = append(r.procs, p)
		r.targets = append(r.targets, urls[i])
		r.admins = append(r.admins, "http://"+admin)
		r.commands = append(r.commands, p.Command)
	}
	for i, p := range r.procs {
		if err := waitReady(ctx, p, r.targets[i]+"/v0/status", 200, 60*time.Second); err != nil {
			r.stop()
			return nil, err
		}
	}
	return r, nil
}

// displayPath is how a binary is shown in reports: relative to the
// repository when it lives there, so commands read the same on any machine.
func (b *Bench) displayPath(p string) string {
	if rel, err := filepath.Rel(b.cfg.Repo, p); err == nil && !strings.HasPrefix(rel, "..") {
		return rel
	}
	return p
}

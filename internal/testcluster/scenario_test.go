package testcluster

import (
	"flag"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/node"
)

// TestScenarios runs the protocol stories of testdata/scenarios, one file
// per protocol, each on a fresh in-memory cluster (StartInMemory) in a
// testing/synctest bubble of its own (InBubble): every node runs on the
// bubble's fake clock, which moves only when every goroutine is blocked,
// so a story is deterministic in time and takes milliseconds. A story is
// a sequence of commands, each followed by what it printed; nodes are
// numbered from 1, as an operator counts them. Rewrite the expected
// output after a deliberate change with
//
//	go test ./internal/testcluster -run TestScenarios -rewrite
//
// and run them on the wall clock with -scenario.realtime.
//
// The commands:
//
//	start <n> [hint-interval=<d>] [read-repair=blocking|async|off] [hedge=<d>] [replicas=<k>]
//	    n nodes forming one cluster (anti-entropy only on demand; hints
//	    offered every hint-interval, default 10ms). A second start stops
//	    the first cluster: a story may have chapters.
//	put key=<k> value=<v> via=<i> [ack=<a>] [from=<f>]
//	delete key=<k> via=<i> [ack=<a>] [from=<f>]
//	get key=<k> via=<i> [ack=<a>] [from=<f>]
//	    a client request to node i; prints the status (and a GET's value).
//	cut <i> <j> | isolate <i> | delay <i> <j> <d> | heal
//	    node-to-node links: cut both ways, cut off from all, delay both
//	    ways, restore every link. Clients still reach every node.
//	stop <i> | restart <i> | wipe <i> | boot <i>
//	    a graceful stop; a start on the same (in-memory) disk; an empty
//	    disk for a stopped node; the first start of an added node.
//	advance <d>
//	    moves the clock d on: every timer due meanwhile fires, in order.
//	await-formed
//	    waits until every node knows the cluster exists (it saw every
//	    other answer): a node that then starts empty rebuilds.
//	ready <i>
//	    whether node i serves reads now (its admin /readyz), and why not.
//	await-ready <i>
//	    waits until node i serves reads (a rebuild ended).
//	inspect [<i>...] [key=<k>]
//	    what each node's replica holds (or the nodes named), records and
//	    tombstones, by key (or key k only), once the background work
//	    settled (scenario.settle).
//	hints
//	    the hints each node keeps, by the node they are for (settled).
//	deliver-hints
//	    waits until no running node keeps a hint.
//	repair <i> [compared=<j>]
//	    an anti-entropy exchange of node i with every peer (admin
//	    /repair): the records it pulled and pushed, summed over its
//	    peers, and the exchanges that failed; with compared, how many
//	    partitions it compared with node j.
//	exchanges <i>
//	    node i's last anti-entropy exchange with each peer: how many
//	    partitions it compared.
//	add via=<i> | join <i> via=<j> | decommission <i> via=<j>
//	    a new node with --join (not started: boot starts it); the admin
//	    call that adds it; the one that removes a member.
//	await-left <i>
//	    waits until node i knows it left the cluster, and stops it.
//	await-stable
//	    waits until every member runs the same map with no change under
//	    way, and prints it.
//	cluster <i>
//	    node i's cluster map, as its admin /cluster reports it (settled:
//	    a change's driver hands each stage's map to the others after it
//	    installed it).
//
// Outputs hold no timing and no version: what a replica holds is shown by
// value, so that the wall clock prints the same as the fake one.
func TestScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata/scenarios", func(t *testing.T, path string) {
		if *realtime {
			runStory(t, path, false)
			return
		}
		InBubble(t, func(t *testing.T) { runStory(t, path, true) })
	})
}

// realtime runs the stories on the wall clock, as a check that what they
// tell does not hang on synctest's: the waits then poll (settleTimeout),
// advance sleeps, and a step that shows what waits for a timer (hints
// still held just after a heal) races that timer, as it would in
// production.
var realtime = flag.Bool("scenario.realtime", false, "run the scenario stories on the wall clock instead of in testing/synctest bubbles")

func runStory(t *testing.T, path string, bubble bool) {
	s := &scenario{bubble: bubble}
	datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
		return s.run(t, d)
	})
}

// scenario is one story's state: the cluster its start command made.
type scenario struct {
	c *InMemory
	// bubble: the story runs in a testing/synctest bubble, on its fake
	// clock.
	bubble bool
}

// settle returns what f shows once the protocols' background work has
// caught up with the story. In a bubble that is when every goroutine is
// blocked (synctest.Wait): the clock stands still until then, so nothing
// the story did is still on its way. On the wall clock it is the first
// output the story expects (see settleTimeout).
func (s *scenario) settle(t *testing.T, d *datadriven.TestData, f func() string) string {
	if s.bubble {
		synctest.Wait()
		return f()
	}
	return d.RetryFor(t, settleTimeout, f)
}

// settleTimeout bounds how long, on the wall clock, inspect, hints and
// cluster wait for what the story expects: a client's answer may come
// before the protocol's last step (a write acknowledged by two replicas
// while the third's failure, and so its hint, is still to come; a stage's
// map on its way to the other nodes). They show the first output that the
// story expects three times in a row, or the last one after
// settleTimeout; under -rewrite, what they show after a tenth of it.
const settleTimeout = 5 * time.Second

// awaitTimeout bounds every wait of a story: far above what a step takes
// in memory (milliseconds), so that only a protocol that never gets there
// fails.
const awaitTimeout = 10 * time.Second

func (s *scenario) run(t *testing.T, d *datadriven.TestData) string {
	if d.Cmd != "start" && s.c == nil {
		d.Fatalf(t, "%s before start", d.Cmd)
	}
	switch d.Cmd {
	case "start":
		return s.start(t, d)
	case "put", "delete", "get":
		return s.request(t, d)
	case "cut":
		s.c.Cut(nodeArg(t, d, 0), nodeArg(t, d, 1))
	case "isolate":
		s.c.Isolate(nodeArg(t, d, 0))
	case "delay":
		i, j, dur := nodeArg(t, d, 0), nodeArg(t, d, 1), durationPos(t, d, 2)
		s.c.Link(i, j).Delay(dur)
		s.c.Link(j, i).Delay(dur)
	case "heal":
		s.c.Heal()
	case "stop":
		s.c.StopNode(nodeArg(t, d, 0))
	case "restart", "boot":
		s.c.StartNode(nodeArg(t, d, 0))
	case "wipe":
		s.c.WipeNode(nodeArg(t, d, 0))
	case "await-formed":
		s.c.AwaitFormed(awaitTimeout)
		return "formed"
	case "ready":
		i := nodeArg(t, d, 0)
		n := s.c.Node(i)
		if n == nil {
			return name(i) + " stopped"
		}
		if err := n.Ready(); err != nil {
			return name(i) + " not ready: " + err.Error()
		}
		return name(i) + " ready"
	case "await-ready":
		i := nodeArg(t, d, 0)
		s.c.Await(awaitTimeout, "ready node", func() (bool, string) {
			n := s.c.Node(i)
			if n == nil {
				return false, "stopped"
			}
			if err := n.Ready(); err != nil {
				return false, err.Error()
			}
			return true, ""
		})
		return name(i) + " ready"
	case "inspect":
		return s.settle(t, d, func() string { return s.inspect(t, d) })
	case "hints":
		return s.settle(t, d, s.hints)
	case "advance":
		dur := durationPos(t, d, 0)
		// In a bubble the clock jumps once every goroutine is blocked,
		// firing every timer due on the way, in order.
		time.Sleep(dur)
	case "deliver-hints":
		s.c.Await(awaitTimeout, "hint delivery", func() (bool, string) {
			h := s.hints()
			return h == "no hints", h
		})
		return s.hints()
	case "repair":
		return s.repair(t, d)
	case "exchanges":
		return s.exchanges(t, d)
	case "add":
		return name(s.c.AddNode(intArg(t, d, "via", 0) - 1))
	case "join":
		return statusLine(s.c.Join(intArg(t, d, "via", 0)-1, nodeArg(t, d, 0)))
	case "decommission":
		return statusLine(s.c.Decommission(intArg(t, d, "via", 0)-1, nodeArg(t, d, 0)))
	case "await-left":
		i := nodeArg(t, d, 0)
		s.c.AwaitLeft(i, awaitTimeout)
		return name(i) + " left and stopped"
	case "await-stable":
		return s.mapString(s.c.AwaitStable(awaitTimeout))
	case "cluster":
		i := nodeArg(t, d, 0)
		return s.settle(t, d, func() string { return s.cluster(i) })
	default:
		d.Fatalf(t, "unknown command %q", d.Cmd)
	}
	return ""
}

func (s *scenario) start(t *testing.T, d *datadriven.TestData) string {
	if s.c != nil {
		s.c.StopAll() // a new chapter: a new cluster on the same addresses
	}
	n := nodeArg(t, d, 0) + 1 // a count: as many nodes as the last one's number
	hints := 10 * time.Millisecond
	if d.HasArg("hint-interval") {
		hints = durationArg(t, d, "hint-interval")
	}
	opts := []Option{func(_ int, c *node.Config) {
		c.Handoff.Interval = hints
		if d.HasArg("read-repair") {
			var mode string
			d.ScanArgs(t, "read-repair", &mode)
			if err := c.Coordinator.ReadRepair.Set(mode); err != nil {
				d.Fatalf(t, "read-repair: %v", err)
			}
		}
		if d.HasArg("hedge") {
			c.Coordinator.HedgeDelay = durationArg(t, d, "hedge")
		}
		if d.HasArg("replicas") {
			d.ScanArgs(t, "replicas", &c.Replicas)
		}
	}}
	s.c = StartInMemory(t, n, opts...)
	names := make([]string, n)
	for i := range n {
		names[i] = name(i)
	}
	return strings.Join(names, " ") + " started"
}

// request sends a client request and prints its status, and a found
// value's bytes.
func (s *scenario) request(t *testing.T, d *datadriven.TestData) string {
	var key string
	d.ScanArgs(t, "key", &key)
	via := intArg(t, d, "via", 1) - 1
	u := EntityURL(s.c.URL(via), key, intArg(t, d, "ack", 0), intArg(t, d, "from", 0))
	method, body := http.MethodGet, []byte(nil)
	switch d.Cmd {
	case "put":
		var v string
		d.ScanArgs(t, "value", &v)
		method, body = http.MethodPut, []byte(v)
	case "delete":
		method = http.MethodDelete
	}
	code, got := s.c.Client().Do(t, method, u, body)
	out := statusLine(code)
	if d.Cmd == "get" && code == http.StatusOK {
		out += ": " + string(got)
	} else if code >= 500 {
		out += ": " + strings.TrimSpace(string(got))
	}
	return out
}

func (s *scenario) inspect(t *testing.T, d *datadriven.TestData) string {
	var which []int
	for i, a := range d.CmdArgs {
		if len(a.Vals) == 0 { // a node number, not key=
			which = append(which, nodeArg(t, d, i))
		}
	}
	var only string
	if d.HasArg("key") {
		d.ScanArgs(t, "key", &only)
	}
	if which == nil {
		for i := range s.c.Size() {
			which = append(which, i)
		}
	}
	var b strings.Builder
	for _, i := range which {
		fmt.Fprintf(&b, "%s:", name(i))
		if s.c.Node(i) == nil {
			b.WriteString(" stopped\n")
			continue
		}
		entries := s.c.Replica(i)
		if only != "" {
			entries = slices.DeleteFunc(entries, func(e Entry) bool { return e.Key != only })
		}
		if len(entries) == 0 {
			b.WriteString(" empty")
		}
		for _, e := range entries {
			if e.Tombstone {
				fmt.Fprintf(&b, " %s=<deleted>", e.Key)
			} else {
				fmt.Fprintf(&b, " %s=%s", e.Key, e.Value)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

func (s *scenario) hints() string {
	var lines []string
	for i := range s.c.Size() {
		if s.c.Node(i) == nil {
			continue
		}
		h := s.c.Hints(i)
		targets := make([]int, 0, len(h))
		for to := range h {
			targets = append(targets, to)
		}
		slices.Sort(targets)
		for _, to := range targets {
			lines = append(lines, fmt.Sprintf("%s holds for %s: %s", name(i), name(to), strings.Join(h[to], " ")))
		}
	}
	if lines == nil {
		return "no hints"
	}
	return strings.Join(lines, "\n")
}

// repair prints what node i's exchanges did, summed over its peers: they
// run one at a time in an order of its choosing (--ae-concurrency 1), and
// a record the first exchange repaired no longer differs in the second,
// so only the sums are the same on every run.
func (s *scenario) repair(t *testing.T, d *datadriven.TestData) string {
	i := nodeArg(t, d, 0)
	var peers, errs []string
	var pulled, pushed, failed int
	compared, with := 0, -1
	if d.HasArg("compared") {
		with = intArg(t, d, "compared", 0) - 1
	}
	for _, x := range s.c.Repair(i) {
		peers = append(peers, name(s.c.Index(x.Peer)))
		if s.c.Index(x.Peer) == with {
			compared = x.Partitions
		}
		pulled, pushed, failed = pulled+x.Pulled, pushed+x.Pushed, failed+x.Failed
		if x.Error != "" {
			errs = append(errs, fmt.Sprintf("with %s: %s", name(s.c.Index(x.Peer)), x.Error))
		}
	}
	slices.Sort(peers)
	slices.Sort(errs)
	out := fmt.Sprintf("%s exchanged with %s: pulled %d, pushed %d", name(i), strings.Join(peers, " "), pulled, pushed)
	if failed > 0 {
		out += fmt.Sprintf(", failed %d", failed)
	}
	if with >= 0 {
		out += fmt.Sprintf("; compared %d partitions with %s", compared, name(with))
	}
	for _, e := range errs {
		out += "\nerror " + e
	}
	return out
}

// exchanges prints node i's last exchange with each peer, by peer name.
func (s *scenario) exchanges(t *testing.T, d *datadriven.TestData) string {
	i := nodeArg(t, d, 0)
	var lines []string
	for _, ps := range s.c.Node(i).AntiEntropy() {
		if ps.Last == nil {
			continue
		}
		lines = append(lines, fmt.Sprintf("%s with %s: compared %d partitions", name(i), name(s.c.Index(ps.Peer)), ps.Last.Partitions))
	}
	slices.Sort(lines)
	if len(lines) == 0 {
		return "no exchange"
	}
	return strings.Join(lines, "\n")
}

// cluster prints node i's map (mapString).
func (s *scenario) cluster(i int) string { return s.mapString(s.c.ClusterStatus(i).Map) }

// mapString prints a cluster map: its epoch, its members by name, and the
// change under way.
func (s *scenario) mapString(m *clustermap.Map) string {
	var b strings.Builder
	fmt.Fprintf(&b, "epoch %d:", m.Epoch)
	for _, mem := range m.Nodes {
		fmt.Fprintf(&b, " %s", name(s.c.Index(mem.URL)))
	}
	if ch := m.Change; ch != nil {
		fmt.Fprintf(&b, "; %s of %s at stage %s", ch.Kind, name(s.c.Index(m.Node(ch.Node).URL)), ch.Stage)
	}
	return b.String()
}

// name is how a story calls node i.
func name(i int) string {
	if i < 0 {
		return "unknown"
	}
	return "node" + strconv.Itoa(i+1)
}

func statusLine(code int) string { return strconv.Itoa(code) + " " + http.StatusText(code) }

// nodeArg is the k-th positional argument, a node number, as an index.
func nodeArg(t *testing.T, d *datadriven.TestData, k int) int {
	if k >= len(d.CmdArgs) {
		d.Fatalf(t, "%s: argument %d missing", d.Cmd, k+1)
	}
	n, err := strconv.Atoi(d.CmdArgs[k].Key)
	if err != nil || n < 1 {
		d.Fatalf(t, "%s: argument %q is not a node number", d.Cmd, d.CmdArgs[k].Key)
	}
	return n - 1
}

// durationPos is the k-th positional argument, a duration.
func durationPos(t *testing.T, d *datadriven.TestData, k int) time.Duration {
	if k >= len(d.CmdArgs) {
		d.Fatalf(t, "%s: argument %d (a duration) missing", d.Cmd, k+1)
	}
	v, err := time.ParseDuration(d.CmdArgs[k].Key)
	if err != nil {
		d.Fatalf(t, "%s: %v", d.Cmd, err)
	}
	return v
}

func intArg(t *testing.T, d *datadriven.TestData, key string, def int) int {
	if !d.HasArg(key) {
		return def
	}
	var v int
	d.ScanArgs(t, key, &v)
	return v
}

func durationArg(t *testing.T, d *datadriven.TestData, key string) time.Duration {
	var s string
	d.ScanArgs(t, key, &s)
	v, err := time.ParseDuration(s)
	if err != nil {
		d.Fatalf(t, "%s: %v", key, err)
	}
	return v
}

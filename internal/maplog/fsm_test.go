package maplog

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
)

// TestRules runs the datadriven cases of testdata/rules_*: the FSM's rules,
// one command a directive, applied to the state the file's earlier
// directives left. Directives (arguments key=value):
//
//	seed nodes=N [epoch=E] [cluster=C] [replicas=R]   the map of N nodes on 127.0.0.1:8080...
//	join epoch=E from=F url=U [id=ID]
//	decommission epoch=E from=F node=N [id=ID]
//	remove epoch=E from=F node=N [id=ID]        remove dead node N
//	replace epoch=E from=F node=N url=U [addr=A] [id=ID]
//	abort epoch=E [id=ID]
//	replicas epoch=E from=F n=N [id=ID]    change the factor to N
//	factor                               print the map's factor (old and new set's)
//	ack node=N epoch=E | ack-all epoch=E [except=N]   [rules=R: the acking release's rules, default Rules]
//	copied node=N epoch=E | copied-all epoch=E
//	addr node=N addr=A                   record node N's log address
//	state                                print the bookkeeping: acks, copy reports, log addresses, the change under way
//	garbage                              an entry that does not decode
//	release rules=R                      the replica applies rules up to R from now on (an older release: fsm.checkRules)
//
// The output is the result (accepted, with the map and the node the
// command is about, or refused with the reason), then the nodes the map's
// next step waits for and the last change's outcome. Rewrite after a
// deliberate change with go test ./internal/maplog -run TestRules -rewrite.
func TestRules(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		if !strings.Contains(path, "rules_") {
			return
		}
		f := newFSM()
		index := uint64(0)
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			arg := func(key string) (int, bool) {
				if !d.HasArg(key) {
					return 0, false
				}
				var v int
				d.ScanArgs(t, key, &v)
				return v, true
			}
			num := func(key string) int {
				v, ok := arg(key)
				if !ok {
					d.Fatalf(t, "%s needs %s=", d.Cmd, key)
				}
				return v
			}
			str := func(key string) string {
				var v string
				if d.HasArg(key) {
					d.ScanArgs(t, key, &v)
				}
				return v
			}
			var cmds []Command
			switch d.Cmd {
			case "seed":
				urls := make([]string, num("nodes"))
				for i := range urls {
					urls[i] = fmt.Sprintf("http://127.0.0.1:%d", 8080+i)
				}
				r, _ := arg("replicas")
				m, err := clustermap.Seed(urls, r)
				require.NoError(t, err)
				if e, ok := arg("epoch"); ok {
					m.Epoch = uint64(e)
				}
				if c, ok := arg("cluster"); ok {
					m.Cluster = uint64(c)
				}
				if id, ok := arg("decommissioning"); ok { // a stored map caught mid-change
					m, err = m.BeginDecommission(id, 0)
					require.NoError(t, err)
				}
				cmds = append(cmds, Command{Op: OpSeed, Map: m})
			case "join", "decommission", "remove", "replace", "abort":
				node, _ := arg("node")
				from, _ := arg("from")
				cmds = append(cmds, Command{Op: Op(d.Cmd), ID: str("id"), Epoch: uint64(num("epoch")), From: from, Node: node, URL: str("url"), Addr: str("addr")})
			case "addr":
				cmds = append(cmds, Command{Op: OpAddr, Node: num("node"), Addr: str("addr")})
			case "state":
				s := f.state
				out := []string{fmt.Sprintf("acks %v", s.Acks), fmt.Sprintf("copied %v", s.Copied), fmt.Sprintf("addrs %v", s.Addrs),
					fmt.Sprintf("rules %d, reported %v", s.Rules, s.Supports)}
				if o := s.Current; o != nil {
					out = append(out, fmt.Sprintf("current: %s of node %d, began %d, id %q", o.Kind, o.Node, o.Began, o.ID))
				}
				return strings.Join(out, "\n")
			case "replicas":
				from, _ := arg("from")
				cmds = append(cmds, Command{Op: OpReplicas, ID: str("id"), Epoch: uint64(num("epoch")), From: from, Replicas: num("n")})
			case "factor":
				return fmt.Sprintf("replicas %d, new set %d", f.state.Map.Replicas, f.state.Map.NewReplicas())
			case "ack", "copied":
				cmds = append(cmds, Command{Op: Op(d.Cmd), Node: num("node"), Epoch: uint64(num("epoch"))})
			case "ack-all", "copied-all":
				except, ok := arg("except")
				for _, n := range f.state.Map.Nodes {
					if ok && n.ID == except {
						continue
					}
					cmds = append(cmds, Command{Op: Op(strings.TrimSuffix(d.Cmd, "-all")), Node: n.ID, Epoch: uint64(num("epoch"))})
				}
			case "garbage":
			case "release":
				f.rules = num("rules")
				return fmt.Sprintf("this replica applies rules up to %d", f.rules)
			default:
				d.Fatalf(t, "unknown directive %q", d.Cmd)
			}
			// An ack reports this release's rules unless rules= says
			// otherwise (rules=0: a member of a release before them).
			rules, ok := arg("rules")
			if !ok {
				rules = Rules
			}
			for i := range cmds {
				if cmds[i].Op == OpAck {
					cmds[i].Rules = rules
				}
			}
			var out []string
			entries := make([][]byte, 0, len(cmds))
			for _, c := range cmds {
				b, err := json.Marshal(c)
				require.NoError(t, err)
				entries = append(entries, b)
			}
			if d.Cmd == "garbage" {
				entries = append(entries, []byte("{not json"))
			}
			var res *Result
			for _, b := range entries {
				index++
				res = f.Apply(&raft.Log{Index: index, Data: b}).(*Result)
				if !res.Accepted {
					break
				}
			}
			if res.Accepted {
				line := "accepted: " + res.Map.String()
				if d.Cmd == "join" || d.Cmd == "decommission" || d.Cmd == "remove" || d.Cmd == "replace" || d.Cmd == "abort" || d.Cmd == "replicas" {
					line += fmt.Sprintf("; node %d", res.Node)
				}
				out = append(out, line)
			} else {
				out = append(out, "refused: "+res.Reason)
			}
			s := f.state
			if s.Map != nil {
				out = append(out, fmt.Sprintf("map: %s; next id %d; waiting for %v", s.Map, s.Map.NextID, s.Waiting(-1)))
			}
			if s.Last != nil {
				out = append(out, fmt.Sprintf("last: %s of node %d, epochs %d-%d, aborted %t", s.Last.Kind, s.Last.Node, s.Last.Began, s.Last.Ended, s.Last.Aborted))
			}
			return strings.Join(out, "\n")
		})
	})
}

// Every change a member submits carries an ID, so that the log answers a
// retry after an uncertain outcome (the leader lost its office before it
// answered) with the first attempt's outcome instead of refusing it as
// made at an old epoch: a replicas change had none, and its requester was
// told 409 for a change that had begun. Acknowledgements need none.
func TestEveryChangeGetsAnID(t *testing.T) {
	l := &Log{o: Options{MaxCommandBytes: 1 << 10}}
	m, err := clustermap.Seed([]string{"http://127.0.0.1:8080", "http://127.0.0.1:8081"}, 2)
	require.NoError(t, err)
	seeded, res := apply(&State{}, &Command{Op: OpSeed, Map: m})
	require.True(t, res.Accepted, res.Reason)
	for _, tc := range []struct {
		op     Op
		change bool
	}{
		{OpSeed, true}, {OpJoin, true}, {OpDecommission, true}, {OpRemove, true}, {OpReplace, true}, {OpAbort, true}, {OpReplicas, true},
		{OpAck, false}, {OpCopied, false}, {OpAddr, false},
	} {
		b, err := l.encode(Command{Op: tc.op})
		require.NoError(t, err)
		var c Command
		require.NoError(t, json.Unmarshal(b, &c))
		require.Equal(t, tc.change, c.ID != "", "%s", tc.op)
		if tc.op == OpSeed {
			continue
		}
		// The state machine takes exactly these as changes: a change
		// made at another epoch is refused for it.
		_, res := apply(seeded, &Command{Op: tc.op, Epoch: seeded.Map.Epoch + 1})
		require.Equal(t, tc.change, strings.HasPrefix(res.Reason, "the map moved on"), "%s: %s", tc.op, res.Reason)
	}
}

// TestRecentOutcomesBounded: the outcomes kept for retries past Last are
// the newest maxRecent; an older request's retry is refused as made at an
// old epoch; a state once published keeps its own list while later
// states add to theirs and drop the oldest.
func TestRecentOutcomesBounded(t *testing.T) {
	m, err := clustermap.Seed([]string{"http://127.0.0.1:8080", "http://127.0.0.1:8081"}, 2)
	require.NoError(t, err)
	s, res := apply(&State{}, &Command{Op: OpSeed, Map: m})
	require.True(t, res.Accepted, res.Reason)
	var kept *State
	const ended = maxRecent + 8
	for i := range ended {
		next := s.clone()
		next.Last = &Outcome{ID: fmt.Sprint(i), Kind: OpJoin, Node: i}
		next.keepRecent(s)
		if i == ended/2 {
			kept = next
		}
		s = next
	}
	require.Len(t, s.Recent, maxRecent)
	keptLen := len(kept.Recent)
	for i := range ended {
		_, res := apply(s, &Command{Op: OpRemove, ID: fmt.Sprint(i), Epoch: m.Epoch - 1, Node: 1})
		if i < ended-1-maxRecent {
			require.False(t, res.Accepted, "request %d ended too long ago", i)
			require.Contains(t, res.Reason, "the map moved on")
		} else {
			require.True(t, res.Accepted, "request %d: %s", i, res.Reason)
			require.Equal(t, i, res.Node)
		}
	}
	require.Len(t, kept.Recent, keptLen)
	for i, o := range kept.Recent {
		require.Equal(t, fmt.Sprint(i), o.ID, "an earlier state's list is its own")
	}
}

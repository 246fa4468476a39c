package maplog

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"testing"

	"github.com/dhtkv/dhtkv/internal/clustermap"
)

// FuzzRules applies sequences of commands, decoded from the fuzzer's bytes,
// to the log's rules from a seeded map, and checks after each what the
// cluster relies on whatever order requests, acknowledgements and retries
// reach the log in:
//
//   - the map is always valid, and a new map has a higher epoch;
//   - a node id is given once: a node that left never comes back, an id
//     keeps its seed for ever (a replace keeps it), and a join's id is
//     above every id given before;
//   - every command is answered, a refusal with its reason, and an
//     accepted join names the id the map gave;
//   - a change begins only once every member it waits for installed the
//     map it is made from, and a stage moves on only once every member
//     not counted dead acknowledged it (and, in the stream stage,
//     reported its copy);
//   - a request sent again is answered as the first was;
//   - the rules in force never go down (acknowledgements of older
//     releases included);
//   - the state survives a snapshot.
//
// Each command takes four bytes: the operation, a node (a member by
// index, or an id that is none), the epoch (mostly the log's), and a
// fourth for the URL, the request's ID and the factor.
func FuzzRules(f *testing.F) {
	// Seeds for a 3-node cluster (nodes = 1), written as commands.
	cmd := func(op, node, epoch, extra byte) []byte { return []byte{op, node, epoch, extra} }
	all := func(op byte, n int) (p []byte) {
		for i := range n {
			p = append(p, cmd(op, byte(i), 0, 0)...)
		}
		return p
	}
	join := slices.Concat(all(0, 3), cmd(1, 0, 0, 3), // every member installs the seed; node 3 joins
		all(0, 4), all(0, 4), all(7, 4), all(0, 4), all(0, 4)) // write-both, stream (with copies), read-new, done
	f.Add(uint8(1), []byte{})
	f.Add(uint8(1), join)
	f.Add(uint8(1), slices.Concat(all(0, 3), cmd(2, 1, 0, 0x85), cmd(2, 1, 0, 0x85), // a decommission, sent twice
		all(0, 3), all(0, 3), all(7, 3), all(0, 3), all(0, 3)))
	f.Add(uint8(1), slices.Concat(all(0, 3), cmd(5, 0, 0, 1), all(0, 3), cmd(6, 0, 0, 0), all(0, 3), // a factor change, aborted
		cmd(3, 2, 0, 4), all(0, 3), cmd(4, 1, 0, 0), all(0, 3), all(0, 3), all(7, 3), all(0, 3), all(0, 3))) // a replace; a remove
	f.Add(uint8(2), slices.Concat(all(0, 4), cmd(1, 0, 0, 6), cmd(4, 1, 0, 0), all(0, 5), all(0, 5), all(7, 5), all(0, 5), all(0, 5), all(0, 5)))
	f.Fuzz(func(t *testing.T, nodes uint8, prog []byte) {
		urls := make([]string, 2+int(nodes%4))
		for i := range urls {
			urls[i] = fmt.Sprintf("http://127.0.0.1:%d", 8080+i)
		}
		seed, err := clustermap.Seed(urls, 3)
		if err != nil {
			t.Fatal(err)
		}
		cur, res := apply(&State{}, &Command{Op: OpSeed, Map: seed})
		if !res.Accepted {
			t.Fatal(res.Reason)
		}
		seeds := map[int]uint64{} // every id ever given, with its seed
		left := map[int]bool{}    // ids that were members and are not
		for _, n := range seed.Nodes {
			seeds[n.ID] = n.Seed
		}
		answered := map[string]*Result{} // accepted requests by ID
		for len(prog) >= 4 {
			c := command(cur, prog[:4])
			prog = prog[4:]
			next, res := apply(cur, &c)
			if res == nil {
				t.Fatalf("%+v: no result", c)
			}
			if !res.Accepted {
				if res.Reason == "" || next != nil {
					t.Fatalf("%+v: refused without a reason, or with a state: %+v", c, res)
				}
				continue
			}
			if first, ok := answered[c.ID]; ok && c.ID != "" {
				if next != nil || res.Node != first.Node {
					t.Fatalf("%+v sent again: %+v, first %+v", c, res, first)
				}
				continue
			}
			if c.ID != "" {
				answered[c.ID] = res
			}
			if next == nil {
				t.Fatalf("%+v: accepted without a state", c)
			}
			checkStep(t, cur, next, &c, res, seeds, left)
			checkSnapshot(t, next)
			cur = next
		}
	})
}

// command decodes four bytes into a command against the state s.
func command(s *State, b []byte) Command {
	m := s.Map
	ops := []Op{OpAck, OpJoin, OpDecommission, OpReplace, OpRemove, OpReplicas, OpAbort, OpCopied, OpAddr, OpAck}
	c := Command{Op: ops[int(b[0])%len(ops)], Rules: Rules}
	c.Node = int(b[1])
	if i := int(b[1]); i < 2*len(m.Nodes) {
		c.Node = m.Nodes[i%len(m.Nodes)].ID
	}
	c.From = m.Nodes[int(b[3])%len(m.Nodes)].ID
	switch {
	case b[2] < 200:
		c.Epoch = m.Epoch
	case b[2] < 230:
		c.Epoch = m.Epoch - 1
	default:
		c.Epoch = m.Epoch + 1
	}
	c.URL = fmt.Sprintf("http://127.0.0.1:%d", 8080+int(b[3]%8))
	c.Addr = fmt.Sprintf("127.0.0.1:%d", 9080+int(b[3]%8))
	c.Replicas = 1 + int(b[3]%5)
	if c.Op == OpAck && b[3]&0x40 != 0 {
		c.Rules = 0 // a member on a release before the rules' versions
	}
	if isChange(c.Op) && b[3]&0x80 != 0 {
		c.ID = fmt.Sprintf("request-%d", b[3]&7) // a few IDs: retries and collisions
	}
	return c
}

func checkStep(t *testing.T, cur, next *State, c *Command, res *Result, seeds map[int]uint64, left map[int]bool) {
	t.Helper()
	m, n := cur.Map, next.Map
	if n == nil {
		t.Fatalf("%+v: no map", c)
	}
	if err := n.Validate(); err != nil {
		t.Fatalf("%+v: %v", c, err)
	}
	if !reflect.DeepEqual(m, n) && n.Epoch <= m.Epoch {
		t.Fatalf("%+v: %s after %s", c, n, m)
	}
	if res.Map != n {
		t.Fatalf("%+v: answered with %v, the log is at %s", c, res.Map, n)
	}
	if next.Rules < cur.Rules || next.Rules > Rules {
		t.Fatalf("%+v: rules %d after %d", c, next.Rules, cur.Rules)
	}
	for _, node := range n.Nodes {
		s, seen := seeds[node.ID]
		switch {
		case left[node.ID]:
			t.Fatalf("%+v: node %d is back in %s", c, node.ID, n)
		case seen && s != node.Seed:
			t.Fatalf("%+v: node %d has another seed in %s", c, node.ID, n)
		case !seen:
			for id := range seeds {
				if id >= node.ID {
					t.Fatalf("%+v: node %d joined below id %d, given before", c, node.ID, id)
				}
			}
			if c.Op != OpJoin || res.Node != node.ID {
				t.Fatalf("%+v: node %d appeared, answered %+v", c, node.ID, res)
			}
			seeds[node.ID] = node.Seed
		}
	}
	for _, old := range m.Nodes {
		if n.Node(old.ID) == nil {
			left[old.ID] = true
		}
	}

	switch c.Op {
	case OpJoin, OpDecommission, OpReplicas:
		// A change begins from an idle map every member installed.
		if m.Change != nil {
			t.Fatalf("%+v: began during %s", c, m)
		}
		if w := cur.Waiting(-1); len(w) > 0 {
			t.Fatalf("%+v: began while %v had not installed %s", c, w, m)
		}
	case OpAck, OpCopied:
		if n.Epoch == m.Epoch {
			return
		}
		// The map moved on by itself: a stage advanced, or a removal
		// began. Every live member must have acknowledged m.
		acks, copied := maps.Clone(cur.Acks), maps.Clone(cur.Copied)
		if c.Op == OpAck {
			acks[c.Node] = max(acks[c.Node], c.Epoch)
		} else {
			copied[c.Node] = max(copied[c.Node], c.Epoch)
		}
		for _, node := range m.Nodes {
			if m.Dead(node.ID) {
				continue
			}
			if acks[node.ID] < m.Epoch {
				t.Fatalf("%+v: %s moved on to %s without node %d's acknowledgement", c, m, n, node.ID)
			}
			if m.Change != nil && m.Change.Stage == clustermap.Stream && copied[node.ID] < m.Epoch {
				t.Fatalf("%+v: %s moved on to %s without node %d's copy", c, m, n, node.ID)
			}
		}
	}
}

// checkSnapshot: the state a snapshot holds restores as it was.
func checkSnapshot(t *testing.T, s *State) {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	f := newFSM()
	if err := f.Restore(io.NopCloser(bytes.NewReader(b))); err != nil {
		t.Fatalf("restore %s: %v", b, err)
	}
	got, _ := f.current()
	if !reflect.DeepEqual(got, s.clone()) {
		t.Fatalf("snapshot of %+v restored as %+v", s, got)
	}
}

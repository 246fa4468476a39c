package placement

import (
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/partition"
)

// FuzzValidMaps builds cluster maps from the fuzzer's numbers and, for
// every map clustermap.Validate accepts (one a peer, the log or a data
// directory could hand a node), checks what the rest of the node relies on:
//
//   - it survives encoding: Decode(Encode(m)) is m;
//   - both of its sets place every key on 1 to factor distinct members,
//     and a write's sets are cut to each set's factor;
//   - every change made from it (Advance, Abort, Begin*, Remove,
//     RemoveNext, Replace) is refused (no map) or is a valid map of the
//     same cluster at the next epoch that never reuses a node id.
func FuzzValidMaps(f *testing.F) {
	f.Add(uint8(3), uint64(0), int8(3), uint8(0), uint8(0), uint8(0), uint8(0), uint8(0), false, int8(0), uint8(0))
	f.Add(uint8(4), uint64(0), int8(3), uint8(0), uint8(1), uint8(1), uint8(3), uint8(0), false, int8(0), uint8(0))
	f.Add(uint8(4), uint64(0), int8(3), uint8(1), uint8(2), uint8(2), uint8(1), uint8(0), true, int8(0), uint8(0))
	f.Add(uint8(4), uint64(5), int8(2), uint8(0), uint8(3), uint8(0), uint8(0), uint8(0), false, int8(3), uint8(0))
	f.Add(uint8(5), uint64(0), int8(3), uint8(0), uint8(1), uint8(0), uint8(4), uint8(0), false, int8(0), uint8(2))
	f.Add(uint8(1), uint64(0), int8(1), uint8(0), uint8(0), uint8(0), uint8(0), uint8(0), false, int8(0), uint8(0))
	f.Add(uint8(1), uint64(0), int8(1), uint8(0), uint8(1), uint8(0), uint8(0), uint8(0), false, int8(0), uint8(0))
	f.Add(uint8(4), uint64(0), int8(3), uint8(0), uint8(1), uint8(0xfd), uint8(3), uint8(0), false, int8(0), uint8(0)) // at MaxEpoch
	f.Add(uint8(4), uint64(0), int8(3), uint8(0), uint8(0), uint8(0xfc), uint8(0), uint8(0), false, int8(2), uint8(0))
	f.Fuzz(func(t *testing.T, nodes uint8, gaps uint64, replicas int8, nextExtra, kind, stage, node, driver uint8,
		dead bool, newReplicas int8, removing uint8) {
		m := &clustermap.Map{Cluster: 7, Epoch: 1 + uint64(stage)>>2, Replicas: int(replicas)}
		if stage>>2 == 63 {
			m.Epoch = clustermap.MaxEpoch // the last: every change refused
		}
		id := 0
		for i := range int(nodes % 9) {
			id += int(gaps >> (4 * i) & 0xf) // ids with gaps, as decommissions leave them
			u := fmt.Sprintf("http://127.0.0.1:%d", 7000+id)
			m.Nodes = append(m.Nodes, clustermap.Node{ID: id, URL: u, Seed: xxhash.Sum64String(u)})
			id++
		}
		m.NextID = id + int(nextExtra)%300
		if kind%4 != 0 {
			m.Change = &clustermap.Change{
				Kind:   []clustermap.Kind{clustermap.Join, clustermap.Decommission, clustermap.Replicas}[kind%4-1],
				Stage:  []clustermap.Stage{clustermap.WriteBoth, clustermap.Stream, clustermap.ReadNew}[stage%3],
				Node:   memberID(m, node),
				Driver: memberID(m, driver),
				Dead:   dead,
			}
			if m.Change.Kind == clustermap.Replicas {
				m.Change.Replicas = int(newReplicas)
			}
		}
		for i, n := range m.Nodes {
			if removing>>i&1 != 0 {
				m.Removing = append(m.Removing, n.ID)
			}
		}
		if m.Validate() != nil {
			return
		}
		checkMap(t, m)

		made := map[string]func() (*clustermap.Map, error){
			"advance":      m.Advance,
			"abort":        m.Abort,
			"remove next":  m.RemoveNext,
			"join":         func() (*clustermap.Map, error) { return m.BeginJoin("http://127.0.0.1:9999", memberID(m, driver)) },
			"decommission": func() (*clustermap.Map, error) { return m.BeginDecommission(memberID(m, node), memberID(m, driver)) },
			"remove":       func() (*clustermap.Map, error) { return m.Remove(memberID(m, node), memberID(m, driver)) },
			"replicas":     func() (*clustermap.Map, error) { return m.BeginReplicas(int(newReplicas), memberID(m, driver)) },
			"replace":      func() (*clustermap.Map, error) { return m.Replace(memberID(m, node), "http://127.0.0.1:9998") },
		}
		for name, change := range made {
			// A refusal returns no map; a map with an error is one the
			// change made and Validate refused: the change's own bug.
			n, err := change()
			if n == nil && err != nil {
				continue
			}
			if n == nil || err != nil {
				t.Fatalf("%s of %s: map %v, error %v", name, m, n, err)
			}
			if n.Epoch != m.Epoch+1 || n.Cluster != m.Cluster || n.NextID < m.NextID {
				t.Fatalf("%s of %s: epoch %d, cluster %d, next id %d", name, m, n.Epoch, n.Cluster, n.NextID)
			}
			for _, nn := range n.Nodes {
				if m.Node(nn.ID) == nil && nn.ID < m.NextID {
					t.Fatalf("%s of %s: node id %d given again", name, m, nn.ID)
				}
			}
			checkMap(t, n)
		}
	})
}

// memberID picks a member's id by the fuzzer's number, or an id that is
// none (as a request naming a wrong node would).
func memberID(m *clustermap.Map, i uint8) int {
	if len(m.Nodes) == 0 || int(i) >= 2*len(m.Nodes) {
		return int(i)
	}
	return m.Nodes[int(i)%len(m.Nodes)].ID
}

func checkMap(t *testing.T, m *clustermap.Map) {
	t.Helper()
	_ = m.String()
	back, err := clustermap.Decode(m.Encode())
	if err != nil {
		t.Fatalf("%s does not decode: %v", m, err)
	}
	if !reflect.DeepEqual(back, m) {
		t.Fatalf("%s decodes as %s", m, back)
	}
	s := Of(m)
	if s.OldFactor < 1 || s.NewFactor < 1 || s.Replicas != max(s.OldFactor, s.NewFactor) {
		t.Fatalf("%s: factors %d and %d, largest from %d", m, s.OldFactor, s.NewFactor, s.Replicas)
	}
	for _, key := range []string{"a", "b", "some key", "\x00"} {
		inSet := func(what string, got []int, factor int, set []clustermap.Node) {
			if len(got) < 1 || len(got) > factor {
				t.Fatalf("%s: %s of %q: %v, factor %d", m, what, key, got, factor)
			}
			for i, id := range got {
				if !slices.ContainsFunc(set, func(n clustermap.Node) bool { return n.ID == id }) || slices.Contains(got[:i], id) {
					t.Fatalf("%s: %s of %q: %v", m, what, key, got)
				}
			}
		}
		readSet := m.Old()
		if s.ReadNew {
			readSet = m.New()
		}
		inSet("reads", s.ReadReplicas([]byte(key), s.Replicas, nil), s.ReadFactor(), readSet)
		old, new := s.WriteSets([]byte(key), s.Replicas, nil, nil)
		inSet("old writes", old, s.OldFactor, m.Old())
		if s.Moving {
			inSet("new writes", new, s.NewFactor, m.New())
		}
	}
	part, _ := partition.Of([]byte("a"))
	_ = s.Receives(part, 0)
	_ = s.Holds(part, 0)
}

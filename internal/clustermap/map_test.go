package clustermap

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

var urls3 = []string{"http://127.0.0.1:8080", "http://127.0.0.1:8081", "http://127.0.0.1:8082"}

func seed3(t *testing.T) *Map {
	t.Helper()
	m, err := Seed(urls3, 0)
	require.NoError(t, err)
	return m
}

// A seeded map keeps what the --cluster list gave before maps existed:
// ids by position, and the replication factor defaults to the size.
func TestSeed(t *testing.T) {
	m := seed3(t)
	require.Equal(t, uint64(1), m.Epoch)
	require.Equal(t, 3, m.Replicas)
	require.Equal(t, 3, m.NextID)
	for i, n := range m.Nodes {
		require.Equal(t, i, n.ID)
		require.Equal(t, urls3[i], n.URL)
	}
	again, err := Seed(urls3, 2)
	require.NoError(t, err)
	require.Equal(t, m.Cluster, again.Cluster, "the cluster id is the list's hash")
	require.Equal(t, 2, again.Replicas)
	_, err = Seed(nil, 0)
	require.Error(t, err)
}

// A join and a decommission go through the three stages, one epoch each,
// then end with the new set as the nodes.
func TestChangeStages(t *testing.T) {
	for _, tc := range []struct {
		name      string
		begin     func(*Map) (*Map, error)
		wantNodes int
		oldLen    int
		newLen    int
	}{
		{"join", func(m *Map) (*Map, error) { return m.BeginJoin("http://127.0.0.1:8083/", 0) }, 4, 3, 4},
		{"decommission", func(m *Map) (*Map, error) { return m.BeginDecommission(1, 0) }, 2, 3, 2},
		{"decommission driven by the leaving node", func(m *Map) (*Map, error) { return m.BeginDecommission(0, 0) }, 2, 3, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := tc.begin(seed3(t))
			require.NoError(t, err)
			require.Equal(t, uint64(2), m.Epoch)
			require.Len(t, m.Old(), tc.oldLen)
			require.Len(t, m.New(), tc.newLen)
			stages := []Stage{m.Change.Stage}
			for m.Change != nil {
				m, err = m.Advance()
				require.NoError(t, err)
				if m.Change != nil {
					stages = append(stages, m.Change.Stage)
				}
			}
			require.Equal(t, []Stage{WriteBoth, Stream, ReadNew}, stages)
			require.Equal(t, uint64(5), m.Epoch)
			require.Len(t, m.Nodes, tc.wantNodes)
			back, err := Decode(m.Encode())
			require.NoError(t, err)
			require.Equal(t, m, back)
		})
	}
}

// The changes that must be refused, with the reason.
func TestChangeRefused(t *testing.T) {
	busy, err := seed3(t).BeginJoin("http://127.0.0.1:9000", 0)
	require.NoError(t, err)
	one, err := Seed(urls3[:1], 0)
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		try  func() (*Map, error)
		want string
	}{
		{"join during a change", func() (*Map, error) { return busy.BeginJoin("http://127.0.0.1:9001", 0) }, "another membership change"},
		{"decommission during a change", func() (*Map, error) { return busy.BeginDecommission(1, 0) }, "another membership change"},
		{"replace with a member during a change", func() (*Map, error) { return busy.Replace(1, "http://127.0.0.1:9000") }, "already a member"},
		{"replace a stranger during a change", func() (*Map, error) { return busy.Replace(7, "http://127.0.0.1:9001") }, "not a member"},
		{"join a member", func() (*Map, error) { return seed3(t).BeginJoin(urls3[1], 0) }, "already a member"},
		{"join a bad URL", func() (*Map, error) { return seed3(t).BeginJoin("https://127.0.0.1:1", 0) }, "want http://host:port"},
		{"decommission a stranger", func() (*Map, error) { return seed3(t).BeginDecommission(7, 0) }, "not a member"},
		{"decommission the last node", func() (*Map, error) { return one.BeginDecommission(0, 0) }, "last node"},
		{"replace with a member", func() (*Map, error) { return seed3(t).Replace(1, urls3[2]) }, "already a member"},
		{"advance without a change", func() (*Map, error) { return seed3(t).Advance() }, "no change"},
		{"join driven by a stranger", func() (*Map, error) { return seed3(t).BeginJoin("http://127.0.0.1:9000", 7) }, "driver node 7 is not a member"},
		{"decommission driven by a stranger", func() (*Map, error) { return seed3(t).BeginDecommission(1, 7) }, "driver node 7 is not a member"},
		{"remove driven by a stranger", func() (*Map, error) { return seed3(t).Remove(1, 7) }, "driver node 7 is not a member"},
	} {
		m, err := tc.try()
		require.ErrorContains(t, err, tc.want, tc.name)
		require.Nil(t, m, "%s: a refusal makes no map", tc.name)
	}
}

// Replace keeps the node's id and seed (so its placement) and changes its
// URL only; ids are never reused after a node left.
func TestReplaceAndIDs(t *testing.T) {
	m := seed3(t)
	r, err := m.Replace(2, "http://127.0.0.1:9002")
	require.NoError(t, err)
	require.Equal(t, m.Nodes[2].Seed, r.Node(2).Seed)
	require.Equal(t, "http://127.0.0.1:9002", r.Node(2).URL)
	require.Equal(t, m.Epoch+1, r.Epoch)

	d, err := m.BeginDecommission(2, 0)
	require.NoError(t, err)
	for d.Change != nil {
		d, err = d.Advance()
		require.NoError(t, err)
	}
	j, err := d.BeginJoin("http://127.0.0.1:8082", 0)
	require.NoError(t, err)
	require.Equal(t, 3, j.Change.Node, "a node that returns gets a new id")
	require.NotEqual(t, m.Nodes[2].Seed, 0)
}

// A dead member of a change under way is replaced at any stage, whatever
// its part in the change (in both sets, the node a join adds or a
// decommission removes, the driver): the change stays at its stage in a
// new epoch, every node keeps its id and seed, so both sets place every
// partition as before, and the change goes on (abort before read-new,
// advance to its end) as it would have.
func TestReplaceDuringChange(t *testing.T) {
	const fresh = "http://127.0.0.1:9100"
	for _, tc := range []struct {
		name   string
		begin  func(*Map) (*Map, error)
		victim int
	}{
		{"join, the joining node", func(m *Map) (*Map, error) { return m.BeginJoin("http://127.0.0.1:8083", 0) }, 3},
		{"join, a node of both sets", func(m *Map) (*Map, error) { return m.BeginJoin("http://127.0.0.1:8083", 0) }, 2},
		{"join, its driver", func(m *Map) (*Map, error) { return m.BeginJoin("http://127.0.0.1:8083", 1) }, 1},
		{"decommission, the leaving node", func(m *Map) (*Map, error) { return m.BeginDecommission(1, 0) }, 1},
		{"decommission driven by the leaving node", func(m *Map) (*Map, error) { return m.BeginDecommission(1, 1) }, 1},
		{"replicas, its driver", func(m *Map) (*Map, error) { return m.BeginReplicas(2, 2) }, 2},
	} {
		for _, stage := range []Stage{WriteBoth, Stream, ReadNew} {
			t.Run(fmt.Sprintf("%s at %s", tc.name, stage), func(t *testing.T) {
				m, err := tc.begin(seed3(t))
				require.NoError(t, err)
				for m.Change.Stage != stage {
					m, err = m.Advance()
					require.NoError(t, err)
				}
				r, err := m.Replace(tc.victim, fresh)
				require.NoError(t, err)
				require.Equal(t, m.Epoch+1, r.Epoch)
				require.Equal(t, *m.Change, *r.Change, "the change goes on at its stage")
				require.Equal(t, fresh, r.Node(tc.victim).URL)
				require.Equal(t, m.Node(tc.victim).Seed, r.Node(tc.victim).Seed)
				require.True(t, r.SamePlacement(m), "both sets place as before")
				require.Equal(t, seeds(m.Old()), seeds(r.Old()))
				require.Equal(t, seeds(m.New()), seeds(r.New()))
				require.Equal(t, m.NewReplicas(), r.NewReplicas())
				require.NotNil(t, m.Node(m.Change.Driver), "the driver is still a member")
				back, err := Decode(r.Encode())
				require.NoError(t, err)
				require.Equal(t, r, back)

				a, err := r.Abort()
				if stage == ReadNew {
					require.ErrorIs(t, err, ErrPastReadNew, "abort rules unchanged")
				} else {
					require.NoError(t, err)
					require.Nil(t, a.Change)
				}
				for r.Change != nil {
					r, err = r.Advance()
					require.NoError(t, err)
				}
				if n := r.Node(tc.victim); n != nil {
					require.Equal(t, fresh, n.URL, "the change ends with the new machine in the victim's place")
				}
			})
		}
	}
}

// seeds lists nodes by id and seed: what placement depends on.
func seeds(nodes []Node) [][2]uint64 {
	var out [][2]uint64
	for _, n := range nodes {
		out = append(out, [2]uint64{uint64(n.ID), n.Seed})
	}
	return out
}

// SamePlacement tells a replace's map from a change of placement.
func TestSamePlacement(t *testing.T) {
	m := seed3(t)
	r, err := m.Replace(1, "http://127.0.0.1:9001")
	require.NoError(t, err)
	require.True(t, m.SamePlacement(r))
	j, err := m.BeginJoin("http://127.0.0.1:8083", 0)
	require.NoError(t, err)
	require.False(t, m.SamePlacement(j), "a join adds a node")
	s, err := j.Advance()
	require.NoError(t, err)
	require.False(t, j.SamePlacement(s), "another stage reads or writes other sets")
	g, err := m.BeginReplicas(2, 0)
	require.NoError(t, err)
	require.False(t, m.SamePlacement(g), "another factor")
	d1, err := m.BeginDecommission(1, 0)
	require.NoError(t, err)
	d2, err := m.BeginDecommission(2, 0)
	require.NoError(t, err)
	require.False(t, d1.SamePlacement(d2), "another leaving node")
	o, err := m.BeginDecommission(1, 2)
	require.NoError(t, err)
	require.True(t, d1.SamePlacement(o), "the driver places nothing")
}

// Decode refuses maps that break the invariants.
func TestDecodeRefuses(t *testing.T) {
	for _, tc := range []struct{ name, json, want string }{
		{"not json", `{`, "cluster map"},
		{"epoch 0", `{"epoch":0,"replicas":1,"next_id":1,"nodes":[{"id":0,"url":"http://a:1"}]}`, "epoch 0"},
		{"no nodes", `{"epoch":1,"replicas":1,"next_id":1,"nodes":[]}`, "no nodes"},
		{"unordered", `{"epoch":1,"replicas":1,"next_id":3,"nodes":[{"id":2,"url":"http://a:1"},{"id":1,"url":"http://b:1"}]}`, "ordered"},
		{"id beyond next", `{"epoch":1,"replicas":1,"next_id":1,"nodes":[{"id":1,"url":"http://a:1"}]}`, "out of range"},
		{"twice", `{"epoch":1,"replicas":1,"next_id":2,"nodes":[{"id":0,"url":"http://a:1"},{"id":1,"url":"http://a:1"}]}`, "twice"},
		{"join of the only node", `{"epoch":1,"replicas":1,"next_id":1,"nodes":[{"id":0,"url":"http://a:1"}],"change":{"kind":"join","node":0,"stage":"stream","driver":0}}`, "old set would be empty"},
		{"unknown stage", `{"epoch":1,"replicas":1,"next_id":2,"nodes":[{"id":0,"url":"http://a:1"},{"id":1,"url":"http://b:1"}],"change":{"kind":"join","node":1,"stage":"x","driver":0}}`, "unknown stage"},
		{"epoch 2^64-1", `{"epoch":18446744073709551615,"replicas":1,"next_id":1,"nodes":[{"id":0,"url":"http://a:1"}]}`, "above the largest"},
		{"epoch MaxEpoch+1", `{"epoch":4611686018427387905,"replicas":1,"next_id":1,"nodes":[{"id":0,"url":"http://a:1"}]}`, "above the largest"},
		{"epoch beyond uint64", `{"epoch":18446744073709551616,"replicas":1,"next_id":1,"nodes":[{"id":0,"url":"http://a:1"}]}`, "cluster map"},
	} {
		_, err := Decode([]byte(tc.json))
		require.ErrorContains(t, err, tc.want, tc.name)
	}
}

// A map at MaxEpoch is valid, and every change from it is refused with
// no map and the reason, rather than made at an epoch that wraps to 0;
// one epoch earlier each change is still made, at MaxEpoch.
func TestLastEpoch(t *testing.T) {
	idle, err := Seed(urls3, 2)
	require.NoError(t, err)
	joining, err := idle.BeginJoin("http://127.0.0.1:8083", 0)
	require.NoError(t, err)
	removing, err := joining.Remove(2, 0) // counted dead, removed once the join ends
	require.NoError(t, err)
	for range 3 {
		removing, err = removing.Advance()
		require.NoError(t, err)
	}
	require.Nil(t, removing.Change)
	require.Equal(t, []int{2}, removing.Removing)
	for _, epoch := range []uint64{MaxEpoch - 1, MaxEpoch} {
		for _, tc := range []struct {
			name   string
			from   *Map
			change func(m *Map) (*Map, error)
		}{
			{"join", idle, func(m *Map) (*Map, error) { return m.BeginJoin("http://127.0.0.1:8083", 0) }},
			{"decommission", idle, func(m *Map) (*Map, error) { return m.BeginDecommission(2, 0) }},
			{"remove", idle, func(m *Map) (*Map, error) { return m.Remove(2, 0) }},
			{"replicas", idle, func(m *Map) (*Map, error) { return m.BeginReplicas(3, 0) }},
			{"replace", idle, func(m *Map) (*Map, error) { return m.Replace(2, "http://127.0.0.1:8083") }},
			{"advance", joining, (*Map).Advance},
			{"abort", joining, (*Map).Abort},
			{"remove during a change", joining, func(m *Map) (*Map, error) { return m.Remove(2, 0) }},
			{"remove next", removing, (*Map).RemoveNext},
		} {
			m, err := Decode(tc.from.Encode())
			require.NoError(t, err)
			m.Epoch = epoch
			back, err := Decode(m.Encode())
			require.NoError(t, err, "epoch %d is valid", epoch)
			n, err := tc.change(back)
			if epoch == MaxEpoch {
				require.Nil(t, n, tc.name)
				require.ErrorContains(t, err, "no change can follow", tc.name)
				continue
			}
			require.NoError(t, err, tc.name)
			require.Equal(t, uint64(MaxEpoch), n.Epoch, tc.name)
		}
	}
}

// Abort ends a change with the old set, one epoch on, before read-new
// only; the aborted joiner's id is not given again.
func TestAbort(t *testing.T) {
	m := seed3(t)
	_, err := m.Abort()
	require.Error(t, err, "nothing to abort")
	for _, tc := range []struct {
		name   string
		begin  func(*Map) (*Map, error)
		stages int // advances before the abort
		ok     bool
		nodes  []int
	}{
		{"join at write-both", func(m *Map) (*Map, error) { return m.BeginJoin("http://127.0.0.1:8083", 0) }, 0, true, []int{0, 1, 2}},
		{"join at stream", func(m *Map) (*Map, error) { return m.BeginJoin("http://127.0.0.1:8083", 0) }, 1, true, []int{0, 1, 2}},
		{"join at read-new", func(m *Map) (*Map, error) { return m.BeginJoin("http://127.0.0.1:8083", 0) }, 2, false, nil},
		{"decommission at write-both", func(m *Map) (*Map, error) { return m.BeginDecommission(2, 0) }, 0, true, []int{0, 1, 2}},
		{"decommission at stream", func(m *Map) (*Map, error) { return m.BeginDecommission(2, 0) }, 1, true, []int{0, 1, 2}},
		{"decommission at read-new", func(m *Map) (*Map, error) { return m.BeginDecommission(2, 0) }, 2, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tc.begin(m)
			require.NoError(t, err)
			for range tc.stages {
				c, err = c.Advance()
				require.NoError(t, err)
			}
			a, err := c.Abort()
			if !tc.ok {
				require.ErrorIs(t, err, ErrPastReadNew)
				return
			}
			require.NoError(t, err)
			require.Nil(t, a.Change)
			require.Equal(t, c.Epoch+1, a.Epoch)
			var ids []int
			for _, n := range a.Nodes {
				ids = append(ids, n.ID)
			}
			require.Equal(t, tc.nodes, ids)
			require.Equal(t, c.NextID, a.NextID, "an aborted joiner's id is never given again")
		})
	}
}

// A replicas change keeps the nodes, carries the new factor through the
// three stages (the map's own factor staying the old set's), and sets it
// at the end; both directions, and bounds at both ends.
func TestReplicasStages(t *testing.T) {
	for _, tc := range []struct {
		name     string
		seedR, n int
	}{
		{"grow 2 to 3", 2, 3},
		{"shrink 3 to 2", 3, 2},
		{"shrink to 1", 2, 1},
		{"grow 1 to all", 1, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Seed(urls3, tc.seedR)
			require.NoError(t, err)
			c, err := m.BeginReplicas(tc.n, 1)
			require.NoError(t, err)
			require.Equal(t, &Change{Kind: Replicas, Node: 1, Stage: WriteBoth, Driver: 1, Replicas: tc.n}, c.Change)
			require.Equal(t, m.Nodes, c.Old())
			require.Equal(t, m.Nodes, c.New())
			var stages []Stage
			for c.Change != nil {
				stages = append(stages, c.Change.Stage)
				require.Equal(t, tc.seedR, c.Replicas, "the old set's factor until the end")
				require.Equal(t, tc.n, c.NewReplicas())
				back, err := Decode(c.Encode())
				require.NoError(t, err)
				require.Equal(t, c, back)
				c, err = c.Advance()
				require.NoError(t, err)
			}
			require.Equal(t, []Stage{WriteBoth, Stream, ReadNew}, stages)
			require.Equal(t, uint64(5), c.Epoch)
			require.Equal(t, tc.n, c.Replicas)
			require.Equal(t, tc.n, c.NewReplicas())
			require.Equal(t, m.Nodes, c.Nodes)
			require.Equal(t, m.NextID, c.NextID)
		})
	}
}

// BeginReplicas refuses what cannot be done, with the reason; and a
// change of another kind is refused while a replicas change is under way
// (a replace is not a change of placement: TestReplaceDuringChange).
func TestReplicasRefused(t *testing.T) {
	m, err := Seed(urls3, 2)
	require.NoError(t, err)
	busy, err := m.BeginReplicas(3, 0)
	require.NoError(t, err)
	join, err := m.BeginJoin("http://127.0.0.1:9000", 0)
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		try  func() (*Map, error)
		want string
	}{
		{"zero", func() (*Map, error) { return m.BeginReplicas(0, 0) }, "out of range: from 1 to the number of nodes, 3"},
		{"negative", func() (*Map, error) { return m.BeginReplicas(-1, 0) }, "out of range"},
		{"more than the nodes", func() (*Map, error) { return m.BeginReplicas(4, 0) }, "replication factor 4 out of range"},
		{"the same factor", func() (*Map, error) { return m.BeginReplicas(2, 0) }, "the replication factor is 2 already"},
		{"a stranger drives", func() (*Map, error) { return m.BeginReplicas(3, 7) }, "driver node 7 is not a member"},
		{"during a join", func() (*Map, error) { return join.BeginReplicas(3, 0) }, "another membership change is under way: join of node 3, stage write-both"},
		{"during a replicas change", func() (*Map, error) { return busy.BeginReplicas(1, 0) }, "another membership change is under way: replicas change to 3, stage write-both"},
		{"join during it", func() (*Map, error) { return busy.BeginJoin("http://127.0.0.1:9001", 0) }, "another membership change"},
		{"decommission during it", func() (*Map, error) { return busy.BeginDecommission(1, 0) }, "another membership change"},
	} {
		_, err := tc.try()
		require.ErrorContains(t, err, tc.want, tc.name)
	}
	require.Equal(t, "epoch 2, 3 nodes, replication factor 2 to 3 at stage write-both", busy.String())
}

// Validate refuses a replicas change whose factor cannot be, and a factor
// on a change of another kind.
func TestReplicasDecodeRefuses(t *testing.T) {
	const nodes = `"nodes":[{"id":0,"url":"http://a:1"},{"id":1,"url":"http://b:1"}]`
	for _, tc := range []struct{ name, json, want string }{
		{"factor 0", `{"epoch":2,"replicas":1,"next_id":2,` + nodes + `,"change":{"kind":"replicas","node":0,"stage":"stream","driver":0,"replicas":0}}`, "replicas change from 1 to 0 over 2 nodes"},
		{"above the nodes", `{"epoch":2,"replicas":1,"next_id":2,` + nodes + `,"change":{"kind":"replicas","node":0,"stage":"stream","driver":0,"replicas":3}}`, "replicas change from 1 to 3"},
		{"unchanged", `{"epoch":2,"replicas":2,"next_id":2,` + nodes + `,"change":{"kind":"replicas","node":0,"stage":"stream","driver":0,"replicas":2}}`, "replicas change from 2 to 2"},
		{"on a join", `{"epoch":2,"replicas":1,"next_id":2,` + nodes + `,"change":{"kind":"join","node":1,"stage":"stream","driver":0,"replicas":2}}`, "join change with a replication factor 2"},
		{"unknown kind", `{"epoch":2,"replicas":1,"next_id":2,` + nodes + `,"change":{"kind":"shuffle","node":1,"stage":"stream","driver":0}}`, "unknown change"},
	} {
		_, err := Decode([]byte(tc.json))
		require.ErrorContains(t, err, tc.want, tc.name)
	}
}

// Abort of a replicas change keeps the old factor, before read-new only.
func TestAbortReplicas(t *testing.T) {
	m, err := Seed(urls3, 2)
	require.NoError(t, err)
	for stages, ok := range []bool{true, true, false} {
		c, err := m.BeginReplicas(3, 0)
		require.NoError(t, err)
		for range stages {
			c, err = c.Advance()
			require.NoError(t, err)
		}
		a, err := c.Abort()
		if !ok {
			require.ErrorIs(t, err, ErrPastReadNew, "at %s", c.Change.Stage)
			continue
		}
		require.NoError(t, err, "at %s", c.Change.Stage)
		require.Nil(t, a.Change)
		require.Equal(t, 2, a.Replicas)
		require.Equal(t, m.Nodes, a.Nodes)
		require.Equal(t, c.Epoch+1, a.Epoch)
	}
}

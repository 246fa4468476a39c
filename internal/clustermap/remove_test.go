package clustermap

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

var urls4 = append(append([]string{}, urls3...), "http://127.0.0.1:8083")

// seed4 is a map of 4 nodes with 3 replicas: one node can be removed.
func seed4(t *testing.T) *Map {
	t.Helper()
	m, err := Seed(urls4, 3)
	require.NoError(t, err)
	return m
}

// A remove with no change under way begins a decommission whose leaving
// node is dead: the decommission's sets and stages, the dead mark kept
// through them, and at the end the node is out of the map as a
// decommissioned node is.
func TestRemoveStages(t *testing.T) {
	m := seed4(t)
	r, err := m.Remove(2, 0)
	require.NoError(t, err)
	require.Equal(t, &Change{Kind: Decommission, Node: 2, Stage: WriteBoth, Driver: 0, Dead: true}, r.Change)
	d, err := m.BeginDecommission(2, 0)
	require.NoError(t, err)
	require.True(t, r.SamePlacement(d), "a remove places as the decommission of the node")
	require.Equal(t, seeds(d.Old()), seeds(r.Old()))
	require.Equal(t, seeds(d.New()), seeds(r.New()))
	require.Equal(t, "epoch 2, 4 nodes, decommission of node 2 (dead) at stage write-both", r.String())

	stages := []Stage{r.Change.Stage}
	for r.Change != nil {
		require.True(t, r.Change.Dead, "the mark stays through the stages")
		back, err := Decode(r.Encode())
		require.NoError(t, err)
		require.Equal(t, r, back)
		r, err = r.Advance()
		require.NoError(t, err)
		if r.Change != nil {
			stages = append(stages, r.Change.Stage)
		}
	}
	require.Equal(t, []Stage{WriteBoth, Stream, ReadNew}, stages)
	require.Nil(t, r.Node(2), "the dead node left the map")
	require.Len(t, r.Nodes, 3)
	require.Equal(t, 4, r.NextID, "its id is never given again")
}

// A remove of the node a decommission under way removes marks it dead in
// that change, at any stage: same stage, new epoch, same placement, the
// remover as the driver (the leaving node may have driven it). The change
// then goes on (abort before read-new, advance to the end) as the
// decommission would have.
func TestRemoveDuringItsDecommission(t *testing.T) {
	for _, driver := range []int{0, 2} {
		for _, stage := range []Stage{WriteBoth, Stream, ReadNew} {
			t.Run(fmt.Sprintf("driven by %d at %s", driver, stage), func(t *testing.T) {
				m, err := seed4(t).BeginDecommission(2, driver)
				require.NoError(t, err)
				for m.Change.Stage != stage {
					m, err = m.Advance()
					require.NoError(t, err)
				}
				r, err := m.Remove(2, 1)
				require.NoError(t, err)
				require.Equal(t, m.Epoch+1, r.Epoch)
				require.Equal(t, Change{Kind: Decommission, Node: 2, Stage: stage, Driver: 1, Dead: true}, *r.Change)
				require.True(t, r.SamePlacement(m), "the dead mark places nothing")
				require.Equal(t, m.Nodes, r.Nodes)

				_, err = r.Remove(2, 0)
				require.ErrorIs(t, err, ErrBusy)
				require.ErrorContains(t, err, "node 2 is being removed already")
				_, err = r.Replace(2, "http://127.0.0.1:9100")
				require.ErrorContains(t, err, "node 2 is being removed")

				a, err := r.Abort()
				if stage == ReadNew {
					require.ErrorIs(t, err, ErrPastReadNew)
				} else {
					require.NoError(t, err)
					require.Nil(t, a.Change)
					require.NotNil(t, a.Node(2), "aborted, the dead node is still a member")
				}
				for r.Change != nil {
					r, err = r.Advance()
					require.NoError(t, err)
				}
				require.Nil(t, r.Node(2))
			})
		}
	}
}

// The removes that are refused, with the reason.
func TestRemoveRefused(t *testing.T) {
	m := seed4(t)
	dec, err := m.BeginDecommission(1, 0)
	require.NoError(t, err)
	counted, err := m.BeginJoin("http://127.0.0.1:9000", 0) // 5 nodes in the new set
	require.NoError(t, err)
	counted, err = counted.Remove(3, 0)
	require.NoError(t, err)
	two, err := counted.Remove(2, 0)
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		m    *Map
		id   int
		busy bool
		want string
	}{
		{"not a member", m, 7, false, "node 7 is not a member"},
		{"itself", m, 0, false, "node 0 cannot remove itself"},
		{"below the replication factor", seed3(t), 2, false, "would leave 2 nodes, fewer than the replication factor 3"},
		{"a member of a change, too few left after it", dec, 2, false,
			"removing node 2 after the decommission of node 1, stage write-both would leave 2 nodes, fewer than the replication factor 3: replace it instead"},
		{"a third member of a change, too few left after it", two, 1, false, "removing node 1 after the join of node 4, stage write-both would leave 2 nodes"},
		{"counted dead already", counted, 3, true, "node 3 is counted dead and removed once the change under way is over"},
	} {
		_, err := tc.m.Remove(tc.id, 0)
		require.ErrorContains(t, err, tc.want, tc.name)
		if tc.busy {
			require.ErrorIs(t, err, ErrBusy, tc.name)
		}
	}
}

// A remove of a member of a change under way other than a decommission's
// leaving node counts it dead in that change (Removing): same stage, new
// epoch, same placement, for any kind of change and any part the node
// has in it (the node a join adds included). The change goes on to its
// end with the node still a member (an abort too), and RemoveNext then
// removes it as Remove would with no change under way; no other change
// begins before.
func TestRemoveDuringAnotherChange(t *testing.T) {
	m5, err := Seed(append(append([]string{}, urls4...), "http://127.0.0.1:8084"), 3)
	require.NoError(t, err)
	join, err := seed4(t).BeginJoin("http://127.0.0.1:9000", 0)
	require.NoError(t, err)
	dec, err := m5.BeginDecommission(1, 0)
	require.NoError(t, err)
	removal, err := m5.Remove(1, 0)
	require.NoError(t, err)
	grow, err := Seed(urls4, 2)
	require.NoError(t, err)
	grow, err = grow.BeginReplicas(3, 0)
	require.NoError(t, err)
	for _, tc := range []struct {
		name   string
		m      *Map
		id     int
		nodes  int // after the change and the removal
		aborts bool
	}{
		{"a node of a join", join, 2, 4, true},
		{"the joining node", join, 4, 4, true},
		{"a node of a decommission", dec, 2, 3, true},
		{"a node of a remove", removal, 2, 3, true},
		{"a node of a replicas change", grow, 3, 3, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, stage := range []Stage{WriteBoth, Stream, ReadNew} {
				at := tc.m
				for at.Change.Stage != stage {
					at, err = at.Advance()
					require.NoError(t, err)
				}
				r, err := at.Remove(tc.id, 0)
				require.NoError(t, err, stage)
				require.Equal(t, at.Epoch+1, r.Epoch)
				require.Equal(t, []int{tc.id}, r.Removing)
				require.True(t, r.SamePlacement(at), "counting a node dead moves no partition")
				require.True(t, r.Dead(tc.id))
				require.Equal(t, at.Change.Dead, r.Change.Dead)
				require.Contains(t, r.String(), fmt.Sprintf(", nodes [%d] dead, to be removed", tc.id))
				back, err := Decode(r.Encode())
				require.NoError(t, err)
				require.Equal(t, r, back)
				_, err = r.BeginDecommission(0, 0)
				require.ErrorIs(t, err, ErrBusy)
				_, err = r.Replace(tc.id, "http://127.0.0.1:9999")
				require.ErrorContains(t, err, "counted dead")

				end := r
				if stage != ReadNew {
					if aborted, err := r.Abort(); err == nil {
						require.Nil(t, aborted.Change)
						if aborted.Node(tc.id) == nil {
							require.Empty(t, aborted.Removing, "a join's node counted dead leaves with the join")
						} else {
							require.Equal(t, []int{tc.id}, aborted.Removing)
						}
					}
				}
				for end.Change != nil {
					end, err = end.Advance()
					require.NoError(t, err)
				}
				require.NotNil(t, end.Node(tc.id), "still a member once the change is over")
				require.Equal(t, []int{tc.id}, end.Removing)
				_, err = end.BeginJoin("http://127.0.0.1:9998", 0)
				require.ErrorContains(t, err, fmt.Sprintf("dead nodes [%d] are to be removed first", tc.id))
				next, err := end.RemoveNext()
				require.NoError(t, err)
				require.Empty(t, next.Removing)
				require.Equal(t, Decommission, next.Change.Kind)
				require.Equal(t, tc.id, next.Change.Node)
				require.True(t, next.Change.Dead)
				require.False(t, next.Dead(next.Change.Driver), "a live member drives it")
				for next.Change != nil {
					next, err = next.Advance()
					require.NoError(t, err)
				}
				require.Nil(t, next.Node(tc.id))
				require.Len(t, next.Nodes, tc.nodes)
			}
		})
	}
	_, err = m5.RemoveNext()
	require.ErrorContains(t, err, "no dead node to remove")
}

// Two dead members of a five-node cluster with three replicas, no spare
// machine: the first remove begins, the second counts its node dead in
// it, and the two leave one after the other.
func TestRemoveTwoDead(t *testing.T) {
	m, err := Seed(append(append([]string{}, urls4...), "http://127.0.0.1:8084"), 3)
	require.NoError(t, err)
	r, err := m.Remove(3, 0)
	require.NoError(t, err)
	r, err = r.Remove(4, 1)
	require.NoError(t, err)
	require.Equal(t, "epoch 3, 5 nodes, decommission of node 3 (dead) at stage write-both, nodes [4] dead, to be removed", r.String())
	require.Equal(t, 0, r.Change.Driver, "counting another node dead keeps the change's driver")
	for r.Change != nil {
		r, err = r.Advance()
		require.NoError(t, err)
	}
	require.Equal(t, "epoch 6, 4 nodes, nodes [4] dead, to be removed", r.String())
	r, err = r.RemoveNext()
	require.NoError(t, err)
	require.Equal(t, &Change{Kind: Decommission, Node: 4, Stage: WriteBoth, Driver: 0, Dead: true}, r.Change)
	for r.Change != nil {
		r, err = r.Advance()
		require.NoError(t, err)
	}
	require.Equal(t, "epoch 10, 3 nodes", r.String())
	require.Equal(t, 5, r.NextID)
}

// The dead mark decodes false from maps without it, and Validate allows
// it only on a decommission's leaving node that does not drive it.
func TestRemoveMarkDecode(t *testing.T) {
	old := `{"cluster":1,"epoch":2,"replicas":2,"next_id":3,"nodes":[{"id":0,"url":"http://a:1"},{"id":1,"url":"http://b:1"},{"id":2,"url":"http://c:1"}],` +
		`"change":{"kind":"decommission","node":2,"stage":"stream","driver":0}}`
	m, err := Decode([]byte(old))
	require.NoError(t, err)
	require.False(t, m.Change.Dead)
	var raw map[string]any
	require.NoError(t, json.Unmarshal(m.Encode(), &raw))
	require.NotContains(t, raw["change"], "dead", "a change without the mark encodes as before")

	for _, tc := range []struct{ name, change, want string }{
		{"dead decommission", `{"kind":"decommission","node":2,"stage":"stream","driver":0,"dead":true}`, ""},
		{"dead join", `{"kind":"join","node":2,"stage":"stream","driver":0,"dead":true}`, "marks a dead node"},
		{"dead replicas change", `{"kind":"replicas","node":0,"stage":"stream","driver":0,"replicas":3,"dead":true}`, "marks a dead node"},
		{"dead driver", `{"kind":"decommission","node":2,"stage":"stream","driver":2,"dead":true}`, "marks a dead node"},
	} {
		_, err := Decode([]byte(`{"cluster":1,"epoch":2,"replicas":2,"next_id":3,"nodes":[{"id":0,"url":"http://a:1"},{"id":1,"url":"http://b:1"},{"id":2,"url":"http://c:1"}],"change":` + tc.change + `}`))
		if tc.want == "" {
			require.NoError(t, err, tc.name)
		} else {
			require.ErrorContains(t, err, tc.want, tc.name)
		}
	}
}

// Validate allows Removing only of members, once each, never the leaving
// node of a decommission under way (marked dead there instead), and never
// so many that the nodes left would be fewer than the replication factor.
func TestRemovingValidate(t *testing.T) {
	const nodes = `"nodes":[{"id":0,"url":"http://a:1"},{"id":1,"url":"http://b:1"},{"id":2,"url":"http://c:1"},{"id":3,"url":"http://d:1"}]`
	for _, tc := range []struct{ name, rest, want string }{
		{"with a change", `"change":{"kind":"decommission","node":2,"stage":"stream","driver":0,"dead":true},"removing":[3]`, ""},
		{"without", `"removing":[3,1]`, ""},
		{"not a member", `"removing":[7]`, "removing node 7, not a member"},
		{"twice", `"removing":[3,3]`, "removing node 3 twice"},
		{"the leaving node", `"change":{"kind":"decommission","node":2,"stage":"stream","driver":0},"removing":[2]`, "which the change under way decommissions"},
		{"every node left", `"change":{"kind":"decommission","node":2,"stage":"stream","driver":0},"removing":[0,1,3]`, "would leave 0 nodes, fewer than the replication factor 1"},
		{"down to the factor", `"replicas":3,"removing":[3]`, ""},
		{"below the factor", `"replicas":3,"removing":[3,1]`, "removing nodes [3 1] would leave 2 nodes, fewer than the replication factor 3"},
	} {
		_, err := Decode([]byte(`{"cluster":1,"epoch":2,"replicas":1,"next_id":4,` + nodes + `,` + tc.rest + `}`))
		if tc.want == "" {
			require.NoError(t, err, tc.name)
		} else {
			require.ErrorContains(t, err, tc.want, tc.name)
		}
	}
}

// An abort that would leave, once the nodes counted dead are removed,
// fewer nodes than the replication factor is refused: three nodes with
// three replicas take a fourth, a remove counts node 2 dead in the join
// (four would remain three), and an abort would end with three nodes of
// which one is to be removed.
func TestRemoveAbortBelowFactor(t *testing.T) {
	join, err := seed3(t).BeginJoin("http://127.0.0.1:9000", 0)
	require.NoError(t, err)
	r, err := join.Remove(2, 0)
	require.NoError(t, err)
	_, err = r.Abort()
	require.ErrorContains(t, err, "aborting would leave 2 nodes once the dead nodes [2] are removed, fewer than the replication factor 3")
	r, err = join.Remove(3, 0) // the joining node: it leaves with the join
	require.NoError(t, err)
	a, err := r.Abort()
	require.NoError(t, err)
	require.Empty(t, a.Removing)
	require.Len(t, a.Nodes, 3)
}

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
	join, err := m.BeginJoin("http://127.0.0.1:9000", 0)
	require.NoError(t, err)
	dec, err := m.BeginDecommission(1, 0)
	require.NoError(t, err)
	grow, err := Seed(urls4, 2)
	require.NoError(t, err)
	grow, err = grow.BeginReplicas(3, 0)
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
		{"a node of a join under way", join, 2, true, "join of node 4, stage write-both; a dead member of it is replaced with a new machine (dhtkvctl replace), or the change aborted before read-new (dhtkvctl abort)"},
		{"the joining node", join, 4, true, "dhtkvctl replace"},
		{"another node than a decommission's", dec, 2, true, "decommission of node 1, stage write-both; a dead member"},
		{"a node of a replicas change", grow, 3, true, "replicas change to 3, stage write-both"},
	} {
		_, err := tc.m.Remove(tc.id, 0)
		require.ErrorContains(t, err, tc.want, tc.name)
		if tc.busy {
			require.ErrorIs(t, err, ErrBusy, tc.name)
		}
	}
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

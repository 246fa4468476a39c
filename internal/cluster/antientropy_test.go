package cluster

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestAntiEntropyWarnings: a peer is named once no exchange with it
// succeeded for two intervals, counted from this node's start or from the
// last success; never with the schedule off.
func TestAntiEntropyWarnings(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	topo := Topology{Nodes: []string{"http://a:1", "http://b:1", "http://c:1"}, Self: 0}
	for _, tc := range []struct {
		name     string
		interval time.Duration
		lastB    time.Time // last success with b (zero: none)
		now      time.Time
		want     []string
	}{
		{"young node", time.Hour, time.Time{}, t0.Add(time.Hour), nil},
		{"never in two intervals", time.Hour, time.Time{}, t0.Add(2*time.Hour + time.Second), []string{
			"anti-entropy: no complete exchange with http://b:1 for 2h0m1s",
			"anti-entropy: no complete exchange with http://c:1 for 2h0m1s"}},
		{"b recent", time.Hour, t0.Add(2 * time.Hour), t0.Add(3 * time.Hour), []string{
			"anti-entropy: no complete exchange with http://c:1 for 3h0m0s"}},
		{"schedule off", -1, time.Time{}, t0.Add(100 * time.Hour), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &antiEntropy{c: &Coordinator{topo: topo}, o: AntiEntropyOptions{Interval: tc.interval}, started: t0,
				state: []PeerSync{{Peer: topo.Nodes[0]}, {Peer: topo.Nodes[1], LastSuccess: tc.lastB}, {Peer: topo.Nodes[2]}}}
			require.Equal(t, tc.want, a.warnings(tc.now))
		})
	}
}

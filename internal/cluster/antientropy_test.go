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
	urls := []string{"http://a:1", "http://b:1", "http://c:1"}
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
			c := testCoordinator(t, urls, 0)
			c.v().since = t0
			a := &antiEntropy{c: c, o: AntiEntropyOptions{Interval: tc.interval}, started: t0,
				state: make([]PeerSync, len(urls))}
			a.state[0], a.state[1], a.state[2] = PeerSync{Peer: urls[0]}, PeerSync{Peer: urls[1], LastSuccess: tc.lastB}, PeerSync{Peer: urls[2]}
			require.Equal(t, tc.want, a.warnings(tc.now))
		})
	}
}

package antientropy

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/view"
)

// TestWarnings: a peer is named once no exchange with it succeeded for
// two intervals, counted from this node's start, the view's install or
// the last success; never with the schedule off.
func TestWarnings(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	urls := []string{"http://a:1", "http://b:1", "http://c:1"}
	m, err := clustermap.Seed(urls, 0)
	require.NoError(t, err)
	v := view.New(m, 0, urls[0], func(string) view.Peer { return nil }, t0)
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
		{"schedule off", 0, time.Time{}, t0.Add(100 * time.Hour), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := New(nil, func() *view.View { return v }, nil, nil, Options{Interval: tc.interval}, nil)
			a.started = t0
			a.state[0], a.state[1], a.state[2] = PeerSync{Peer: urls[0]}, PeerSync{Peer: urls[1], LastSuccess: tc.lastB}, PeerSync{Peer: urls[2]}
			require.Equal(t, tc.want, a.Warnings(tc.now))
		})
	}
}

package antientropy

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/store"
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

// flipPeer is a peer reached in-process whose pings answer the
// incarnations of incs in turn (0: silent), the last for good.
type flipPeer struct {
	*rpc.Direct
	incs  []uint64
	pings int
}

func (p *flipPeer) Ping(epoch uint64, deadline time.Time) (view.PingAnswer, error) {
	inc := p.incs[min(p.pings, len(p.incs)-1)]
	p.pings++
	if inc == 0 {
		return view.PingAnswer{}, errors.New("silent")
	}
	a, err := p.Direct.Ping(epoch, deadline)
	a.Incarnation = inc
	return a, err
}

// An exchange that left nothing differing is recorded with the
// incarnation the peer answered before and after it (view.Synced); a
// peer that answered with two (it restarted during the exchange) or not
// at all leaves none, which garbage collection does not trust, and the
// next exchange is due soon rather than an interval on.
func TestExchangeRecordsTheIncarnation(t *testing.T) {
	urls := []string{"http://a:1", "http://b:1"}
	m, err := clustermap.Seed(urls, 2)
	require.NoError(t, err)
	replicaOn := func() *replica.Replica {
		st, err := store.Open("db", store.Options{FS: vfs.NewMem()})
		require.NoError(t, err)
		t.Cleanup(func() { st.Close() })
		clock, err := hlc.New(1, time.Now)
		require.NoError(t, err)
		return &replica.Replica{Store: st, Clock: clock}
	}
	for _, tc := range []struct {
		name   string
		pings  []uint64
		synced uint64
		soon   bool
	}{
		{"the same before and after", []uint64{7}, 7, false},
		{"restarted during it", []uint64{7, 8}, 0, true},
		{"silent after it", []uint64{7, 0}, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			peer := &flipPeer{Direct: &rpc.Direct{URL: urls[1], Server: &rpc.Server{Replica: replicaOn(), MaxKeyBytes: 1024, MaxValueBytes: 1 << 20}}, incs: tc.pings}
			v := view.New(m, 0, urls[0], func(string) view.Peer { return peer }, time.Now())
			a := New(replicaOn(), func() *view.View { return v }, nil, nil, Options{Interval: time.Hour}, slog.New(slog.DiscardHandler))
			a.Members(v)
			defer a.Close()
			before := time.Now()
			for _, st := range a.Repair(context.Background()) {
				require.Empty(t, st.Err)
			}
			s := a.SyncedSince()[1]
			require.False(t, s.At.Before(before), "the exchange succeeded")
			require.Equal(t, tc.synced, s.Incarnation)
			a.mu.Lock()
			due := a.due[1]
			a.mu.Unlock()
			require.Equal(t, tc.soon, due.Before(time.Now().Add(time.Hour/2)), "next due %v", due)
		})
	}
}

package cluster

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dhtkv/dhtkv/internal/view"
)

// TestFanOut checks the rules of fanOut against replicas that answer as a
// case says, without a network: when it returns, with how many successes,
// and which replicas it asked.
func TestFanOut(t *testing.T) {
	defer goleak.VerifyNone(t)
	errDown := errors.New("down")
	const self = 0
	// behaviour of a replica: ok, fail at once, or never answer before
	// the request's deadline (hang).
	type behaviour int
	const (
		ok behaviour = iota
		fail
		hang
	)
	for _, tc := range []struct {
		name       string
		reps       []int // node ids; 0 is the local node
		ack        int
		initial    int
		hedge      time.Duration
		behave     map[int]behaviour
		wantOK     int
		wantErr    bool
		wantAsked  []int // nodes asked, in any order
		wantHedged bool
	}{
		{name: "write: all at once, ack reached", reps: []int{1, 0, 2}, ack: 2, initial: 3, hedge: time.Hour,
			wantOK: 2, wantAsked: []int{0, 1, 2}},
		{name: "write: one down still acks", reps: []int{1, 0, 2}, ack: 2, initial: 3, hedge: time.Hour,
			behave: map[int]behaviour{1: fail}, wantOK: 2, wantAsked: []int{0, 1, 2}},
		{name: "write: two down is not enough", reps: []int{1, 0, 2}, ack: 2, initial: 3, hedge: time.Hour,
			behave: map[int]behaviour{1: fail, 2: fail}, wantOK: 1, wantErr: true, wantAsked: []int{0, 1, 2}},
		{name: "read: local first, then one remote", reps: []int{1, 2, 0}, ack: 2, initial: 2, hedge: time.Hour,
			wantOK: 2, wantAsked: []int{0, 1}},
		{name: "read: a failure starts the spare at once", reps: []int{1, 2, 0}, ack: 2, initial: 2, hedge: time.Hour,
			behave: map[int]behaviour{1: fail}, wantOK: 2, wantAsked: []int{0, 1, 2}},
		{name: "read: a hanging replica is hedged", reps: []int{1, 2, 0}, ack: 2, initial: 2, hedge: time.Millisecond,
			behave: map[int]behaviour{1: hang}, wantOK: 2, wantAsked: []int{0, 1, 2}, wantHedged: true},
		{name: "read: no hedge delay asks everyone", reps: []int{1, 2, 0}, ack: 1, initial: 1, hedge: 0,
			wantOK: 1, wantAsked: []int{0, 1, 2}},
		{name: "read: impossible ack fails without waiting for the hang", reps: []int{1, 2, 0}, ack: 2, initial: 2, hedge: time.Hour,
			behave: map[int]behaviour{0: fail, 2: fail, 1: hang}, wantOK: 0, wantErr: true, wantAsked: []int{0, 1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testCoordinator(t, []string{"http://n0:1", "http://n1:1", "http://n2:1"}, self)
			c.hedgeDelay = tc.hedge
			var mu sync.Mutex
			asked := map[int]bool{}
			release := make(chan struct{}) // ends the hanging calls
			reply := func(node int) answer {
				mu.Lock()
				asked[node] = true
				mu.Unlock()
				switch tc.behave[node] {
				case fail:
					return answer{err: errDown}
				case hang:
					<-release
					return answer{err: errDown}
				}
				return answer{found: true}
			}
			merged := 0
			n, err := c.fanOut(c.routes.Load(), time.Now().Add(time.Minute), []byte("k"), tc.reps, nil, tc.ack, 0, tc.initial,
				fanOp{kind: opRepair}, // answers without side effects: no metrics, no clock
				func([]byte) answer { return reply(self) },
				func(node int, call *view.Call) {
					go func() {
						a := reply(node)
						call.Found, call.Err = a.found, a.err
						call.Done <- call
					}()
				},
				func(answer) { merged++ })
			close(release)
			c.inflight.Wait()
			require.Equal(t, tc.wantOK, n)
			require.Equal(t, tc.wantOK, merged, "merge sees every success it counts")
			if tc.wantErr {
				require.ErrorIs(t, err, ErrNotEnoughReplicas)
			} else {
				require.NoError(t, err)
			}
			var got []int
			for node := range asked {
				got = append(got, node)
			}
			require.ElementsMatch(t, tc.wantAsked, got)
			require.Equal(t, tc.wantHedged, testutil.ToFloat64(c.m.hedgedReads) == 1)
		})
	}
}

package cluster

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dhtkv/dhtkv/internal/view"
)

// instrumented gives testCoordinator's peers the metrics that finishing
// a read or a write records.
func instrumented(c *Coordinator) *routes {
	r := c.routes.Load()
	for id, p := range r.peers {
		if p != nil {
			url := r.URL(id)
			p.reads, p.writes = c.m.calls(url, "get"), c.m.calls(url, "put")
		}
	}
	return r
}

// answerAtOnce is a remote replica that answers a call as it starts.
func answerAtOnce(_ int, call *view.Call) {
	call.Ended = time.Now()
	call.Done <- call
}

// TestFanOutAllocatesNothing: a request whose replicas all answer before
// it returns reuses its fan, the fan's timer and key buffer, and
// finishes its calls without a closure, so it allocates nothing.
func TestFanOutAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own, and drops sync.Pool's items")
	}
	c := testCoordinator(t, []string{"http://n0:1", "http://n1:1", "http://n2:1"}, 0)
	c.hedgeDelay = time.Hour
	r := instrumented(c)
	key := []byte("key")
	local := func([]byte) answer { return answer{} }
	for _, tc := range []struct {
		name    string
		op      fanOp
		ack     int
		initial int
	}{
		{"read: the local replica and one remote", fanOp{kind: opRead}, 2, 2},
		{"write: every replica", fanOp{kind: opWrite, env: []byte("env")}, 3, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			allocs := testing.AllocsPerRun(200, func() {
				n, err := c.fanOut(r, time.Now().Add(time.Minute), key, []int{0, 1, 2}, nil, tc.ack, 0, tc.initial, tc.op,
					local, answerAtOnce, nil)
				if err != nil || n != tc.ack {
					t.Fatalf("%d answers, %v", n, err)
				}
			})
			require.Zero(t, allocs)
		})
	}
	c.inflight.Wait()
}

// keptHints keeps every hint's key, as a Hints may.
type keptHints struct {
	mu  sync.Mutex
	got [][]byte
}

func (h *keptHints) Add(_ int, key, _ []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.got = append(h.got, key)
}

// TestStragglersHintsKeepTheirKeys: the calls of a write that answered
// without them fail later, on another goroutine, while later writes
// reuse the fans and their key buffers. A hint's key must stay the key
// of its write.
func TestStragglersHintsKeepTheirKeys(t *testing.T) {
	defer goleak.VerifyNone(t)
	c := testCoordinator(t, []string{"http://n0:1", "http://n1:1", "http://n2:1"}, 0)
	hints := &keptHints{}
	c.d.Hints = hints
	r := instrumented(c)
	errDown := errors.New("down")
	var fail sync.WaitGroup
	release := make(chan struct{})
	remote := func(_ int, call *view.Call) {
		fail.Go(func() {
			<-release
			call.Err, call.Ended = errDown, time.Now()
			call.Done <- call
		})
	}
	local := func([]byte) answer { return answer{} }
	const writes = 50
	want := make([]string, 0, 2*writes)
	for i := range writes {
		key := fmt.Sprintf("key-%03d", i)
		n, err := c.fanOut(r, time.Now().Add(time.Minute), []byte(key), []int{0, 1, 2}, nil, 1, 0, 3,
			fanOp{kind: opWrite, env: []byte("env")}, local, remote, nil)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		want = append(want, key, key) // both remote replicas missed it
		if i%10 == 9 {
			close(release) // these stragglers fail, and their fans go back to the pool
			fail.Wait()
			c.inflight.Wait()
			release = make(chan struct{})
		}
	}
	hints.mu.Lock()
	defer hints.mu.Unlock()
	got := make([]string, len(hints.got))
	for i, k := range hints.got {
		got[i] = string(k)
	}
	require.ElementsMatch(t, want, got)
}

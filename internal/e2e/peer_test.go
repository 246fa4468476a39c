package e2e_test

// The peer client's batching: concurrent calls share requests, a call
// queued behind a stuck batch still ends by its own deadline, and Close
// fails what is still queued instead of sending it.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// TestPeerBatchesConcurrentCalls: 64 goroutines writing through one peer
// client with a single connection are served by fewer requests than calls,
// and every write lands.
func TestPeerBatchesConcurrentCalls(t *testing.T) {
	c := testcluster.Start(t, 1)
	reg := prometheus.NewRegistry()
	p := rpc.NewPeer(c.URL(0), rpc.PeerOptions{Timeout: 5 * time.Second, Conns: 1}, rpc.NewMetrics(reg))
	defer p.Close()

	const writers, each = 64, 20
	version := versionAt(time.Now(), 0, 9)
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				key := fmt.Appendf(nil, "w%d-%d", w, i)
				env := (&record.Record{Version: version, Value: key}).Encode()
				newer, err := p.Apply(key, env, 0, time.Now().Add(5*time.Second))
				if err == nil && newer != 0 {
					err = fmt.Errorf("%s refused with %d", key, newer)
				}
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	rec, found, err := p.Get([]byte("w63-19"), 0, time.Now().Add(5*time.Second))
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, "w63-19", string(rec.Value))

	families, err := reg.Gather()
	require.NoError(t, err)
	require.Len(t, families, 1)
	require.Equal(t, "dhtkv_peer_batch_operations", families[0].GetName())
	h := families[0].GetMetric()[0].GetHistogram()
	batches, ops := h.GetSampleCount(), h.GetSampleSum()
	t.Logf("%d calls in %d batches", int(ops), batches)
	require.Equal(t, float64(writers*each+1), ops, "every call was sent once")
	require.Less(t, batches, uint64(writers*each/2), "concurrent calls shared requests")
}

// TestPeerQueuedCallEndsByItsDeadline: with one connection stuck on a
// silent peer, calls queued behind it fail at their own deadline, not
// after the stuck batch's deadline plus their own timeout.
func TestPeerQueuedCallEndsByItsDeadline(t *testing.T) {
	hole := newSilentPeer(t)
	const timeout = 5 * time.Second
	p := rpc.NewPeer(hole.URL(), rpc.PeerOptions{Timeout: timeout, Conns: 1}, nil)
	defer p.Close()
	env := (&record.Record{Version: 1}).Encode()

	// The deadlines leave the queued calls ample time to queue behind the
	// stuck batch, however busy the machine.
	stuck := time.Now().Add(time.Second)
	first := make(chan error, 1)
	go func() {
		_, err := p.Apply([]byte("stuck"), env, 0, stuck)
		first <- err
	}()
	eventually(t, waitFor, "the stuck batch to reach the silent peer", func() bool { return hole.accepted() == 1 })
	deadline := stuck.Add(200 * time.Millisecond)
	type result struct {
		err error
		end time.Time
	}
	results := make(chan result, 8)
	for i := range 8 {
		go func() {
			_, err := p.Apply(fmt.Appendf(nil, "queued-%d", i), env, 0, deadline)
			results <- result{err, time.Now()}
		}()
	}
	for range 8 {
		r := <-results
		require.ErrorIs(t, r.err, rpc.ErrTimeout)
		// Only a loose bound: behind the stuck batch and then on its own,
		// the call would end 5 s after the stuck batch's deadline.
		require.Less(t, r.end.Sub(deadline), timeout/2,
			"ended by its own deadline, not the stuck batch's deadline plus the %v timeout", timeout)
	}
	require.ErrorIs(t, <-first, rpc.ErrTimeout)
}

// TestPeerCloseFailsQueuedCalls: Close while a batch is stuck and others
// wait: the waiting calls fail with an error instead of being sent, and
// Close returns once the stuck batch reached its deadline.
func TestPeerCloseFailsQueuedCalls(t *testing.T) {
	hole := newSilentPeer(t)
	const timeout = 5 * time.Second
	p := rpc.NewPeer(hole.URL(), rpc.PeerOptions{Timeout: timeout, Conns: 1}, nil)
	env := (&record.Record{Version: 1}).Encode()
	// Closed well before this deadline, however busy the machine: the
	// queued calls are still queued when Close comes.
	deadline := time.Now().Add(time.Second)
	results := make(chan error, 5)
	go func() { _, err := p.Apply([]byte("stuck"), env, 0, deadline); results <- err }()
	eventually(t, waitFor, "the stuck batch to reach the silent peer", func() bool { return hole.accepted() == 1 })
	for range 4 {
		go func() { _, err := p.Apply([]byte("queued"), env, 0, time.Now().Add(time.Minute)); results <- err }()
	}
	waitBlocked(t, 5, "github.com/dhtkv/dhtkv/internal/rpc.(*Peer).do") // the stuck call and the 4 queued
	closed := timed(p.Close)
	// Only a loose bound: sending the queued calls would add the 5 s
	// timeout to the stuck batch's deadline.
	require.Less(t, closed, time.Second+timeout/2, "Close waited for more than the stuck batch")
	var timeouts, closedErrs int
	for range 5 {
		err := <-results
		switch {
		case errors.Is(err, rpc.ErrTimeout):
			timeouts++
		case errors.Is(err, rpc.ErrPeerClosed):
			closedErrs++
		default:
			t.Fatalf("unexpected result %v", err)
		}
	}
	require.Equal(t, 1, timeouts, "the stuck batch ends at its deadline")
	require.Equal(t, 4, closedErrs, "the queued calls were not sent")
	_, err := p.Apply([]byte("late"), env, 0, time.Now().Add(time.Second))
	require.ErrorIs(t, err, rpc.ErrPeerClosed, "a closed peer sends nothing")
}

// TestPeerReadsDoNotWaitForWrites: reads and writes go out in separate
// lanes, so a read is answered while a write batch is still waiting at the
// peer (as it does for an fsync), even with one batch in flight per lane.
func TestPeerReadsDoNotWaitForWrites(t *testing.T) {
	received, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	fake := newFakePeer(t, func(ops []rpc.BatchOp) {
		if ops[0].Kind == rpc.OpWrite {
			once.Do(func() { close(received) })
			<-release
		}
	})
	var released sync.Once
	unblock := func() { released.Do(func() { close(release) }) }
	t.Cleanup(unblock) // runs before the fake peer's cleanup waits for its handlers
	p := rpc.NewPeer(fake.URL(), rpc.PeerOptions{Timeout: 5 * time.Second, Conns: 1}, nil)
	defer p.Close()

	written := make(chan error, 1)
	go func() {
		_, err := p.Apply([]byte("slow"), (&record.Record{Version: 1}).Encode(), 0, time.Now().Add(5*time.Second))
		written <- err
	}()
	<-received // the write batch is in flight, held by the peer
	// The peer holds the write until the read has returned, so a read
	// that waited for it would end at its deadline with an error.
	_, found, err := p.Get([]byte("fast"), 0, time.Now().Add(5*time.Second))
	require.NoError(t, err, "the read waited for the held write")
	require.False(t, found)
	select {
	case err := <-written:
		t.Fatalf("the write ended before the peer answered it: %v", err)
	default:
	}
	unblock()
	require.NoError(t, <-written)
}

// TestBatchAnswerBounded: a small batch of many reads of a large value
// does not make the replica build an answer of their sum: past
// rpc.DefaultMaxAnswerBytes the reads are answered "ask again" (the first
// is always answered). Through the peer client, concurrent reads of large
// values all succeed: the client sends those again in the next batch.
func TestBatchAnswerBounded(t *testing.T) {
	c := testcluster.Start(t, 1, func(_ int, cfg *node.Config) { cfg.MaxValueBytes = 2 << 20 })
	cl := newClient(t)
	big := make([]byte, 1<<20)
	require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), "big", big, 0, 0))

	var body []byte
	for range 64 {
		body = rpc.AppendBatchOp(body, rpc.OpRead, []byte("big"), nil)
	}
	code, ans := internalBatch(t, cl, c.URL(0), body, "")
	require.Equal(t, http.StatusOK, code)
	require.Less(t, len(ans), rpc.DefaultMaxAnswerBytes+len(big)+1024, "the answer stops near its limit")
	found, over := 0, 0
	for len(ans) > 0 {
		switch ans[0] {
		case rpc.ResFound:
			n, w := binary.Uvarint(ans[1:])
			ans = ans[1+w+int(n):]
			found++
		case rpc.ResOverLimit:
			ans = ans[1:]
			over++
		default:
			t.Fatalf("result %q", ans[0])
		}
	}
	require.Equal(t, 64, found+over)
	require.Equal(t, rpc.DefaultMaxAnswerBytes/len(big), found, "reads until the answer reached its limit")

	p := rpc.NewPeer(c.URL(0), rpc.PeerOptions{Timeout: 10 * time.Second, Conns: 1}, nil)
	defer p.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Go(func() {
			rec, ok, err := p.Get([]byte("big"), 0, time.Now().Add(10*time.Second))
			if err == nil && (!ok || len(rec.Value) != len(big)) {
				err = fmt.Errorf("found %v, %d bytes", ok, len(rec.Value))
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

package e2e_test

// The peer client's batching: concurrent calls share requests, a call
// queued behind a stuck batch still ends by its own deadline, and Close
// fails what is still queued instead of sending it.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/testcluster"
	"github.com/dhtkv/dhtkv/internal/view"
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
	i := slices.IndexFunc(families, func(f *dto.MetricFamily) bool { return f.GetName() == "dhtkv_peer_batch_operations" })
	require.NotEqual(t, -1, i, "the batch histogram is registered")
	h := families[i].GetMetric()[0].GetHistogram()
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
	testcluster.Eventually(t, testcluster.WaitFor, "the stuck batch to reach the silent peer", func() bool { return hole.accepted() == 1 })
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

// hangingAddr is a 127.0.0.1 address where a connect hangs until its
// timeout, as to a host that drops SYNs: a socket listening with a
// backlog of 0 whose one queued connection is never accepted (Linux drops
// the SYNs of a listener whose accept queue is full). The dialer's error
// is net's "i/o timeout", not fasthttp.ErrDialTimeout.
func hangingAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { syscall.Close(fd) })
	require.NoError(t, syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	require.NoError(t, syscall.Listen(fd, 0))
	sa, err := syscall.Getsockname(fd)
	require.NoError(t, err)
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	filler, err := net.DialTimeout("tcp", addr, 5*time.Second) // fills the accept queue
	require.NoError(t, err)
	t.Cleanup(func() { filler.Close() })
	_, err = net.DialTimeout("tcp", addr, 50*time.Millisecond)
	var ne net.Error
	require.True(t, errors.As(err, &ne) && ne.Timeout(), "a connect to a full accept queue hangs: %v", err)
	return addr
}

// TestPeerCallOutlivesBatchMatesDeadline: a call batched with one whose
// deadline is earlier is not failed at that earlier deadline. A batch
// carries its earliest deadline, and its connect to a peer that does not
// answer SYNs is given what is left of it; when that runs out the later
// call must be sent again with its own deadline. The dial's timeout is
// net's "i/o timeout", which was not taken for a timeout, so the later
// call failed with the batch: a 504 long before --replica-timeout
// (TestCoordinatorSilentPeer's rare failure: on a loaded machine a
// hint's replay, queued behind a stuck batch, had little time left, and
// the connect it was given timed out).
func TestPeerCallOutlivesBatchMatesDeadline(t *testing.T) {
	addr := hangingAddr(t)
	dials := make(chan time.Duration, 16)
	reg := prometheus.NewRegistry()
	p := rpc.NewPeer("http://"+addr, rpc.PeerOptions{
		Timeout: 10 * time.Second, Conns: 1,
		// net's dialer: its timeout is always "i/o timeout". The default,
		// fasthttp.DialTimeout, returns that too when the connect's
		// deadline fires before its context's (they race), else
		// fasthttp.ErrDialTimeout.
		Dial: func(a string, left time.Duration) (net.Conn, error) {
			dials <- left
			return (&net.Dialer{Timeout: left}).Dial("tcp", a)
		},
	}, rpc.NewMetrics(reg))
	defer p.Close()
	env := (&record.Record{Version: 1}).Encode()
	type result struct {
		err error
		end time.Time
	}
	apply := func(key string, deadline time.Time) chan result {
		r := make(chan result, 1)
		go func() {
			_, err := p.Apply([]byte(key), env, 0, deadline)
			r <- result{err, time.Now()}
		}()
		return r
	}

	// A first batch holds the lane's one sender in its connect for a
	// second; the two calls queue behind it meanwhile and go out together
	// after it: the batch-mate's deadline 300 ms later, the call's 2 s.
	start := time.Now()
	first := apply("first", start.Add(time.Second))
	<-dials
	mate := apply("batch-mate", start.Add(1300*time.Millisecond))
	later := start.Add(3 * time.Second)
	call := apply("call", later)

	f, m, r := <-first, <-mate, <-call
	t.Logf("the call ended %v after its deadline: %v", r.end.Sub(later).Round(time.Millisecond), r.err)
	require.False(t, r.end.Before(later), "the call failed %v before its deadline: %v", later.Sub(r.end), r.err)
	for _, res := range []result{f, m, r} {
		require.ErrorIs(t, res.err, rpc.ErrTimeout, "a connect that timed out is a timeout")
	}

	// The premise: the two calls shared a batch (sizes 1, 2, then the
	// call alone again).
	families, err := reg.Gather()
	require.NoError(t, err)
	h := families[0].GetMetric()[0].GetHistogram()
	require.Equal(t, uint64(1), h.GetBucket()[1].GetCumulativeCount()-h.GetBucket()[0].GetCumulativeCount(),
		"one batch of two: the calls were sent together")
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
	testcluster.Eventually(t, testcluster.WaitFor, "the stuck batch to reach the silent peer", func() bool { return hole.accepted() == 1 })
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
	cl := testcluster.NewClient(t)
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

// TestPeerGoFinishesOnDone: calls started with Go, writes and reads of
// present and absent keys, come back on the one channel given, each once,
// with Get's and Apply's outcomes; calls started on a closed peer come back
// at once, failed.
func TestPeerGoFinishesOnDone(t *testing.T) {
	c := testcluster.Start(t, 1)
	p := rpc.NewPeer(c.URL(0), rpc.PeerOptions{Timeout: 5 * time.Second}, nil)
	version := versionAt(time.Now(), 0, 9)
	const n = 50
	done := make(chan *view.Call, 2*n)
	calls := make([]view.Call, 2*n)
	deadline := time.Now().Add(5 * time.Second)
	for i := range n {
		key := fmt.Appendf(nil, "go-%d", i)
		calls[i] = view.Call{Key: key, Env: (&record.Record{Version: version, Value: key}).Encode(), Deadline: deadline, Tag: i, Done: done}
		p.Go(&calls[i])
	}
	for range n {
		call := <-done
		require.NoError(t, call.Err, "write %d", call.Tag)
		require.Zero(t, call.Newer)
		require.False(t, call.Ended.IsZero())
	}
	for i := range n {
		key := fmt.Appendf(nil, "go-%d", i)
		if i%2 == 1 {
			key = fmt.Appendf(nil, "absent-%d", i)
		}
		calls[n+i] = view.Call{Key: key, Deadline: deadline, Tag: n + i, Done: done}
		p.Go(&calls[n+i])
	}
	for range n {
		call := <-done
		require.NoError(t, call.Err, "read %d", call.Tag)
		i := call.Tag - n
		require.Equal(t, i%2 == 0, call.Found, "read %d", i)
		if call.Found {
			require.Equal(t, fmt.Sprintf("go-%d", i), string(call.Rec.Value))
			require.Equal(t, version, call.Rec.Version)
		}
	}
	require.Empty(t, done, "every call came back once")

	// A peer that holds a newer version answers the write with it.
	older := view.Call{Key: []byte("go-0"), Env: (&record.Record{Version: version - 1<<22}).Encode(), Deadline: deadline, Done: done}
	p.Go(&older)
	require.Equal(t, version, (<-done).Newer)

	p.Close()
	late := view.Call{Key: []byte("late"), Deadline: deadline, Done: done}
	p.Go(&late)
	require.ErrorIs(t, (<-done).Err, rpc.ErrPeerClosed)
}

package e2e_test

// Coordinator behaviour with slow, dead and restarted peers: it answers as
// soon as ack replicas did (or ack became impossible), stragglers finish in
// the background, and nothing outlives the nodes.

import (
	"fmt"
	"math"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/leakcheck"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// silentPeer accepts connections on addr and never answers: the worst kind
// of peer, one that is up at the TCP level but stuck.
type silentPeer struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	done  chan struct{}
}

// newSilentPeer listens on a fresh 127.0.0.1 port.
func newSilentPeer(t testing.TB) *silentPeer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &silentPeer{ln: ln, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
		}
	}()
	t.Cleanup(s.Close)
	return s
}

func (s *silentPeer) URL() string { return "http://" + s.ln.Addr().String() }

func (s *silentPeer) Close() {
	s.ln.Close()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.Close()
	}
	s.conns = nil
}

func (s *silentPeer) accepted() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

const replicaTimeout = 400 * time.Millisecond

// requireTimedOut checks that a request answered 504 because of the replica
// timeout: not before it, and not after some much longer wait (the
// client's 10 s timeout, an OS connect timeout). The upper bound is
// deliberately loose: on a busy machine the answer may come late.
func requireTimedOut(t *testing.T, d time.Duration, what string) {
	t.Helper()
	t.Logf("%-55s %v", what, d.Round(time.Millisecond))
	require.GreaterOrEqual(t, d, replicaTimeout*9/10, "%s answered before the replica timeout", what)
	require.Less(t, d, replicaTimeout+3*time.Second, "%s took much longer than the replica timeout", what)
}

// TestCoordinatorSilentPeer: node 2 of three is a listener that accepts and
// never answers. The first request that needs it, ack=2&from=2, answers
// 504 after about the replica timeout, and the peer turns silent
// (package rpc, silent.go). From then on its calls fail at once: with
// ack=1&from=2 the coordinator answers as soon as the live replica did,
// whether that replica is local (key on nodes {0,2}) or remote (key on
// {1,2}, coordinator 0 not among them); with ack=2 it answers 504 at once, naming the silent peer;
// and only the pings that ask whether it answers again reach it.
func TestCoordinatorSilentPeer(t *testing.T) {
	hole := newSilentPeer(t)
	c := testcluster.Start(t, 2, withReplicaTimeout(replicaTimeout), withExtraMembers(hole.URL()))
	cl := testcluster.NewClient(t)
	p := placementOf(t, c)
	silent := func() float64 { return c.Metric(t, 0, "dhtkv_peer_silent", "peer", hole.URL()) }
	// Once the peer is silent its call fails first, and the request may
	// fail before the other replica answered.
	failed := regexp.MustCompile(`^not enough replicas: [01] of 2 answered, 2 needed; failed: ` + regexp.QuoteMeta(hole.URL()) +
		` \(silent\)(, \S+ \(no answer yet when ack was out of reach\))?\n$`)

	key := findKey(t, p, "silent-first", 0, 2)
	var code int
	var body []byte
	d := timed(func() { code = cl.Put(t, c.URL(0), key, []byte("v"), 2, 2) })
	requireTimedOut(t, d, "the first PUT ack=2 from=2")
	require.Equal(t, http.StatusGatewayTimeout, code)
	require.Equal(t, 1.0, silent(), "a batch unanswered for the replica timeout makes the peer silent")

	// Without a clock: a request that fails at once against one that waits
	// 400 ms is told apart by far looser bounds than a busy machine needs.
	// (A write with ack=2 may also wait for a probe round to renew the
	// clock lease, whose ping to the silent peer waits out the timeout:
	// only its answer is checked.)
	failsFast := func(d time.Duration, what string) {
		t.Helper()
		t.Logf("%-55s %v", what, d.Round(time.Millisecond))
		require.Less(t, d, replicaTimeout*3/4, "%s waited for the silent peer", what)
	}
	batches := func() float64 { return c.Metric(t, 0, "dhtkv_peer_batch_operations", "peer", hole.URL()) }
	sent := batches()
	for _, set := range [][]int{{0, 2}, {2, 0}, {1, 2}, {2, 1}} {
		key := findKey(t, p, "silent", set...)
		name := fmt.Sprintf("replicas %v", set)
		failsFast(timed(func() { code = cl.Put(t, c.URL(0), key, []byte("v"), 1, 2) }), name+": PUT ack=1 from=2")
		require.Equal(t, http.StatusCreated, code, name)
		failsFast(timed(func() { code, body = cl.Get(t, c.URL(0), key, 1, 2) }), name+": GET ack=1 from=2")
		require.Equal(t, http.StatusOK, code, name)
		require.Equal(t, "v", string(body), name)

		require.Equal(t, http.StatusGatewayTimeout, cl.Put(t, c.URL(0), key, []byte("v2"), 2, 2), name)
		failsFast(timed(func() { code, body = cl.Get(t, c.URL(0), key, 2, 2) }), name+": GET ack=2 from=2")
		require.Equal(t, http.StatusGatewayTimeout, code)
		require.Regexp(t, failed, string(body))
		require.Equal(t, http.StatusGatewayTimeout, cl.Delete(t, c.URL(0), key, 2, 2), name)
	}
	require.Equal(t, sent, batches(), "no batch was sent to the silent peer")
	require.Positive(t, c.Metric(t, 0, "dhtkv_replica_failures_total", "peer", hole.URL(), "reason", "silent"))
	require.Equal(t, 1.0, silent(), "still silent")
	require.Positive(t, c.Metric(t, 0, "dhtkv_peer_calls_failed_fast_total", "peer", hole.URL()))
}

// TestCoordinatorRefusedPeer: a member nobody listens on refuses the
// connection, which fails the replica call at once: ack=2 gets its 504
// without waiting for the replica timeout.
func TestCoordinatorRefusedPeer(t *testing.T) {
	// A long replica timeout, so that failing at once and failing at the
	// timeout are far apart: the bound below is a few seconds, which a
	// busy machine does not reach.
	const timeout = 10 * time.Second
	failsFast := func(d time.Duration, what string) {
		t.Helper()
		t.Logf("%-55s %v", what, d.Round(time.Millisecond))
		require.Less(t, d, timeout/3, "%s waited for the %v replica timeout", what, timeout)
	}
	nobody := fmt.Sprintf("http://127.0.0.1:%d", testcluster.FreePorts(t, 1)[0])
	c := testcluster.Start(t, 2, withReplicaTimeout(timeout), withExtraMembers(nobody))
	cl := testcluster.NewClient(t)
	p := placementOf(t, c)
	for _, set := range [][]int{{0, 2}, {1, 2}} {
		key := findKey(t, p, "refused", set...)
		name := fmt.Sprintf("replicas %v", set)
		var code int
		failsFast(timed(func() { code = cl.Put(t, c.URL(0), key, []byte("v"), 2, 2) }), name+": PUT ack=2 from=2")
		require.Equal(t, http.StatusGatewayTimeout, code)
		failsFast(timed(func() { code, _ = cl.Get(t, c.URL(0), key, 2, 2) }), name+": GET ack=2 from=2")
		require.Equal(t, http.StatusGatewayTimeout, code)
		failsFast(timed(func() { code = cl.Delete(t, c.URL(0), key, 2, 2) }), name+": DELETE ack=2 from=2")
		require.Equal(t, http.StatusGatewayTimeout, code)
		failsFast(timed(func() { code = cl.Put(t, c.URL(0), key, []byte("v"), 1, 2) }), name+": PUT ack=1 from=2")
		require.Equal(t, http.StatusCreated, code)
	}
}

// TestCoordinatorNoGoroutineLeak runs requests that leave stragglers behind
// (a silent peer, ack=1) and requests that time out, stops the cluster, and
// checks that no goroutine started by the nodes survives: fasthttp servers,
// the coordinator's replica calls, ristretto and Pebble all stop on
// Shutdown.
func TestCoordinatorNoGoroutineLeak(t *testing.T) {
	// Registered first, so it runs last: after the cluster has stopped and
	// the test's own HTTP client has closed its connections.
	leakcheck.Register(t)
	hole := newSilentPeer(t)
	c := testcluster.Start(t, 3, withReplicaTimeout(replicaTimeout), withExtraMembers(hole.URL()))
	cl := testcluster.NewClient(t)
	p := placementOf(t, c)
	for i := range 20 {
		key := findKeySet(t, p, "leak-"+strconv.Itoa(i), 0, 1, 2) // the real nodes
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(i%3), key, []byte("v"), 2, 3))
		code, _ := cl.Get(t, c.URL((i+1)%3), key, 3, 3)
		require.Equal(t, http.StatusOK, code)
	}
	key := findKey(t, p, "leak-silent", 1, 3) // node 3 is the silent peer
	for range 5 {
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), key, []byte("v"), 1, 2))
	}
	require.Equal(t, http.StatusGatewayTimeout, cl.Put(t, c.URL(0), key, []byte("v"), 2, 2))
	// Stop while the ack=1 stragglers may still be waiting on the silent
	// peer: Shutdown waits for them.
	c.StopAll()
	cl.HTTP.CloseIdleConnections()
}

// TestCoordinatorPeerRestart: after a peer restarts, the coordinator's
// pooled keep-alive connections to it are dead. The next request over one
// must not count as a replica failure: the peer is up and answers.
//
// FAILS: the first PUT after the restart gets 504 ("the server closed
// connection before returning the first response byte"), see the report.
func TestCoordinatorPeerRestart(t *testing.T) {
	c := testcluster.Start(t, 2)
	cl := testcluster.NewClient(t)
	for i := range 3 {
		key := "restart-" + strconv.Itoa(i)
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), key, []byte("v"), 2, 2), "before restart %d", i)
		c.StopNode(1)
		c.StartNode(1)
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), key, []byte("v2"), 2, 2),
			"PUT 2/2 right after node 1 restarted (round %d): both nodes are up", i)
		expectValue(t, cl, c.URL(0), key, 2, 2, "v2")
	}
}

// TestNodeShutdownClosesPeerConnections: a stopped node must not keep its
// pooled connections to other nodes open. Node 1 is a fake peer that
// acknowledges every write; after node 0 shuts down, the fake
// must see its connections closed (without Peer.Close they stay open until
// fasthttp's idle timeout, 30s).
func TestNodeShutdownClosesPeerConnections(t *testing.T) {
	fake := newFakePeer(t, nil)
	c := testcluster.Start(t, 1, withExtraMembers(fake.URL()))
	cl := testcluster.NewClient(t)
	p := placementOf(t, c)
	for i := range 5 {
		key := findKey(t, p, "shutdown-"+strconv.Itoa(i), 0, 1)
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), key, []byte("v"), 2, 2))
	}
	open, served := fake.state()
	require.Equal(t, 5, served)
	require.Positive(t, open)
	c.StopNode(0)
	// Well before fasthttp's 30 s idle timeout would close them.
	testcluster.Eventually(t, testcluster.WaitFor, "node 0, stopped, to close its connections to its peer", func() bool {
		open, _ = fake.state()
		return open == 0
	})
}

// TestCoordinatorReadHedging: a GET asks its first ack replicas only; when
// one of them is silent, the spare is asked after --read-hedge-delay, not
// after the replica timeout. With the delay set to 0 every GET asks all
// `from` replicas at once.
func TestCoordinatorReadHedging(t *testing.T) {
	for _, delay := range []time.Duration{20 * time.Millisecond, 0} {
		t.Run(fmt.Sprintf("delay=%v", delay), func(t *testing.T) {
			// Each case has a cluster of its own and spends most of its
			// time waiting out the silent peer's timeouts (the nodes'
			// start-up pings and stops): the two overlap.
			t.Parallel()
			hole := newSilentPeer(t)
			// The first call to the silent peer (the PUT's) makes it silent
			// when its timeout ends, and calls fail at once from then on
			// (TestCoordinatorSilentPeer): a long timeout keeps the reads
			// below within it, however busy the machine.
			c := testcluster.Start(t, 2, withReplicaTimeout(2*time.Second), withExtraMembers(hole.URL()),
				func(_ int, cfg *node.Config) { cfg.Coordinator.HedgeDelay = delay })
			cl := testcluster.NewClient(t)
			p := placementOf(t, c)

			key := findKey(t, p, "hedge", 2, 1) // silent peer first, coordinator 0 not a replica
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), key, []byte("v"), 1, 2))
			hedged, stragglers := c.Metric(t, 0, "dhtkv_coordinator_hedged_reads_total"), c.Metric(t, 0, "dhtkv_coordinator_stragglers_total")
			var code int
			d := timed(func() { code, _ = cl.Get(t, c.URL(0), key, 1, 2) })
			require.Equal(t, http.StatusOK, code)
			require.GreaterOrEqual(t, d, delay, "the spare is asked only after the hedge delay")
			if delay > 0 {
				require.Equal(t, 1.0, c.Metric(t, 0, "dhtkv_coordinator_hedged_reads_total")-hedged)
			}
			// The silent call runs until the replica timeout: a straggler
			// means the read answered before it.
			require.Equal(t, 1.0, c.Metric(t, 0, "dhtkv_coordinator_stragglers_total")-stragglers,
				"the read answered while the silent call still ran")

			// A live first replica answers alone: no spare is asked.
			key = findKey(t, p, "hedge-live", 1, 2)
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), key, []byte("v"), 1, 2))
			hedged, stragglers = c.Metric(t, 0, "dhtkv_coordinator_hedged_reads_total"), c.Metric(t, 0, "dhtkv_coordinator_stragglers_total")
			code, _ = cl.Get(t, c.URL(0), key, 1, 2)
			require.Equal(t, http.StatusOK, code)
			// The silent peer is asked only when the read hedges (which a
			// slow moment can cause even at 20 ms), or at once with delay 0.
			want := c.Metric(t, 0, "dhtkv_coordinator_hedged_reads_total") - hedged
			if delay == 0 {
				want = 1 // all at once: the silent peer was asked too
			}
			require.Equal(t, want, c.Metric(t, 0, "dhtkv_coordinator_stragglers_total")-stragglers)
		})
	}
}

// TestCoordinatorHedgeDelayFollowsLatency: when every peer answers reads
// slowly (here in 25 ms, one read in ten in 100 ms), the hedge delay rises
// from --read-hedge-delay (5 ms) to their 95th percentile, so reads stop
// being hedged: a fixed 5 ms delay would hedge every one of them, doubling
// the load on peers that are slow already.
//
// The test does not depend on how busy the machine is. The second phase
// starts only once the node reports a hedge delay of at least the peers'
// latency, which it does only when a latency window is full. Each reader
// has its own connection, so a read's latency is the peer's and not its
// place in a queue of batches, and one read in ten is much slower than the
// rest: the 95th percentile lies among those slow reads, so a read the
// scheduler delays by a few milliseconds beyond its measured latency
// hedges only if it is one of them, and nine reads in ten stay 75 ms
// below the delay. Following the percentile hedges about one read in
// twenty; the bound, half of the reads, is still far below the fixed
// delay's every read.
func TestCoordinatorHedgeDelayFollowsLatency(t *testing.T) {
	const (
		slow    = 25 * time.Millisecond
		slower  = 4 * slow // one read in ten
		readers = 8
		n       = 320 // reads per phase
	)
	slowPeer := func() *fakePeer {
		var reads atomic.Int64
		return newFakePeer(t, func(ops []rpc.BatchOp) {
			if ops[0].Kind != rpc.OpRead {
				return
			}
			// The behaviour under test: a peer that answers reads slowly.
			if reads.Add(1)%10 == 0 {
				time.Sleep(slower)
			} else {
				time.Sleep(slow)
			}
		})
	}
	fake1, fake2 := slowPeer(), slowPeer()
	conns := func(_ int, cfg *node.Config) { cfg.PeerConns = readers }
	c := testcluster.Start(t, 1, withReplicaTimeout(2*time.Second), withExtraMembers(fake1.URL(), fake2.URL()), conns)
	cl := testcluster.NewClient(t)
	p := placementOf(t, c)
	key := findKey(t, p, "hedge-adapt", 1, 2) // the coordinator is not a replica

	hedgeDelay := func() time.Duration {
		s := c.Metric(t, 0, "dhtkv_coordinator_read_hedge_delay_seconds")
		return time.Duration(math.Round(s * float64(time.Second)))
	}
	reads := func(n int) (hedged float64) {
		before := c.Metric(t, 0, "dhtkv_coordinator_hedged_reads_total")
		var wg sync.WaitGroup
		for range readers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range n / readers {
					code, _ := cl.Get(t, c.URL(0), key, 1, 2)
					require.Equal(t, http.StatusNotFound, code)
				}
			}()
		}
		wg.Wait()
		return c.Metric(t, 0, "dhtkv_coordinator_hedged_reads_total") - before
	}

	require.Equal(t, 5*time.Millisecond, hedgeDelay(), "no latency measured yet: --read-hedge-delay")
	// No window is full before 256 reads have ended, so at least that
	// many start with the 5 ms delay and hedge.
	first := reads(n)
	// A window older than a second no longer counts: reads go on until the
	// node reports the adapted delay. Every read takes at least 25 ms, so
	// any percentile of them does too.
	for warm := 0; hedgeDelay() < slow; warm += 64 {
		require.Less(t, warm, 4*n, "the hedge delay stayed at %v while every read took at least %v", hedgeDelay(), slow)
		reads(64)
	}
	adapted := hedgeDelay()
	later := reads(n)
	t.Logf("hedged: %v of the first %d reads, then at a hedge delay of %v %v of the next %d", first, n, adapted, later, n)
	require.Greater(t, first, float64(n)/2, "at 5 ms, reads of 25 ms peers hedge")
	require.Less(t, later, float64(n)/2,
		"once measured, the delay follows the peers' latency: a fixed 5 ms delay hedges all %d reads, the 95th percentile about one in twenty", n)
}

// TestNotEnoughReplicasNamesThem: a 504 says how many replicas answered,
// how many were needed, and which failed and why.
func TestNotEnoughReplicasNamesThem(t *testing.T) {
	c := testcluster.Start(t, 3)
	cl := testcluster.NewClient(t)
	require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), "k", []byte("v"), 3, 3))
	c.StopNode(2)
	code, body := cl.Get(t, c.URL(0), "k", 3, 3)
	require.Equal(t, http.StatusGatewayTimeout, code)
	// The request gives up as soon as ack is out of reach: a replica
	// still working on it is named as such.
	require.Regexp(t, `^not enough replicas: [12] of 3 answered, 3 needed; failed: `, string(body))
	require.Contains(t, string(body), c.URL(2)+" (")
	require.Contains(t, string(body), "connection refused")
	code, body = cl.Do(t, http.MethodPut, testcluster.EntityURL(c.URL(1), "k", 3, 3), []byte("w"))
	require.Equal(t, http.StatusGatewayTimeout, code)
	require.Regexp(t, `^not enough replicas: [12] of 3 answered, 3 needed; failed: `, string(body))
	require.Contains(t, string(body), c.URL(2)+" (")
}

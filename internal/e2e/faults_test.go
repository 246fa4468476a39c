package e2e_test

// Fault scenarios: real nodes whose links to each other run through
// faultnet proxies (testcluster.StartLinked), clients recording what they
// saw (package history), and the checker over the history.

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/cluster"
	"github.com/dhtkv/dhtkv/internal/history"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// do sends one request; a transport error (the node is down, the
// connection broke) is status 0 with the error, never a test failure: the
// fault tests expect them. Safe from any goroutine.
func do(cl *testcluster.Client, method, u string, body []byte) (int, []byte, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, u, r)
	if err != nil {
		return 0, nil, err
	}
	resp, err := cl.HTTP.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, err
	}
	return resp.StatusCode, b, nil
}

// put records one PUT: 201 is OK, 4xx failed, anything else unknown (a
// 504 or a broken connection may have left the write on some replicas).
func put(rec *history.Recorder, cl *testcluster.Client, base, client, key, value string, ack, from int) int {
	p := rec.Write(client, key, value)
	code, _, err := do(cl, http.MethodPut, testcluster.EntityURL(base, key, ack, from), []byte(value))
	settle(p, http.StatusCreated, code, err)
	return code
}

// settle records the outcome of a write answered code, which ok
// acknowledges: a 4xx failed it, anything else leaves it in doubt.
func settle(p *history.Pending, ok, code int, err error) {
	switch {
	case code == ok:
		p.OK()
	case code >= 400 && code < 500:
		p.Fail(fmt.Errorf("status %d", code))
	default:
		p.Unknown(fmt.Errorf("status %d: %v", code, err))
	}
}

// del records one DELETE (202 when acknowledged), as put records a PUT.
func del(rec *history.Recorder, cl *testcluster.Client, base, client, key string, ack, from int) int {
	p := rec.Delete(client, key)
	code, _, err := do(cl, http.MethodDelete, testcluster.EntityURL(base, key, ack, from), nil)
	settle(p, http.StatusAccepted, code, err)
	return code
}

// get records one GET.
func get(rec *history.Recorder, cl *testcluster.Client, base, client, key string, ack, from int) int {
	p := rec.Read(client, key)
	code, body, err := do(cl, http.MethodGet, testcluster.EntityURL(base, key, ack, from), nil)
	switch code {
	case http.StatusOK:
		p.Found(string(body))
	case http.StatusNotFound:
		p.NotFound()
	default:
		p.Unknown(fmt.Errorf("status %d: %v", code, err))
	}
	return code
}

// checkHistory fails t with every violation of the read rules.
func checkHistory(t *testing.T, rec *history.Recorder) {
	t.Helper()
	ops := rec.History().Ops
	reads, err := history.CheckReads(ops)
	require.NoError(t, err)
	mono, err := history.CheckMonotonic(ops)
	require.NoError(t, err)
	for _, v := range append(reads, mono...) {
		t.Error(v)
	}
}

// replicaDumps reads key's stored record on every node.
func replicaDumps(t *testing.T, c *testcluster.Cluster, cl *testcluster.Client, keys ...string) map[string]map[string][]byte {
	t.Helper()
	dumps := map[string]map[string][]byte{}
	for i := range c.Size() {
		d := map[string][]byte{}
		for _, k := range keys {
			if code, r := internalGet(t, cl, c.URL(i), k, ""); code == http.StatusOK {
				d[k] = r.Encode()
			}
		}
		dumps[c.URL(i)] = d
	}
	return dumps
}

// TestFaultFailedWriteThenHeal is a history whose reads flip forever if
// a restart moves a clock ahead (W1 then outranks W2): W0 via A is
// acknowledged; C restarts, verifies its clock and is cut off; W1 via C
// fails (504: within its clock lease) but C
// stored it; W2 via A is acknowledged after W1 returned; the partition
// heals. Every quorum read after that returns W2, reads are monotonic,
// and one read with ack=3 leaves all replicas identical.
func TestFaultFailedWriteThenHeal(t *testing.T) {
	c := testcluster.StartLinked(t, 3)
	cl := testcluster.NewClient(t)
	rec := history.NewRecorder()
	rec.KeepOnFailure(t, "")
	const key = "flip"
	const a, cNode = 0, 2

	require.Equal(t, http.StatusCreated, put(rec, cl, c.URL(a), "writer", key, "W0", 2, 3))
	c.StopNode(cNode)
	c.StartNode(cNode)
	// C coordinates writes with ack=2 only with its clock verified by a
	// majority: let it verify, then cut it off within the lease.
	testcluster.Eventually(t, testcluster.WaitFor, "C's clock verified", func() bool {
		return c.Metric(t, cNode, "dhtkv_clock_verified") == 1
	})
	c.Isolate(cNode)
	require.Equal(t, http.StatusGatewayTimeout, put(rec, cl, c.URL(cNode), "writer", key, "W1", 2, 3))
	require.Equal(t, http.StatusCreated, put(rec, cl, c.URL(a), "writer", key, "W2", 2, 3))
	c.Heal()

	r := rand.New(rand.NewPCG(1, 2))
	for i := range 36 {
		code := get(rec, cl, c.URL(r.IntN(3)), fmt.Sprintf("reader%d", i%3), key, 2, 3)
		require.Equal(t, http.StatusOK, code)
	}
	checkHistory(t, rec)
	require.Equal(t, http.StatusOK, get(rec, cl, c.URL(cNode), "final", key, 3, 3))
	for _, v := range history.CheckReplicas(replicaDumps(t, c, cl, key)) {
		t.Error(v)
	}
	code, w := internalGet(t, cl, c.URL(cNode), key, "")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "W2", string(w.Value))
}

// TestFaultClockSkew: with one node's clock 30 s off (ahead, then behind)
// in a cluster of three, that node refuses to coordinate writes (503 with
// the reason, and its status says so), the two others go on, nothing the
// skewed node wrote before it noticed wins over later writes, and reads
// stay correct through every node.
func TestFaultClockSkew(t *testing.T) {
	for _, off := range []time.Duration{30 * time.Second, -30 * time.Second} {
		t.Run(off.String(), func(t *testing.T) {
			c := testcluster.Start(t, 3, func(i int, cfg *node.Config) {
				if i == 2 {
					cfg.ClockOffset = off
				}
			})
			cl := testcluster.NewClient(t)
			rec := history.NewRecorder()
			rec.KeepOnFailure(t, "")
			testcluster.Eventually(t, 10*time.Second, "the skewed node notices", func() bool {
				code, body := cl.Do(t, http.MethodGet, c.URL(2)+"/v0/status", nil)
				return code == http.StatusOK && strings.Contains(string(body), "refusing to coordinate writes")
			})
			code, body := cl.Do(t, http.MethodPut, testcluster.EntityURL(c.URL(2), "k", 2, 3), []byte("x"))
			require.Equal(t, http.StatusServiceUnavailable, code)
			require.Contains(t, string(body), "max-clock-skew")
			for i := range 20 {
				key := fmt.Sprintf("k%d", i%4)
				require.Equal(t, http.StatusCreated, put(rec, cl, c.URL(i%2), "w"+key, key, fmt.Sprint(i), 2, 3))
				for n := range 3 {
					require.Equal(t, http.StatusOK, get(rec, cl, c.URL(n), fmt.Sprintf("r%d", n), key, 2, 3))
				}
			}
			checkHistory(t, rec)
			for _, n := range []int{0, 1} {
				// No clock warning (a no-quorum one may still stand: the
				// probe's round at start found the later nodes down).
				_, body := cl.Do(t, http.MethodGet, c.URL(n)+"/v0/status", nil)
				require.True(t, strings.HasPrefix(string(body), "OK\n"), "node %d: %s", n, body)
				require.NotContains(t, string(body), "clock", "node %d is not the one off", n)
			}
		})
	}
}

// TestFaultKillUnderLoad: three processes with --sync=true; writers (one
// per key, unique values) and readers run through every node while one
// node is SIGKILLed and restarted twice. The history has no stale and no
// non-monotonic read; after the load, one anti-entropy round (each node
// compares with its peers in turn) leaves every replica of every key
// identical with no client read, and every acknowledged write in place.
//
// In the "anti-entropy only" run there are no client reads, no read repair
// and no hints: the round alone brings back what the killed node missed.
func TestFaultKillUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("SIGKILLs nodes of the binary under load: a process test; runs without -short")
	}
	longFault(t) // make test: TestProcessClusterSurvivesSIGKILL
	t.Run("all mechanisms", func(t *testing.T) { killUnderLoad(t, 3, 8) })
	t.Run("anti-entropy only", func(t *testing.T) {
		killUnderLoad(t, 1, 500, "--read-repair=off", "--hint-max-bytes=1")
	})
}

// killUnderLoad runs TestFaultKillUnderLoad with one operation in every
// oneIn a write (1: writes only; a quarter of the writes are deletes),
// keysPerWriter keys for each of the writers, and the extra flags.
func killUnderLoad(t *testing.T, oneIn, keysPerWriter int, flags ...string) {
	pc := startProcCluster(t, 3, append([]string{"--sync=true", "--replica-timeout", "300ms"}, flags...)...)
	cl := testcluster.NewClient(t)
	rec := history.NewRecorder()
	rec.KeepOnFailure(t, "")
	const writers = 4
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("w%d-k%d", w, r.IntN(keysPerWriter))
				via := pc.urls[r.IntN(3)]
				switch {
				case r.IntN(oneIn) != 0:
					get(rec, cl, via, fmt.Sprintf("reader%d", w), key, 2, 3)
				case r.IntN(4) == 0: // a quarter of the writes delete
					del(rec, cl, via, fmt.Sprintf("writer%d", w), key, 2, 3)
				default:
					put(rec, cl, via, fmt.Sprintf("writer%d", w), key, fmt.Sprintf("%s-v%d", key, n), 2, 3)
				}
			}
		})
	}
	for range 2 {
		waitOps(t, rec, 200)
		pc.kill(1)
		waitOps(t, rec, 200)
		pc.start(1)
	}
	waitOps(t, rec, 200)
	close(stop)
	wg.Wait()
	t.Logf("%d operations recorded", len(rec.History().Ops))

	checkHistory(t, rec)
	var keys []string
	for w := range writers {
		for k := range keysPerWriter {
			keys = append(keys, fmt.Sprintf("w%d-k%d", w, k))
		}
	}
	testcluster.Eventually(t, 20*time.Second, "hints delivered", func() bool { // then anti-entropy is what remains
		return pc.metric(0, "dhtkv_hints_pending_bytes")+pc.metric(1, "dhtkv_hints_pending_bytes")+pc.metric(2, "dhtkv_hints_pending_bytes") == 0
	})
	repaired := 0
	for i := range pc.urls {
		for _, st := range pc.repair(i) {
			t.Logf("node %d with %s: %d partitions differing, %d keys pulled, %d pushed", i, st.Peer, st.PartitionsDiffering, st.Pulled, st.Pushed)
			repaired += st.Pulled + st.Pushed
		}
	}
	if oneIn == 1 {
		require.Positive(t, repaired, "with nothing else to repair them, the killed node missed writes")
	}
	dumps := map[string]map[string][]byte{}
	for i, u := range pc.urls {
		d := map[string][]byte{}
		for _, k := range keys {
			if code, r := internalGet(t, cl, u, k, ""); code == http.StatusOK {
				d[k] = r.Encode()
			}
		}
		dumps[fmt.Sprint(i)] = d
	}
	for _, v := range history.CheckReplicas(dumps) {
		t.Error(v)
	}
	final := map[string]history.Final{}
	for _, key := range keys {
		code, body := cl.Get(t, pc.urls[0], key, 3, 3)
		require.Contains(t, []int{http.StatusOK, http.StatusNotFound}, code, key)
		final[key] = history.Final{Found: code == http.StatusOK, Value: string(body)}
	}
	violations, err := history.CheckFinal(rec.History().Ops, final)
	require.NoError(t, err)
	for _, v := range violations {
		t.Error(v)
	}
}

// waitOps waits until the history holds n more completed operations.
func waitOps(t *testing.T, rec *history.Recorder, n int) {
	t.Helper()
	target := len(rec.History().Ops) + n
	testcluster.Eventually(t, 60*time.Second, "client operations", func() bool { return len(rec.History().Ops) >= target })
}

// TestFaultBlackholeThenRestore: one node's incoming links swallow every
// byte (a host that is up but never answers). Quorum writes through the
// two others are still acknowledged, and a write that needs the silent
// node fails by the replica timeout, not twice it; its missed writes are
// hinted and delivered once the links are restored, with no client read.
// Then the links to it are slowed instead: writes still succeed.
func TestFaultBlackholeThenRestore(t *testing.T) {
	const timeout = time.Second
	c := testcluster.StartLinked(t, 3, withReplicaTimeout(timeout), func(_ int, cfg *node.Config) {
		cfg.Handoff.Interval = 50 * time.Millisecond
		cfg.Coordinator.ReadRepair = cluster.RepairOff // only hints may repair node 2
	})
	cl := testcluster.NewClient(t)
	for _, from := range []int{0, 1} {
		c.Link(from, 2).Blackhole()
	}
	const n = 50
	for i := range n {
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(i%2), fmt.Sprintf("bh%d", i), []byte("v"), 2, 3))
	}
	start := time.Now()
	code, _, err := do(cl, http.MethodPut, testcluster.EntityURL(c.URL(0), "needs-all", 3, 3), []byte("v"))
	elapsed := time.Since(start)
	require.NoError(t, err)
	require.Equal(t, http.StatusGatewayTimeout, code)
	require.Less(t, elapsed, timeout*17/10, "a 504 takes about the replica timeout, not twice it")
	testcluster.Eventually(t, 10*time.Second, "every missed write hinted", func() bool {
		return c.Metric(t, 0, "dhtkv_hints_stored_total")+c.Metric(t, 1, "dhtkv_hints_stored_total") >= n
	})

	c.Heal()
	testcluster.Eventually(t, 20*time.Second, "hints delivered", func() bool {
		return c.Metric(t, 0, "dhtkv_hints_pending_bytes")+c.Metric(t, 1, "dhtkv_hints_pending_bytes") == 0
	})
	for i := range n {
		code, _ := internalGet(t, cl, c.URL(2), fmt.Sprintf("bh%d", i), "")
		require.Equal(t, http.StatusOK, code, "bh%d reached node 2", i)
	}

	for _, from := range []int{0, 1} {
		c.Link(from, 2).Delay(20 * time.Millisecond)
	}
	for i := range 10 {
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(i%2), fmt.Sprintf("slow%d", i), []byte("v"), 3, 3))
	}
}

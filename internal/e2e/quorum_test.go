package e2e_test

// Quorum invariants on three and five nodes, default ack/from, the "at most
// from copies" rule and the ordering of writes without sleeping.

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// TestThreeNodesReadOneSeesWriteTwoOfTwo: with from=2 on three nodes, a PUT
// (or DELETE) acknowledged by both replicas is seen by GET 1/2 through any
// node while either replica is down. The PUT is coordinated by the node
// outside the key's replica set; the DELETE after a PUT is coordinated by a
// replica (through the outsider it can lose to the PUT: that is
// TestWriteThroughNonReplicaCoordinator).
func TestThreeNodesReadOneSeesWriteTwoOfTwo(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 3)
	cl := testcluster.NewClient(t)
	p := placementOf(t, c)
	for _, set := range [][]int{{0, 1}, {1, 2}, {2, 0}} {
		put := findKeySet(t, p, "r1w2-put", set...)
		del := findKeySet(t, p, "r1w2-del", set...)
		outsider := 3 - set[0] - set[1] // coordinates without being a replica
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(outsider), put, []byte("v"), 2, 2))
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(set[0]), del, []byte("v"), 2, 2))
		require.Equal(t, http.StatusAccepted, cl.Delete(t, c.URL(set[1]), del, 2, 2))
		for _, down := range set {
			c.StopNode(down)
			for i := range 3 {
				if i != down {
					expectValue(t, cl, c.URL(i), put, 1, 2, "v")
					expectAbsent(t, cl, c.URL(i), del, 1, 2)
				}
			}
			c.StartNode(down)
		}
	}
}

// TestThreeNodesQuorumOneDown: a PUT or DELETE made with 2/3 while node d
// is down is seen by GET 2/3 after d is back and another node e is down,
// whatever d and e: the two quorums always share a node.
func TestThreeNodesQuorumOneDown(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 3)
	cl := testcluster.NewClient(t)
	for d := range 3 {
		put, del := fmt.Sprintf("q3-put-%d", d), fmt.Sprintf("q3-del-%d", d)
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(d), del, []byte("v"), 3, 3))
		c.StopNode(d)
		via := (d + 1) % 3
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(via), put, []byte("v"), 2, 3))
		require.Equal(t, http.StatusAccepted, cl.Delete(t, c.URL(via), del, 2, 3))
		// A write that cannot reach ack fails, but the replicas it reached
		// may keep it: use another key.
		require.Equal(t, http.StatusGatewayTimeout, cl.Put(t, c.URL(via), put+"-3of3", []byte("x"), 3, 3))
		c.StartNode(d)
		for e := range 3 {
			if e == d {
				continue
			}
			c.StopNode(e)
			for i := range 3 {
				if i != e {
					expectValue(t, cl, c.URL(i), put, 2, 3, "v")
					expectAbsent(t, cl, c.URL(i), del, 2, 3)
				}
			}
			c.StartNode(e)
		}
	}
}

// TestFiveNodesQuorum: with the defaults on five nodes (from=5, ack=3), a
// write made while two nodes are down is seen by a read made while two
// other nodes are down, for disjoint and overlapping pairs. Also from=3
// (ack 2) with one replica down.
func TestFiveNodesQuorum(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 5)
	cl := testcluster.NewClient(t)
	p := placementOf(t, c)
	cases := []struct{ downW, downR []int }{
		{[]int{0, 1}, []int{2, 3}},
		{[]int{0, 1}, []int{1, 2}},
		{[]int{3, 4}, []int{0, 4}},
		{[]int{1, 3}, []int{2, 4}},
	}
	for n, tc := range cases {
		put, del := fmt.Sprintf("q5-put-%d", n), fmt.Sprintf("q5-del-%d", n)
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), del, []byte("v"), 5, 5))
		live := func(down []int) int {
			for i := range 5 {
				if !slices.Contains(down, i) {
					return i
				}
			}
			panic("no live node")
		}
		for _, d := range tc.downW {
			c.StopNode(d)
		}
		via := live(tc.downW)
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(via), put, []byte("v"), 0, 0))
		require.Equal(t, http.StatusAccepted, cl.Delete(t, c.URL(via), del, 0, 0))
		for _, d := range tc.downW {
			c.StartNode(d)
		}
		for _, d := range tc.downR {
			c.StopNode(d)
		}
		for i := range 5 {
			if !slices.Contains(tc.downR, i) {
				expectValue(t, cl, c.URL(i), put, 0, 0, "v")
				expectAbsent(t, cl, c.URL(i), del, 0, 0)
			}
		}
		for _, d := range tc.downR {
			c.StartNode(d)
		}
	}

	// from=3: the key's three replicas, quorum 2, one replica down at write
	// time and another at read time.
	key := findKey(t, p, "q5-from3", 0, 2, 4)
	c.StopNode(2)
	require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(1), key, []byte("v3"), 0, 3))
	c.StartNode(2)
	c.StopNode(0)
	expectValue(t, cl, c.URL(3), key, 0, 3, "v3")
	expectValue(t, cl, c.URL(2), key, 2, 3, "v3")
	c.StartNode(0)
}

// TestDefaultAckIsQuorumOfFrom: ack defaults to from/2+1 (1/1, 2/2, 2/3, 3/4,
// 3/5) and from to the cluster size. On five nodes, for each from, a PUT
// and a GET without ack succeed with exactly from-quorum of the key's
// replicas down and get 504 with one more down.
func TestDefaultAckIsQuorumOfFrom(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 5)
	cl := testcluster.NewClient(t)
	p := placementOf(t, c)
	for from := 0; from <= 5; from++ { // 0: from omitted, i.e. 5
		f := from
		if f == 0 {
			f = 5
		}
		quorum := f/2 + 1
		key := "default-ack-" + strconv.Itoa(from)
		reps := replicasOf(p, key, f)
		// Stop replicas from the end of the list; coordinate through the
		// first replica, which stays up.
		var stopped []int
		for len(stopped) < f-quorum {
			n := reps[len(reps)-1-len(stopped)]
			c.StopNode(n)
			stopped = append(stopped, n)
		}
		via := reps[0]
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(via), key, []byte("v"), 0, from),
			"from=%d (%d of %d replicas up)", f, f-len(stopped), f)
		expectValue(t, cl, c.URL(via), key, 0, from, "v")
		if quorum < f || f == 1 {
			// One more replica down: the default ack is out of reach. For
			// from=1 that is the only replica, so coordinate elsewhere.
			n := reps[len(reps)-1-len(stopped)]
			if n == via {
				via = slices.IndexFunc([]int{0, 1, 2, 3, 4}, func(i int) bool { return i != n })
			}
			c.StopNode(n)
			stopped = append(stopped, n)
			require.Equal(t, http.StatusGatewayTimeout, cl.Put(t, c.URL(via), key, []byte("v"), 0, from), "from=%d", f)
			code, _ := cl.Get(t, c.URL(via), key, 0, from)
			require.Equal(t, http.StatusGatewayTimeout, code, "from=%d", f)
		}
		for _, n := range stopped {
			c.StartNode(n)
		}
	}
}

// TestRequestValidation: ack/from that are not numbers, ack < 1, ack > from
// or from > cluster size are 400 for every method on every node; valid
// combinations are not.
func TestRequestValidation(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 3)
	cl := testcluster.NewClient(t)
	bad := [][2]string{
		{"0", "3"}, {"-1", "3"}, {"4", "3"}, {"3", "2"}, {"1", "4"}, {"1", "0"},
		{"x", "3"}, {"1", "y"}, {"", "z"}, {"1.5", "3"}, {"1", ""}, {"", "4"}, {"4", ""},
		{"1 ", "3"}, {"0x1", "3"}, {"99999", "3"},
	}
	for _, b := range bad {
		ack, from := b[0], b[1]
		// "" means present but empty when the other is set explicitly.
		u := c.URL(0) + "/v0/entity?id=k&ack=" + ack + "&from=" + from
		for _, m := range methods {
			code, _ := cl.Do(t, m, u, []byte("v"))
			require.Equal(t, http.StatusBadRequest, code, "%s ack=%q from=%q", m, ack, from)
		}
	}
	for _, b := range [][2]string{{"1", "1"}, {"2", "2"}, {"2", "3"}, {"3", "3"}, {"", "1"}, {"", "3"}, {"1", ""}, {"3", ""}, {"", ""}} {
		ack, from := b[0], b[1]
		u := rawURL(c.URL(1), "k", ack, from)
		code, _ := cl.Do(t, http.MethodPut, u, []byte("v"))
		require.Equal(t, http.StatusCreated, code, "ack=%q from=%q", ack, from)
	}
}

// TestWriteAtMostFromCopies: a write reaches exactly the key's first `from`
// replicas, with ack=from and with ack=1 (where the rest arrive in the
// background): no node outside the set ever receives it.
func TestWriteAtMostFromCopies(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 5)
	cl := testcluster.NewClient(t)
	p := placementOf(t, c)
	for from := 1; from <= 5; from++ {
		for _, ack := range []int{from, 1} {
			for via := range 5 {
				key := fmt.Sprintf("copies-%d-%d-%d", from, ack, via)
				want := slices.Sorted(slices.Values(replicasOf(p, key, from)))
				require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(via), key, []byte("v"), ack, from))
				var hs []int
				testcluster.Eventually(t, testcluster.WaitFor, "all replicas of "+key, func() bool {
					hs = holders(t, c, cl, key, "")
					return len(hs) >= from
				})
				require.Equal(t, want, hs, "from=%d ack=%d via node %d", from, ack, via)
				if ack == 1 && from > 1 {
					break
				}
			}
		}
	}
	// Deletes too: the tombstone goes to the same replicas only.
	key := "copies-delete"
	want := slices.Sorted(slices.Values(replicasOf(p, key, 2)))
	require.Equal(t, http.StatusAccepted, cl.Delete(t, c.URL(0), key, 2, 2))
	require.Equal(t, want, holders(t, c, cl, key, ""))
}

// TestConcurrentWritesConverge: writes of one key made at the same moment
// through three coordinators (often in the same millisecond) are ordered
// deterministically: every replica ends with the same record, the one with
// the highest version, whose node id names the coordinator whose value won.
func TestConcurrentWritesConverge(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 3)
	cl := testcluster.NewClient(t)
	for round := range 30 {
		key := "concurrent-" + strconv.Itoa(round)
		var wg sync.WaitGroup
		codes := make([]int, 3)
		start := make(chan struct{})
		for i := range 3 {
			wg.Go(func() {
				<-start
				codes[i] = cl.Put(t, c.URL(i), key, []byte("from-"+strconv.Itoa(i)), 3, 3)
			})
		}
		close(start)
		wg.Wait()
		require.Equal(t, []int{201, 201, 201}, codes)
		_, rec := internalGet(t, cl, c.URL(0), key, "")
		for i := 1; i < 3; i++ {
			_, other := internalGet(t, cl, c.URL(i), key, "")
			require.Equal(t, rec, other, "replicas disagree on %s", key)
		}
		_, _, winner := hlc.Parts(rec.Version)
		require.Equal(t, "from-"+strconv.Itoa(winner), string(rec.Value))
		for i := range 3 {
			expectValue(t, cl, c.URL(i), key, 1, 3, string(rec.Value))
		}
	}
}

// TestSequentialWritesThroughDescendingNodeIDs: writes acknowledged by all
// replicas and issued one after the other without sleeping, through nodes
// 2, 1, 0 (so a same-millisecond tie-break by node id alone would pick the
// wrong one): the last acknowledged write always wins, because every
// coordinator observed the previous version when it stored it.
func TestSequentialWritesThroughDescendingNodeIDs(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 3)
	cl := testcluster.NewClient(t)
	sameMs, rounds := 0, 200
	for round := range rounds {
		key := "seq-" + strconv.Itoa(round)
		startMs := time.Now().UnixMilli()
		for _, via := range []int{2, 1, 0} {
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(via), key, []byte("via-"+strconv.Itoa(via)), 3, 3))
		}
		expectValue(t, cl, c.URL(1), key, 1, 3, "via-0")
		_, rec := internalGet(t, cl, c.URL(2), key, "")
		if ms, _, _ := hlc.Parts(rec.Version); ms == startMs {
			sameMs++ // all three writes in one millisecond
		}
	}
	t.Logf("%d of %d rounds wrote all three versions within one millisecond", sameMs, rounds)
}

// TestQuorumSequentialWritesDifferentCoordinators: PUT 2/3 through one
// node, then at once PUT 2/3 through another, then GET 2/3 through the
// third: the read must return the second write, which was acknowledged
// after the first one completed (the read quorum meets the second write's
// quorum, and nothing newer was written).
//
// FAILS (a few rounds in a hundred): the second coordinator may not have
// seen the first write yet (ack=2 of 3: it can be the straggler), so in the
// same millisecond its HLC issues a version with the same wall time and
// logical counter, and the lower node id loses the tie-break. The replicas
// that hold the first write keep it ("201: applied or already newer"), the
// second write is acknowledged and yet invisible. See the report.
func TestQuorumSequentialWritesDifferentCoordinators(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 3)
	cl := testcluster.NewClient(t)
	pairs := [][2]int{{2, 1}, {1, 0}, {2, 0}} // higher id first: a tie goes to the first write
	const rounds = 450
	var lost []string
	for round := range rounds {
		key := "quorum-seq-" + strconv.Itoa(round)
		first, second := pairs[round%3][0], pairs[round%3][1]
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(first), key, []byte("first"), 2, 3))
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(second), key, []byte("second"), 2, 3))
		code, body := cl.Get(t, c.URL(3-first-second), key, 2, 3)
		require.Equal(t, http.StatusOK, code)
		if string(body) != "second" {
			msg := fmt.Sprintf("round %d: PUT via %d, then PUT via %d acknowledged, GET 2/3 returned %q;", round, first, second, body)
			for i := range 3 {
				_, rec := internalGet(t, cl, c.URL(i), key, "")
				ms, l, n := hlc.Parts(rec.Version)
				msg += fmt.Sprintf(" node %d has %q (ms %d, logical %d, node %d);", i, rec.Value, ms, l, n)
			}
			lost = append(lost, msg)
		}
	}
	for _, l := range lost {
		t.Log(l)
	}
	require.Empty(t, lost, "%d of %d acknowledged quorum writes were invisible to the next quorum read", len(lost), rounds)
}

// TestWriteThroughNonReplicaCoordinator: with from=2 on three nodes, PUT
// 2/2 through a replica, then at once DELETE (or PUT) 2/2 through the node
// outside the key's replica set: the second write, acknowledged by both
// replicas after the first completed, must win.
//
// FAILS (tens of percent of the rounds on an idle machine): the outsider
// is never sent the first write, so its HLC never observed that version;
// in the same millisecond it issues (same ms, logical 0, its own id), and
// when its id is lower the replicas keep the first write and still answer
// 201. A DELETE acknowledged by every replica leaves the key readable. See
// the report.
func TestWriteThroughNonReplicaCoordinator(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 3)
	cl := testcluster.NewClient(t)
	p := placementOf(t, c)
	const rounds = 100
	var lost []string
	for round := range rounds {
		key := findKeySet(t, p, "outsider-"+strconv.Itoa(round), 1, 2) // node 0 is the outsider
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(2), key, []byte("v"), 2, 2))
		if round%2 == 0 {
			require.Equal(t, http.StatusAccepted, cl.Delete(t, c.URL(0), key, 2, 2))
			if code, body := cl.Get(t, c.URL(1), key, 2, 2); code != http.StatusNotFound {
				lost = append(lost, fmt.Sprintf("round %d: DELETE 2/2 via node 0 acknowledged, GET 2/2 returned %d %q", round, code, body))
			}
		} else {
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), key, []byte("v2"), 2, 2))
			if code, body := cl.Get(t, c.URL(1), key, 2, 2); string(body) != "v2" {
				lost = append(lost, fmt.Sprintf("round %d: PUT 2/2 via node 0 acknowledged, GET 2/2 returned %d %q", round, code, body))
			}
		}
	}
	for _, l := range lost {
		t.Log(l)
	}
	require.Empty(t, lost, "%d of %d writes acknowledged by every replica were invisible", len(lost), rounds)
}

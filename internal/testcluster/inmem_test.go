package testcluster

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/partcopy"
)

// The plumbing on the wall clock: three nodes in memory replicate a
// write, a stopped node keeps its data across a restart, and a wiped one
// starts empty and copies its share back.
func TestInMemorySmoke(t *testing.T) {
	c := StartInMemory(t, 3)
	cl := c.Client()
	require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), "a", []byte("x"), 3, 3))
	for i := range 3 {
		code, body := cl.Get(t, c.URL(i), "a", 1, 1)
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, "x", string(body))
		require.Len(t, c.Replica(i), 1)
	}
	want := c.Replica(0)
	c.StopNode(1)
	c.StartNode(1)
	require.Equal(t, want, c.Replica(1), "a restart keeps the MemFS")
	c.AwaitFormed(10 * time.Second)
	c.StopNode(2)
	c.WipeNode(2)
	c.StartNode(2)
	c.Await(10*time.Second, "rebuild", func() (bool, string) {
		err := c.Node(2).Ready()
		return err == nil, fmt.Sprint(err)
	})
	require.Equal(t, want, c.Replica(2), "a wiped node rebuilds its share")
}

// A cut refuses new dials as a closed port does and resets the open
// connections; a heal lets them through again.
func TestMemLinkCut(t *testing.T) {
	InBubble(t, func(t *testing.T) {
		c := StartInMemory(t, 2)
		conn, err := c.dialFrom(0, memAddr(1))
		require.NoError(t, err)
		c.Cut(0, 1)
		_, err = conn.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
		require.ErrorIs(t, err, syscall.ECONNRESET)
		_, err = conn.Read(make([]byte, 1))
		require.ErrorIs(t, err, syscall.ECONNRESET)
		_, err = c.dialFrom(0, memAddr(1))
		require.ErrorIs(t, err, syscall.ECONNREFUSED)
		require.Equal(t, "cut", c.Link(1, 0).Mode(), "Cut cuts both ways")

		c.Heal()
		conn, err = c.dialFrom(0, memAddr(1))
		require.NoError(t, err)
		_, err = io.WriteString(conn, "GET /v0/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		require.NoError(t, err)
		line := make([]byte, 12)
		_, err = io.ReadFull(conn, line)
		require.NoError(t, err)
		require.Equal(t, "HTTP/1.1 200", string(line))
		require.NoError(t, conn.Close())

		c.StopNode(1)
		_, err = c.dialFrom(0, memAddr(1))
		require.ErrorIs(t, err, syscall.ECONNREFUSED, "a stopped node's port is closed")
	})
}

// A delay delivers each chunk d after it was written, both ways: on the
// bubble's clock a replicated write pays the round trip, and a delay past
// the replica timeout makes the replica miss the deadline (the call times
// out at it, rather than waiting for the slow link).
func TestMemLinkDelay(t *testing.T) {
	InBubble(t, func(t *testing.T) {
		c := StartInMemory(t, 3)
		cl := c.Client()
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), "warm", []byte("up"), 3, 3))

		start := time.Now()
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), "a", []byte("x"), 3, 3))
		require.Zero(t, time.Since(start), "in memory, on the fake clock, a write takes no time")

		c.Link(0, 2).Delay(100 * time.Millisecond)
		start = time.Now()
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), "b", []byte("y"), 3, 3))
		took := time.Since(start)
		require.GreaterOrEqual(t, took, 200*time.Millisecond, "the batch out and the answer back")
		require.Less(t, took, c.Config(0).ReplicaTimeout)

		timeout := c.Config(0).ReplicaTimeout
		c.Link(0, 2).Delay(2 * timeout)
		start = time.Now()
		code := cl.Put(t, c.URL(0), "c", []byte("z"), 3, 3)
		require.Equal(t, http.StatusGatewayTimeout, code, "node3 answers past the deadline")
		require.Less(t, time.Since(start), 2*timeout, "the call ends at its deadline, not when the link delivers")
		require.Equal(t, "delay 1s", c.Link(0, 2).Mode())
		c.Heal()
		require.Equal(t, "pass", c.Link(0, 2).Mode())
	})
}

// A join's partition streams keep to --move-rate on the bubble's clock:
// three nodes (1 replica: no comparison after the streams, which is slow
// under -race) hold 4 MiB of records, the 4th gains a quarter of the
// partitions and streams them from their three owners at 1 MiB/s. Every
// other step is instant on the fake clock (in-memory links, no delay), so
// from the stream stage's install to the joiner's report that it copied
// them takes the bytes streamed over the rate, less the limiter's initial
// burst (one 64 KiB batch), to the test's polling interval.
func TestInMemoryJoinKeepsMoveRate(t *testing.T) {
	InBubble(t, func(t *testing.T) {
		c := StartInMemory(t, 3, func(_ int, cfg *node.Config) { cfg.Move.Rate, cfg.Replicas = partcopy.MinRate, 1 })
		cl := c.Client()
		value := bytes.Repeat([]byte("v"), 16<<10)
		for k := range 256 {
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), fmt.Sprintf("k%03d", k), value, 1, 1))
		}
		j, took := joinCopying(t, c)
		c.AwaitStable(time.Minute)

		code, body := cl.Do(t, http.MethodGet, c.AdminURL(j)+"/metrics", nil)
		require.Equal(t, http.StatusOK, code)
		match := regexp.MustCompile(`(?m)^dhtkv_copy_bytes_total (\S+)$`).FindSubmatch(body)
		require.NotNil(t, match)
		streamed, err := strconv.ParseFloat(string(match[1]), 64)
		require.NoError(t, err)
		want := time.Duration((streamed - 64<<10) / partcopy.MinRate * float64(time.Second))
		t.Logf("streamed %.0f bytes in %v (want %v)", streamed, took, want)
		require.Greater(t, streamed, 0.8e6, "about a quarter of 4 MiB")
		require.InDelta(t, want.Seconds(), took.Seconds(), joinPoll.Seconds()*1.01, "to the polling interval")
	})
}

// joinCopying adds a node to c through node 0, starts it, and returns its
// index and how long it took, on the bubble's clock, from the stream
// stage's install to its report that it copied its gains, to joinPoll.
// joinPoll: a condition polled every 2 ms of the fake clock wakes the
// bubble 500 times over a stream, slow under -race.
const joinPoll = 10 * time.Millisecond

func joinCopying(t *testing.T, c *InMemory) (j int, took time.Duration) {
	t.Helper()
	j = c.AddNode(0)
	require.Equal(t, http.StatusAccepted, c.Join(0, j))
	c.StartNode(j)
	var from time.Time
	var epoch uint64
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(joinPoll) {
		require.True(t, time.Now().Before(deadline), "the joiner did not copy its partitions within a minute")
		m, _ := c.Node(j).Members().Map()
		if m.Change != nil && m.Change.Stage == clustermap.Stream && from.IsZero() {
			from, epoch = time.Now(), m.Epoch
		}
		if !from.IsZero() && c.Node(j).Members().Moved() >= epoch {
			return j, time.Since(from)
		}
	}
}

// A join compares the partitions it streamed with every other replica
// of their old set at once, each comparison pacing its own walks at
// --ae-summary-rate: three nodes at three replicas hold 300 keys, and the
// 4th gains about three quarters of them, streamed at once. Its
// comparisons walk each gained partition's index entries once (the
// second comparison of a partition finds its hash made by the first).
// At 100 entries a second, one comparison after another took that walk
// over the rate (about 2.2 s of the bubble's clock); three at once take
// a third of it; unpaced, no time at all.
func TestInMemoryJoinComparesAtOnce(t *testing.T) {
	InBubble(t, func(t *testing.T) {
		const keys, rate = 300, 100
		c := StartInMemory(t, 3, func(_ int, cfg *node.Config) { cfg.AntiEntropy.SummaryRate = rate })
		cl := c.Client()
		for k := range keys {
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), fmt.Sprintf("k%03d", k), []byte("v"), 3, 3))
		}
		j, took := joinCopying(t, c)
		c.AwaitStable(time.Minute)
		held := 0
		for k := range keys {
			_, found, err := c.Node(j).Store().Version(fmt.Appendf(nil, "k%03d", k))
			require.NoError(t, err)
			if found {
				held++
			}
		}
		oneAtATime := time.Duration(float64(held) / rate * float64(time.Second))
		t.Logf("the joiner holds %d keys; stream and comparisons took %v (one comparison at a time: about %v)", held, took, oneAtATime)
		require.Greater(t, held, keys/2)
		require.Less(t, took, oneAtATime/2, "the comparisons ran one after another")
		require.Greater(t, took, oneAtATime/5, "the comparisons' walks were not paced")
	})
}

// An exchange reads its partitions' index entries to hash them at
// --ae-summary-rate: on the fake clock, an exchange over 300 keys at 100
// entries a second takes the walk over the rate, less the limiter's
// burst (a sixteenth of a second's worth); unpaced it would take no fake
// time at all.
func TestInMemoryExchangeSummariesPaced(t *testing.T) {
	InBubble(t, func(t *testing.T) {
		const keys, rate = 300, 100
		c := StartInMemory(t, 2, func(_ int, cfg *node.Config) { cfg.AntiEntropy.SummaryRate, cfg.Replicas = rate, 2 })
		cl := c.Client()
		for k := range keys {
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), fmt.Sprintf("k%03d", k), []byte("v"), 2, 2))
		}
		start := time.Now()
		ex := c.Repair(0)
		took := time.Since(start)
		require.Len(t, ex, 1)
		require.Empty(t, ex[0].Error)
		require.Zero(t, ex[0].PartitionsDiffering, "both replicas hold every key")
		// Every partition is stale (written, and a store opens with all
		// stale): the exchange reads all the node's 300 entries.
		least := time.Duration(float64(keys-rate/16) / rate * float64(time.Second))
		t.Logf("exchange took %v (at least %v)", took, least)
		require.GreaterOrEqual(t, took, least)
		require.Less(t, took, least+time.Second, "nothing else waited")
	})
}

package handoff_test

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/handoff"
	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/view"
)

// The same write hinted twice for one target (cluster.Coordinator.Write
// routes a failed write again, with the same version, when the view
// changed meanwhile, and the target fails it again) is one hint in the
// store (its key is target, version, key), but Add reserves its bytes
// twice; its delivery releases them once. The target's pending bytes
// then never come back to zero: dhtkv_hints_pending_bytes lies, and
// every such write eats into --hint-max-bytes for good (until a
// restart), so that later hints are dropped for the cap with the disk
// holding none.
func TestHintAddedTwiceIsCountedOnce(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a, b := newReplica(t, 0), newReplica(t, 1)
	m, err := clustermap.Seed([]string{"http://a:1", "http://b:1"}, 0)
	require.NoError(t, err)
	link := &countingPeer{Direct: &rpc.Direct{URL: "http://b:1", Server: &rpc.Server{Replica: b, MaxKeyBytes: 1024, MaxValueBytes: 1 << 20, Log: log}}}
	link.Cut(true)
	v := view.New(m, 0, "http://a:1", func(string) view.Peer { return link }, time.Now())
	h, err := handoff.New(a.Store, func() *view.View { return v }, func(int) {}, handoff.Options{Interval: 10 * time.Millisecond}, log)
	require.NoError(t, err)

	version, err := a.Clock.Next()
	require.NoError(t, err)
	env := (&record.Record{Version: version, Value: []byte("v")}).Encode()
	h.Add(1, []byte("k"), env)
	h.Add(1, []byte("k"), env) // the retry's hint: the same write, the same stored hint

	h.Start()
	defer h.Close()
	link.Cut(false)
	require.Eventually(t, func() bool { return link.applies.Load() >= 1 }, 10*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { e, _ := b.Get([]byte("k")); return e.Found }, 10*time.Second, time.Millisecond,
		"the hint is delivered")
	require.Eventually(t, func() bool { return h.Pending()["http://b:1"] == 0 }, 2*time.Second, 10*time.Millisecond,
		"nothing is pending once the hint was delivered")
}

// A target that fails its deliveries (down, cut off) does not hold up
// the others': the first call of a slice it does not answer stops the
// slice, so it takes one hint's worth of the replay rate, which every
// target shares, and not 64 (send used to take each hint's tokens before
// starting it, whether or not the ones before had failed; round visits
// the targets one after the other, so with 1 KB hints at 4 KB/s a live
// target's hint waited 15 s a round, and at the defaults with 1 MiB
// values two minutes). In a bubble: the times are the fake clock's.
func TestDeadTargetLeavesTheReplayRateToOthers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := slog.New(slog.DiscardHandler)
		a, b, c := memReplica(t, 0), memReplica(t, 1), memReplica(t, 2)
		m, err := clustermap.Seed([]string{"http://a:1", "http://b:1", "http://c:1"}, 0)
		require.NoError(t, err)
		server := func(r *replica.Replica) *rpc.Server {
			return &rpc.Server{Replica: r, MaxKeyBytes: 1024, MaxValueBytes: 1 << 20, Log: log}
		}
		toB := &countingPeer{Direct: &rpc.Direct{URL: "http://b:1", Server: server(b)}}
		toC := &countingPeer{Direct: &rpc.Direct{URL: "http://c:1", Server: server(c)}}
		toB.Cut(true) // b is down
		v := view.New(m, 0, "http://a:1", func(url string) view.Peer {
			if url == "http://b:1" {
				return toB
			}
			return toC
		}, time.Now())
		h, err := handoff.New(a.Store, func() *view.View { return v }, func(int) {},
			handoff.Options{Interval: 10 * time.Millisecond, ReplayRate: 4000}, log)
		require.NoError(t, err)

		// b's backlog: 64 hints of about 1 KB, of keys of partitions b holds.
		for i := 0; h.Pending()["http://b:1"] < 64*1000; i++ {
			key := fmt.Appendf(nil, "k%d", i)
			if part, _ := partition.Of(key); !v.Receives(part, 1) {
				continue
			}
			version, err := a.Clock.Next()
			require.NoError(t, err)
			h.Add(1, key, (&record.Record{Version: version, Value: make([]byte, 1000)}).Encode())
		}
		h.Start()
		defer h.Close()
		for toB.applies.Load() == 0 {
			time.Sleep(time.Millisecond)
		}

		// c missed one write; c answers.
		var key []byte
		for i := 0; ; i++ {
			key = fmt.Appendf(nil, "c%d", i)
			if part, _ := partition.Of(key); v.Receives(part, 2) {
				break
			}
		}
		version, err := a.Clock.Next()
		require.NoError(t, err)
		h.Add(2, key, (&record.Record{Version: version, Value: []byte("v")}).Encode())
		start := time.Now()
		for h.Pending()["http://c:1"] != 0 && time.Since(start) < time.Minute {
			time.Sleep(10 * time.Millisecond)
		}
		took := time.Since(start)
		require.Less(t, took, 2*time.Second, "c's hint waited for b's failed calls (%d of them)", toB.applies.Load())
	})
}

// memReplica is a replica on real Pebble in memory (for a bubble), with
// a clock of node id.
func memReplica(t *testing.T, id int) *replica.Replica {
	t.Helper()
	st, err := store.Open("db", store.Options{FS: vfs.NewMem()})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	clock, err := hlc.New(id, time.Now)
	require.NoError(t, err)
	return &replica.Replica{Store: st, Clock: clock}
}

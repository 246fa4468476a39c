package cluster

import (
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/view"
)

// newerPeer is a replica that holds newer for every key: it refuses every
// write with it, as a replica holding a newer version does; with newer 0,
// one that fails every write (a peer cut off).
type newerPeer struct{ newer uint64 }

func (p newerPeer) Get([]byte, uint64, time.Time) (record.Record, bool, error) {
	return record.Record{}, false, nil
}
func (p newerPeer) Apply([]byte, []byte, uint64, time.Time) (uint64, error) {
	if p.newer == 0 {
		return 0, errors.New("cut off")
	}
	return p.newer, nil
}
func (p newerPeer) Ping(uint64, time.Time) (view.PingAnswer, error) {
	return view.PingAnswer{Formed: true}, nil
}
func (p newerPeer) Summary([]byte, uint64, time.Time) ([]byte, error) { return nil, nil }
func (p newerPeer) Map([]byte, time.Time) ([]byte, error)             { return nil, nil }
func (p newerPeer) Reach(string, time.Time) (bool, error)             { return false, nil }
func (p newerPeer) ClockOffset() (view.ClockSample, bool)             { return view.ClockSample{}, false }
func (p newerPeer) Close()                                            {}

// clockCoordinator is node 0 of a cluster of three whose two peers hold
// newer (0: fail every write) for every key, with a real local replica
// on wall (nil: time.Now), and the clock checks given.
func clockCoordinator(t *testing.T, wall func() time.Time, newer uint64, check, lease func() error) *Coordinator {
	t.Helper()
	clock, err := hlc.New(0, wall)
	require.NoError(t, err)
	st, err := store.Open(filepath.Join(t.TempDir(), "db"), store.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	local := &replica.Replica{Store: st, Clock: clock, Versions: replica.NewVersionFilter(1<<10, 0)}
	m, err := clustermap.Seed([]string{"http://a:1", "http://b:1", "http://c:1"}, 0)
	require.NoError(t, err)
	v := view.New(m, 0, "", func(string) view.Peer { return newerPeer{newer} }, time.Now())
	c := New(Deps{Views: func() *view.View { return v }, Gate: openGate{}, Clock: clock, Local: local, ClockCheck: check, ClockLease: lease},
		Options{Timeout: time.Minute}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(c.Close)
	return c
}

// TestWriteClockChecks: a write with ack=1 needs only the clock not to be
// off (ClockCheck); one with ack of 2 or more needs it verified
// (ClockLease), and is refused with its error.
func TestWriteClockChecks(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // first registered: runs after the store closed
	errOff, errUnverified := errors.New("off"), errors.New("unverified")
	var checked, leased int
	c := clockCoordinator(t, nil, 0,
		func() error { checked++; return nil },
		func() error { leased++; return errUnverified })
	require.NoError(t, c.Write([]byte("k"), []byte("v"), false, 0, 1, 3))
	require.Equal(t, [2]int{1, 0}, [2]int{checked, leased})
	require.ErrorIs(t, c.Write([]byte("k"), []byte("v"), false, 0, 2, 3), errUnverified)
	require.Equal(t, [2]int{1, 1}, [2]int{checked, leased})

	c = clockCoordinator(t, nil, 0, func() error { return errOff }, nil)
	require.ErrorIs(t, c.Write([]byte("k"), []byte("v"), false, 0, 2, 3), errOff, "no ClockLease: ClockCheck")
}

// TestWriteReplicaAhead: a replica refusing a write with a version within
// the bound gets a second round above it; one beyond the bound of this
// clock cannot be observed, and the write is refused with
// ErrReplicaAhead, which names the replica, and leaves the clock where it
// was (it used to be the bare hlc error, a 500). In a bubble: the refusal
// is a failure, which answers late (TestFailedWriteAnswersLate).
func TestWriteReplicaAhead(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // first registered: runs after the bubble
	synctest.Test(t, func(t *testing.T) {
		wall := time.UnixMilli(1_800_000_000_000)
		at := func() time.Time { return wall }
		within := hlc.VersionAt(wall.Add(hlc.DefaultMaxAhead*3/5)) | 2
		c := clockCoordinator(t, at, within, nil, nil)
		// Both peers refuse both rounds: the second round's refusal is a
		// concurrent write's, and counts as an answer.
		require.NoError(t, c.Write([]byte("k"), []byte("v"), false, 0, 3, 3))
		e, err := c.local.Get([]byte("k"))
		require.NoError(t, err)
		require.Greater(t, e.Rec.Version, within, "the second round is above the replica's version")

		ahead := hlc.VersionAt(wall.Add(30*time.Second)) | 2
		c = clockCoordinator(t, at, ahead, nil, nil)
		err = c.Write([]byte("k"), []byte("v"), false, 0, 3, 3)
		require.ErrorIs(t, err, ErrReplicaAhead)
		require.ErrorIs(t, err, hlc.ErrTooFarAhead)
		require.Regexp(t, `http://[bc]:1 holds version`, err.Error())
		next, err := c.clock.Next()
		require.NoError(t, err)
		require.Less(t, next, hlc.VersionAt(wall.Add(time.Second)), "the clock did not observe it")
	})
}

// TestFailedWriteAnswersLate: a write that fails answers once its
// version is the skew bound (and 1 ms) in this clock's past, the time
// already spent included; one that succeeds answers at once. On the
// bubble's clock, with peers that fail at once.
func TestFailedWriteAnswersLate(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // first registered: runs after the bubble
	synctest.Test(t, func(t *testing.T) {
		c := clockCoordinator(t, nil, 0, nil, nil)
		bound := c.clock.MaxAhead()
		start := time.Now()
		require.NoError(t, c.Write([]byte("k"), []byte("v"), false, 0, 1, 3), "the local replica is enough")
		require.Zero(t, time.Since(start), "a success answers at once")

		start = time.Now()
		require.ErrorIs(t, c.Write([]byte("k"), []byte("v"), false, 0, 2, 3), ErrNotEnoughReplicas)
		require.Equal(t, bound+time.Millisecond, time.Since(start))
		e, err := c.local.Get([]byte("k"))
		require.NoError(t, err)
		require.Equal(t, start, hlc.TimeOf(e.Rec.Version), "stored here, with the version of its start")
		require.Less(t, e.Rec.Version, hlc.VersionAt(time.Now().Add(-bound)), "answered when it was bound in the past")
	})
}

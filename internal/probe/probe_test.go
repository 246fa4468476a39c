package probe

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/view"
)

// clockPeer is a peer whose clock was measured off by offset, at at.
type clockPeer struct {
	offset time.Duration
	at     time.Time
}

func (p clockPeer) Get([]byte, uint64, time.Time) (record.Record, bool, error) {
	return record.Record{}, false, nil
}
func (p clockPeer) Apply([]byte, []byte, uint64, time.Time) (uint64, error) { return 0, nil }
func (p clockPeer) Ping(uint64, time.Time) (view.PingAnswer, error) {
	return view.PingAnswer{Formed: true}, nil
}
func (p clockPeer) Summary([]byte, uint64, time.Time) ([]byte, error) { return nil, nil }
func (p clockPeer) Map([]byte, time.Time) ([]byte, error)             { return nil, nil }
func (p clockPeer) Reach(string, time.Time) (bool, error)             { return false, nil }
func (p clockPeer) Close()                                            {}
func (p clockPeer) ClockOffset() (view.ClockSample, bool) {
	return view.ClockSample{Offset: p.offset, At: p.at}, !p.at.IsZero()
}

// testBound is the --max-clock-skew these tests judge by, in whole
// seconds (the default is 500 ms) so that the tables read easily.
const testBound = 5 * time.Second

// TestJudge: this node refuses writes when the median of its peers'
// offsets (its own counting as 0) is beyond the bound; with an even count
// the median nearer 0 is taken, and offsets older than three intervals do
// not count.
func TestJudge(t *testing.T) {
	now := time.Now()
	stale := now.Add(-4 * time.Second)
	for _, tc := range []struct {
		name    string
		offsets []clockPeer
		off     bool
	}{
		{"all close", []clockPeer{{time.Second, now}, {-time.Second, now}}, false},
		{"this clock 30 s ahead: both peers behind", []clockPeer{{-30 * time.Second, now}, {-30 * time.Second, now}}, true},
		{"one peer ahead: the median is 0", []clockPeer{{30 * time.Second, now}, {0, now}}, false},
		{"two nodes cannot tell which is wrong", []clockPeer{{30 * time.Second, now}}, false},
		{"stale offsets do not count", []clockPeer{{-30 * time.Second, stale}, {-30 * time.Second, stale}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			urls := []string{"http://a:1"}
			for i := range tc.offsets {
				urls = append(urls, "http://p:"+string(rune('1'+i)))
			}
			m, err := clustermap.Seed(urls, 0)
			require.NoError(t, err)
			peers := map[string]view.Peer{}
			for i, o := range tc.offsets {
				peers[urls[i+1]] = o
			}
			v := view.New(m, 0, urls[0], func(url string) view.Peer { return peers[url] }, now)
			p := New(func() *view.View { return v }, Options{Interval: time.Second, MaxClockSkew: testBound}, slog.New(slog.NewTextHandler(io.Discard, nil)))
			p.judge(v, now)
			if tc.off {
				require.ErrorIs(t, p.Check(), ErrClockSkew)
				require.NotEmpty(t, p.ClockWarning())
			} else {
				require.NoError(t, p.Check())
			}
		})
	}
}

// fakeWall is the lease tests' node clock: time.Now's wall reading, as
// the node's is, moved by the steps a test makes. (A wall that stood
// still would part from the monotonic clock in every round.)
type fakeWall struct{ stepped atomic.Int64 } // ns

func (w *fakeWall) now() time.Time { return time.Now().Round(0).Add(time.Duration(w.stepped.Load())) }

// step steps the clock by d, as settimeofday would.
func (w *fakeWall) step(d time.Duration) { w.stepped.Add(int64(d)) }

// pingPeer is a peer whose every ping measures its clock offset from
// this node's, with err, and is counted.
type pingPeer struct {
	clockPeer
	sample view.ClockSample
	pings  *atomic.Int32
	down   bool
}

func (p *pingPeer) Ping(uint64, time.Time) (view.PingAnswer, error) {
	p.pings.Add(1)
	if p.down {
		return view.PingAnswer{}, errors.New("down")
	}
	p.sample.At = time.Now()
	return view.PingAnswer{Formed: true}, nil
}

func (p *pingPeer) ClockOffset() (view.ClockSample, bool) { return p.sample, !p.sample.At.IsZero() }

// leaseProber is a prober of a cluster of 1+len(peers) nodes whose peers'
// offsets are measured as given (down: a ping fails), on wall.
func leaseProber(t *testing.T, wall *fakeWall, peers ...*pingPeer) (*Prober, *atomic.Int32) {
	t.Helper()
	pings := new(atomic.Int32)
	urls := []string{"http://self:1"}
	byURL := map[string]view.Peer{}
	for i, p := range peers {
		p.pings = pings
		u := fmt.Sprintf("http://peer:%d", i+1)
		urls = append(urls, u)
		byURL[u] = p
	}
	m, err := clustermap.Seed(urls, 0)
	require.NoError(t, err)
	v := view.New(m, 0, urls[0], func(url string) view.Peer { return byURL[url] }, time.Now())
	p := New(func() *view.View { return v }, Options{Wall: wall.now, MaxClockSkew: testBound}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	return p, pings
}

func offsetPeer(off, err time.Duration) *pingPeer {
	return &pingPeer{sample: view.ClockSample{Offset: off, Error: err}}
}

func downPeer() *pingPeer { return &pingPeer{down: true} }

// TestLeaseNeedsAMajority: a round verifies this node's clock when, with
// this node, a majority of the cluster measured within the bound, each
// offset counted with its error; a cluster of one needs no round.
func TestLeaseNeedsAMajority(t *testing.T) {
	for _, tc := range []struct {
		name     string
		peers    []*pingPeer
		verified bool
		tooFew   bool // too few peers answered to tell
	}{
		{"one node", nil, true, false},
		{"two nodes agreeing", []*pingPeer{offsetPeer(time.Second, 0)}, true, false},
		{"two nodes 30 s apart: neither vouches", []*pingPeer{offsetPeer(30*time.Second, 0)}, false, false},
		{"two nodes, the peer down", []*pingPeer{downPeer()}, false, true},
		{"two nodes, the peer down since another exchange heard it", []*pingPeer{{down: true, sample: view.ClockSample{At: time.Now()}}}, false, true},
		{"three, one peer agrees", []*pingPeer{offsetPeer(0, 0), offsetPeer(30*time.Second, 0)}, true, false},
		{"three, one peer agrees, one down", []*pingPeer{offsetPeer(-4*time.Second, 0), downPeer()}, true, false},
		{"three, this clock 30 s ahead: off, which says more", []*pingPeer{offsetPeer(-30*time.Second, 0), offsetPeer(-30*time.Second, 0)}, false, false},
		{"three, both down", []*pingPeer{downPeer(), downPeer()}, false, true},
		{"within the bound but not with its error", []*pingPeer{offsetPeer(4900*time.Millisecond, 200*time.Millisecond), downPeer()}, false, false},
		{"at the bound with its error", []*pingPeer{offsetPeer(-4800*time.Millisecond, 200*time.Millisecond), downPeer()}, true, false},
		{"five, two agree", []*pingPeer{offsetPeer(0, 0), offsetPeer(time.Second, 0), downPeer(), offsetPeer(time.Minute, 0)}, true, false},
		{"five, one agrees", []*pingPeer{offsetPeer(0, 0), downPeer(), downPeer(), offsetPeer(time.Minute, 0)}, false, false},
		{"five, one answers", []*pingPeer{offsetPeer(0, 0), downPeer(), downPeer(), downPeer()}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wall := new(fakeWall)
			p, pings := leaseProber(t, wall, tc.peers...)
			err := p.Verify()
			if tc.verified {
				require.NoError(t, err)
			} else {
				require.Contains(t, err.Error(), "refusing to coordinate writes")
				if !errors.Is(err, ErrClockSkew) {
					require.ErrorIs(t, err, ErrClockUnverified)
					require.Contains(t, err.Error(), "with ack of 2 or more")
				}
				require.Equal(t, tc.tooFew, errors.Is(err, ErrTooFewPeers), "%v", err)
			}
			require.Equal(t, int32(len(tc.peers)), pings.Load(), "Verify waited for one round, which pinged every peer")
		})
	}
}

// TestLeaseLapses: a lease lets this node coordinate for Lease from its
// round's start, with no round in between; then Verify runs a round, and
// without a majority the node is refused, saying since when.
func TestLeaseLapses(t *testing.T) {
	wall := new(fakeWall)
	peer := offsetPeer(0, 0)
	p, pings := leaseProber(t, wall, peer, downPeer())
	require.NoError(t, p.Verify())
	require.Equal(t, int32(2), pings.Load())
	require.NoError(t, p.Verify(), "within the lease")
	require.Equal(t, int32(2), pings.Load(), "no round within the lease")

	// The lease's round, as if it had begun Lease ago (wall with it).
	l := p.lease.Load()
	p.lease.Store(&lease{start: l.start.Add(-p.o.Lease), wall: l.wall.Add(-p.o.Lease), agreed: l.agreed})
	err := p.leaseErr(time.Now())
	require.ErrorIs(t, err, ErrClockUnverified)
	require.Contains(t, err.Error(), "--clock-lease 3s")
	require.NotErrorIs(t, err, ErrTooFewPeers, "the peer answered within the lease")
	peer.down = true
	peer.sample.At = peer.sample.At.Add(-p.o.Lease)
	err = p.Verify()
	require.ErrorIs(t, err, ErrClockUnverified, "a round reached nobody: no new lease")
	require.ErrorIs(t, err, ErrTooFewPeers)
	require.Equal(t, int32(4), pings.Load())
}

// TestLeaseSeesAStep: within a lease, this node's clock stepping (its wall
// reading moving unlike the monotonic clock) counts against the peers'
// offsets at once: a step of 30 s ends the lease before any round, a step
// that keeps every offset within the bound does not.
func TestLeaseSeesAStep(t *testing.T) {
	wall := new(fakeWall)
	p, _ := leaseProber(t, wall, offsetPeer(-2*time.Second, 0), downPeer())
	require.NoError(t, p.Verify())
	wall.step(2 * time.Second)
	require.NoError(t, p.leaseErr(time.Now()), "2 s ahead, then 2 s more: 4 s, within the bound")
	wall.step(30 * time.Second)
	err := p.leaseErr(time.Now())
	require.ErrorIs(t, err, ErrClockUnverified)
	require.Contains(t, err.Error(), "stepped by 32s")
	wall.step(-64 * time.Second)
	require.ErrorIs(t, p.leaseErr(time.Now()), ErrClockUnverified, "32 s behind")
}

// stepPeer is a peer whose ping first steps this node's clock by step
// (NTP stepping it while the round is under way), then measures the
// peer's clock, which is right: its offset is the step's opposite. With
// undo it steps the clock back after the exchange, before the round
// ends: the exchange itself saw no step (as rpc's clockOffset requires),
// and its sample says this clock's reading then, as rpc's does.
type stepPeer struct {
	pingPeer
	wall *fakeWall
	step time.Duration
	undo bool
}

func (p *stepPeer) Ping(epoch uint64, deadline time.Time) (view.PingAnswer, error) {
	p.wall.step(p.step)
	p.sample.Offset = -time.Duration(p.wall.stepped.Load())
	a, err := p.pingPeer.Ping(epoch, deadline)
	if p.undo {
		p.sample.Wall = p.wall.now()
		p.wall.step(-p.step)
	}
	return a, err
}

// TestLeaseStepDuringRound: a step of this clock inside a probe round is
// already in the offsets the round measured, so the round makes no lease;
// if it did, the lease's step rule would count the step again. Here the
// clock steps back 4 s within the round (the peer, which is right, is
// measured 4 s ahead: within the 5 s bound), then 10 s ahead after it:
// 6 s ahead in all. A lease from that round saw a step of +6 s since the
// round's start against an offset of +4 s, 2 s apart, and let it write.
// A round with no step inside it verifies the clock while it is 4 s
// behind, and counts the later step against that.
func TestLeaseStepDuringRound(t *testing.T) {
	wall := new(fakeWall)
	peer := &stepPeer{pingPeer: *offsetPeer(0, 0), wall: wall, step: -4 * time.Second}
	p, _ := leaseProber(t, wall, &peer.pingPeer, downPeer())
	p.views().Peers[1] = peer // the slot of the first peer (node 1)
	require.ErrorIs(t, p.Verify(), ErrClockUnverified)
	require.Nil(t, p.lease.Load(), "the round the clock stepped in made no lease")
	wall.step(10 * time.Second)
	require.ErrorIs(t, p.leaseErr(time.Now()), ErrClockUnverified, "6 s ahead")

	peer.step = 0
	require.ErrorIs(t, p.Verify(), ErrClockUnverified, "a round measures it 6 s ahead")
	wall.step(-10 * time.Second)
	require.NoError(t, p.Verify(), "a round measures it 4 s behind: within the bound")
	wall.step(10 * time.Second)
	require.ErrorIs(t, p.leaseErr(time.Now()), ErrClockUnverified, "and counts the step after it")
}

// TestLeaseStepUndoneWithinRound: the clock steps back 4 s within a
// round, the peer is measured then (4 s ahead: within the 5 s bound),
// and it steps ahead 4 s again before the round ends. The round's start
// and end agree; its sample does not, and the round makes no lease. With
// one, the clock set 6 s ahead later had its step of +6 s counted
// against an offset of +4 s: 2 s apart, verified 6 s off.
func TestLeaseStepUndoneWithinRound(t *testing.T) {
	wall := new(fakeWall)
	peer := &stepPeer{pingPeer: *offsetPeer(0, 0), wall: wall, step: -4 * time.Second, undo: true}
	p, _ := leaseProber(t, wall, &peer.pingPeer, downPeer())
	p.views().Peers[1] = peer
	require.Error(t, p.Verify())
	require.Nil(t, p.lease.Load())
	wall.step(6 * time.Second)
	require.ErrorIs(t, p.leaseErr(time.Now()), ErrClockUnverified, "6 s ahead of the peer, beyond the 5 s bound")
}

// TestLeaseSlowWallReadIsNoStep: a right clock whose reading returns
// 2 ms after it was read (its goroutine descheduled between the two
// readings of a loaded host) is no step: the round verifies it.
func TestLeaseSlowWallReadIsNoStep(t *testing.T) {
	wall := new(fakeWall)
	p, _ := leaseProber(t, wall, offsetPeer(0, 0), downPeer())
	p.o.Wall = func() time.Time {
		t := wall.now()
		time.Sleep(2 * time.Millisecond)
		return t
	}
	require.NoError(t, p.Verify())
}

// TestRoundsAreShared: a caller that asks for a round after one ended
// since it looked gets none of its own (Verify's callers share the round
// under way).
func TestRoundsAreShared(t *testing.T) {
	wall := new(fakeWall)
	p, pings := leaseProber(t, wall, offsetPeer(0, 0))
	seen := p.rounds.Load()
	p.nextRound(seen)
	require.Equal(t, int32(1), pings.Load())
	p.nextRound(seen)
	require.Equal(t, int32(1), pings.Load(), "a round ended since seen")
	p.nextRound(p.rounds.Load())
	require.Equal(t, int32(2), pings.Load())
}

// TestOptionsValidate: the lease must outlast a probe interval.
func TestOptionsValidate(t *testing.T) {
	o := DefaultOptions()
	require.NoError(t, o.Validate())
	require.Equal(t, 3*time.Second, o.Lease)
	o.Lease = time.Second
	require.ErrorContains(t, o.Validate(), "--clock-lease 1s must exceed the probe interval 1s")
}

// TestMeasureWaitsForTheFirstRound: an ack=1 write needs no lease, but a
// node that has not measured its peers since it started measures them
// first, so that a clock off at start-up refuses it; after the first
// round it does not wait.
func TestMeasureWaitsForTheFirstRound(t *testing.T) {
	wall := new(fakeWall)
	p, pings := leaseProber(t, wall, offsetPeer(-30*time.Second, 0), offsetPeer(-30*time.Second, 0))
	require.ErrorIs(t, p.Measure(), ErrClockSkew)
	require.Equal(t, int32(2), pings.Load())
	require.ErrorIs(t, p.Measure(), ErrClockSkew)
	require.Equal(t, int32(2), pings.Load(), "no round of its own after the first")

	p, pings = leaseProber(t, wall, downPeer(), downPeer())
	require.NoError(t, p.Measure(), "nobody to tell: allowed")
	require.Equal(t, int32(2), pings.Load())
}

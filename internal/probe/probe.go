// Package probe pings every peer on a schedule: whether each answers,
// how far its clock is from this node's, and whether this node has seen
// every member answer once (the cluster is formed).
//
// Every Interval the prober pings each peer (an empty batch).
// That keeps two things known while no request needs a peer:
//
//   - whether the peer answers: a peer going down or coming back is logged
//     once each, with the reason;
//   - how far its clock is from this node's (every batch answer carries the
//     answering node's clock, rpc.TimeHeader).
//
// Clock skew. Versions are made from wall clocks, and last-write-wins
// orders writes by them: a node whose clock runs ahead makes writes that
// beat later writes of others for as long as it is ahead; one running
// behind makes writes that lose to earlier ones. Two rules keep a node
// from coordinating writes with a clock it cannot vouch for:
//
//   - Off (Check, every write; Measure waits for the first round after a
//     start). This node takes the median of the offsets
//     it measured (its own counting as 0) and refuses when that median is
//     beyond MaxClockSkew (ErrClockSkew, a 503 with the offset). In a
//     cluster of three with one clock 30 s ahead, that node sees its peers
//     30 s behind and stops, while the two others see one peer ahead and
//     one at 0, a median of 0, and go on. With an even count the median
//     nearer 0 is taken. Offsets older than three intervals do not count.
//   - Verified (Verify, writes with ack of 2 or more): the clock lease. A
//     probe round in which a majority of the cluster (this node and at
//     least half of its peers, rounded down) measured within MaxClockSkew
//     of this clock, each offset counted with its error (half the ping's
//     round trip), verifies the clock for Lease from the round's start.
//     Until then, and once it lapses, this node refuses such writes
//     (ErrClockUnverified, with what it measured: a 503, or a 504 when
//     too few peers answered to tell, ErrTooFewPeers): at start-up
//     it verifies before it coordinates (the first write waits for a
//     round), and a node cut off from a majority stops once its lease
//     lapses. Within the lease, a step of this node's clock (its wall
//     reading moving unlike time.Now's monotonic one) counts against each
//     peer's offset at once, so a clock set 30 s ahead after a round is
//     refused by the next write, not the next round (a round during
//     which it stepped verifies nothing: its offsets hold the step
//     already). With at most one
//     clock off, every majority includes a correct clock, so a verified
//     clock is within MaxClockSkew of real time: CockroachDB's max-offset
//     rule (a node whose offset from a majority of its peers exceeds the
//     bound stops), made a precondition of every write instead of a
//     periodic check. A cluster of one has no peer to ask and is always
//     verified.
package probe

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/view"
	"github.com/dhtkv/dhtkv/internal/worker"
)

// ErrClockSkew refuses a write while this node's clock is off from its
// peers' by more than --max-clock-skew.
var ErrClockSkew = errors.New("this node's clock is off from its peers'")

// ErrClockUnverified refuses a write with ack of 2 or more while this
// node holds no clock lease: no majority of the cluster measured its
// clock within --max-clock-skew during the last --clock-lease.
var ErrClockUnverified = errors.New("this node's clock is not verified against a majority of the cluster")

// ErrTooFewPeers is ErrClockUnverified because too few peers answered
// within --clock-lease to verify the clock at all: the contract's 504
// (not enough nodes answered, as the write itself would find), where a
// clock the peers measured and did not vouch for is a 503.
var ErrTooFewPeers = errors.New("too few of its peers answered")

// Options configures the prober. Zero fields take the defaults noted
// (EnsureDefaults).
type Options struct {
	// Interval is how often every peer is pinged (default 1 s).
	Interval time.Duration
	// MaxClockSkew is how far this node's clock may be off from its
	// peers' before it refuses to coordinate writes (--max-clock-skew;
	// default 5 s).
	MaxClockSkew time.Duration
	// Lease is how long a probe round that verified this node's clock
	// against a majority lets it coordinate writes with ack of 2 or more,
	// from the round's start (--clock-lease; default 3 s, three rounds:
	// two may fail before it lapses). Longer keeps a node that lost its
	// peers writing longer (its writes then fail anyway); it does not
	// loosen the bound, which a step of the clock breaks at once.
	Lease time.Duration
	// Timeout is one ping's deadline (the node's --replica-timeout;
	// default 300 ms).
	Timeout time.Duration
	// Wall is the clock this node's versions are made from
	// (hlc.Clock.Wall; default time.Now), whose peers' offsets are
	// measured against it, and whose steps the lease watches.
	Wall func() time.Time
	// Formed is whether this node had seen every member answer in an
	// earlier run (its identity records it).
	Formed bool
	// RecordFormed persists that every member answered, the first time
	// they all did (nil: not persisted).
	RecordFormed func() error
}

// DefaultOptions returns the defaults the fields document.
func DefaultOptions() Options {
	o := Options{}
	o.EnsureDefaults()
	return o
}

// RegisterFlags defines the flags of the fields that have one, with their
// current values as defaults (MaxClockSkew is the node's
// --max-clock-skew, which its clock reads too).
func (o *Options) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&o.Lease, "clock-lease", o.Lease, "how long a probe round that measured this node's clock within --max-clock-skew of a majority of the cluster lets it coordinate writes with ack of 2 or more (503 without one)")
}

// Validate refuses settings that cannot work.
func (o *Options) Validate() error {
	interval := o.Interval
	if interval <= 0 {
		interval = DefaultOptions().Interval
	}
	if o.Lease <= interval {
		return fmt.Errorf("--clock-lease %v must exceed the probe interval %v: the lease would lapse between rounds", o.Lease, interval)
	}
	return nil
}

// EnsureDefaults fills the zero fields with their defaults.
func (o *Options) EnsureDefaults() {
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.MaxClockSkew <= 0 {
		o.MaxClockSkew = hlc.DefaultMaxAhead
	}
	if o.Lease <= 0 {
		o.Lease = 3 * o.Interval
	}
	if o.Timeout <= 0 {
		o.Timeout = 300 * time.Millisecond
	}
	if o.Wall == nil {
		o.Wall = time.Now
	}
}

// Prober pings the peers. Its methods are safe for concurrent use.
type Prober struct {
	views  func() *view.View
	o      Options
	skew   atomic.Int64 // the median offset while beyond MaxClockSkew, else 0 (ns)
	median atomic.Int64 // the last median offset, beyond the bound or not (ns)
	lease  atomic.Pointer[lease]
	formed atomic.Bool
	log    *slog.Logger
	m      *metrics
	work   *worker.Group

	// roundMu runs one round at a time, scheduled or asked for by Verify;
	// rounds counts those that ended.
	roundMu  sync.Mutex
	rounds   atomic.Uint64
	measured atomic.Int32 // how many peers the last round measured
	verified bool         // the last round's verdict, for logging changes (under roundMu)

	mu    sync.Mutex
	peers map[string]*peerState // by URL
}

// lease is a verification of this node's clock by one probe round: the
// peers measured within the bound during it.
type lease struct {
	start  time.Time // time.Now when the round began, with its monotonic reading
	wall   time.Time // this node's clock then (Options.Wall), without one
	agreed []view.ClockSample
}

// peerState is what the probes found of one peer.
type peerState struct {
	down       atomic.Bool // the last probe failed
	seen       atomic.Bool // a probe succeeded once
	rebuilding atomic.Bool // the last probe's answer: its replica rebuilds
	// The probes' last outcomes, for status (PeerStates).
	mu                sync.Mutex
	lastOK, lastErrAt time.Time
	lastErr           string
	settings          string // the last answer's view.PingAnswer.Settings
}

// New returns the prober of the peers of the views views returns. Start
// starts it.
func New(views func() *view.View, o Options, log *slog.Logger) *Prober {
	o.EnsureDefaults()
	p := &Prober{views: views, o: o, log: log, m: newMetrics(), work: worker.New(), peers: map[string]*peerState{}}
	if o.Formed {
		p.formed.Store(true)
		p.m.formed.Set(1)
	}
	return p
}

// Register adds the instruments to reg.
func (p *Prober) Register(reg prometheus.Registerer) {
	reg.MustRegister(p.m.formed,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dhtkv_clock_verified",
			Help: "1 while this node holds a clock lease (a majority of the cluster measured its clock within --max-clock-skew during the last --clock-lease): it coordinates writes with ack of 2 or more only then.",
		}, func() float64 {
			if p.leaseErr(time.Now()) != nil {
				return 0
			}
			return 1
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dhtkv_clock_offset_seconds",
			Help: "How far this node's clock is ahead of its peers' (behind: negative), by the median of the offsets the last probe round measured, this node's own counting as 0.",
		}, func() float64 { return -time.Duration(p.median.Load()).Seconds() }),
	)
}

// Start pings every peer now and then every Interval; Close stops it.
func (p *Prober) Start() {
	p.work.Every(p.o.Interval, func(context.Context) { p.nextRound(p.rounds.Load()) })
}

// Close stops the probes.
func (p *Prober) Close() { p.work.Stop() }

// state returns the state of the peer at url, made at its first probe.
func (p *Prober) state(url string) *peerState {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.peers[url]
	if s == nil {
		s = &peerState{}
		p.peers[url] = s
	}
	return s
}

// nextRound runs a round unless one ended since seen (the count of
// rounds ended when the caller looked), waiting for the one under way:
// callers that meet share one round.
func (p *Prober) nextRound(seen uint64) {
	p.roundMu.Lock()
	defer p.roundMu.Unlock()
	if p.rounds.Load() != seen {
		return
	}
	p.round()
	p.rounds.Add(1)
}

// round pings every peer at once and then judges this node's clock. The
// caller holds roundMu.
func (p *Prober) round() {
	start, wall, unc := p.reading()
	// A round's lease starts at its start and is stored at its end: a
	// ping deadline at or beyond the lease (Timeout is --replica-timeout)
	// would store every lease expired while one peer hangs. Interval is
	// below the lease (Validate).
	deadline := start.Add(min(p.o.Timeout, p.o.Interval))
	var wg sync.WaitGroup
	var failed atomic.Int32
	v := p.views()
	for i, peer := range v.Peers {
		if peer == nil {
			continue
		}
		s := p.state(v.URL(i))
		wg.Go(func() {
			a, err := peer.Ping(v.Epoch(), deadline)
			if err == nil {
				s.rebuilding.Store(a.Rebuilding)
				s.mu.Lock()
				s.settings = a.Settings
				s.mu.Unlock()
			}
			p.observeReachable(s, v.URL(i), err)
			if err != nil || !s.seen.Load() {
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	p.judge(v, time.Now())
	p.renew(v, start, wall, unc)
	p.noteFormed(failed.Load() == 0)
}

// noteFormed records, once, that every peer has answered. Rounds run one
// at a time, so it is never called concurrently.
func (p *Prober) noteFormed(allSeen bool) {
	if !allSeen || p.formed.Load() {
		return
	}
	if p.o.RecordFormed != nil {
		if err := p.o.RecordFormed(); err != nil {
			p.log.Error("record that the cluster is formed", "err", err)
			return
		}
	}
	p.formed.Store(true)
	p.m.formed.Set(1)
}

// Formed reports whether this node has seen every other member answer,
// in this run or an earlier one.
func (p *Prober) Formed() bool { return p.formed.Load() }

// judge sets the skew from the fresh offsets.
func (p *Prober) judge(v *view.View, now time.Time) {
	offsets := []time.Duration{0}
	for _, peer := range v.Peers {
		if peer == nil {
			continue
		}
		if s, ok := peer.ClockOffset(); ok && now.Sub(s.At) < 3*p.o.Interval {
			offsets = append(offsets, s.Offset)
		}
	}
	slices.Sort(offsets)
	median := offsets[len(offsets)/2]
	if len(offsets)%2 == 0 {
		if lower := offsets[len(offsets)/2-1]; lower.Abs() < median.Abs() {
			median = lower
		}
	}
	p.median.Store(int64(median))
	// The peers' clocks are median ahead of this one: this clock is off
	// by -median.
	var off time.Duration
	if median.Abs() > p.o.MaxClockSkew {
		off = -median
	}
	if prev := time.Duration(p.skew.Swap(int64(off))); (prev == 0) != (off == 0) {
		if off != 0 {
			p.log.Error("clock off from the peers': refusing to coordinate writes", "off", off, "max_clock_skew", p.o.MaxClockSkew)
		} else {
			p.log.Warn("clock back within the peers': coordinating writes again", "was_off", prev)
		}
	}
}

// maxRoundStep is the most this clock's wall reading may part from its
// monotonic one during a probe round for the round to make a lease: NTP
// slews both alike, and only a step moves one alone. A parting within it
// is the two readings' own distance, and leaseErr counts no step.
const maxRoundStep = time.Millisecond

// reading returns time.Now and this node's clock (without a monotonic
// reading) as of one instant, and how far from it either may be: half
// the time between two monotonic readings around the clock's. A
// goroutine descheduled between two readings would otherwise make their
// distance look like a step; it tries again, a few times, for a close
// pair.
func (p *Prober) reading() (mono, wall time.Time, unc time.Duration) {
	for i := range 3 {
		m := time.Now()
		w := p.o.Wall().Round(0)
		d := time.Since(m)
		if i == 0 || d/2 < unc {
			mono, wall, unc = m.Add(d/2), w, d/2
		}
		if unc < 50*time.Microsecond {
			break
		}
	}
	return mono, wall, unc
}

// quorum is how many peers must agree with this node's clock for a
// lease: with this node, a majority of the cluster's members.
func quorum(v *view.View) int { return len(v.Map.Nodes) / 2 }

// agrees reports whether a peer's measured offset, moved by step (how far
// this clock stepped since), is within the bound whatever its error.
func (p *Prober) agrees(s view.ClockSample, step time.Duration) bool {
	return (s.Offset-step).Abs()+s.Error <= p.o.MaxClockSkew
}

// renew makes the round that started at start (this node's clock then
// wall, both within unc of that instant) a lease if a quorum of peers
// measured during it agreed with this clock. A round that measured
// enough peers but not a quorum in agreement ends the lease; one that
// reached too few to tell leaves it to lapse. The caller holds roundMu.
func (p *Prober) renew(v *view.View, start, wall time.Time, unc time.Duration) {
	need, measured := quorum(v), 0
	if need == 0 {
		return // a cluster of one: always verified
	}
	var agreed []view.ClockSample
	// stepped is the largest parting of this clock from the monotonic one
	// since the round's start, at a sample or at the end, beyond what the
	// readings' uncertainties allow (0: none).
	var stepped time.Duration
	limit := maxRoundStep + unc
	note := func(d, err time.Duration) {
		if d.Abs() > limit+err && d.Abs() > stepped.Abs() {
			stepped = d
		}
	}
	for _, peer := range v.Peers {
		if peer == nil {
			continue
		}
		s, ok := peer.ClockOffset()
		if !ok || s.At.Before(start) {
			continue
		}
		measured++
		if !s.Wall.IsZero() {
			note(s.Wall.Sub(wall)-s.At.Sub(start), s.WallErr)
		}
		if p.agrees(s, 0) {
			agreed = append(agreed, s)
		}
	}
	p.measured.Store(int32(measured))
	// A step of this clock during the round (its wall reading moving
	// unlike the monotonic one) leaves offsets measured with the clock
	// elsewhere than at the round's start, against which leaseErr would
	// count it once more (stepped back 4 s within the round, then ahead
	// 10 s: a clock 6 s ahead read as 2 s off). Such a round verifies
	// nothing and ends nothing: the lease before it, measured before the
	// step, counts it (leaseErr), and the next round measures afresh. A
	// step is seen at the round's end, read after the offsets, and at
	// each sample (ClockSample.Wall), where a step undone within the
	// round shows although both ends agree.
	endMono, endWall, endUnc := p.reading()
	note(endWall.Sub(wall)-endMono.Sub(start), endUnc)
	if stepped != 0 {
		p.log.Warn("clock stepped during a probe round: the round verifies nothing", "step", stepped.Round(time.Millisecond))
		return
	}
	verified := len(agreed) >= need
	switch {
	case verified:
		p.lease.Store(&lease{start: start, wall: wall, agreed: agreed})
	case measured >= need:
		p.lease.Store(nil)
	}
	if verified != p.verified {
		p.verified = verified
		if verified {
			p.log.Info("clock verified against a majority of the cluster: coordinating writes", "peers_within_bound", len(agreed), "needed", need)
		} else {
			p.log.Warn("clock not verified by this round: writes with ack of 2 or more are refused once the lease lapses",
				"peers_measured", measured, "peers_within_bound", len(agreed), "needed", need, "max_clock_skew", p.o.MaxClockSkew)
		}
	}
}

// Check returns ErrClockSkew while the clock is off: the median of the
// peers' offsets is beyond the bound. Every write is refused then.
func (p *Prober) Check() error {
	if off := time.Duration(p.skew.Load()); off != 0 {
		return fmt.Errorf("%w by %v (more than --max-clock-skew %v): refusing to coordinate writes", ErrClockSkew, off.Round(time.Millisecond), p.o.MaxClockSkew)
	}
	return nil
}

// Measure is Check once this node has measured its peers since it
// started: before its first probe round ended it waits for one (the one
// under way, or its own), so that a clock off at start-up is found before
// the first write (ack=1 writes; a round that reaches too few peers to
// tell leaves them allowed).
func (p *Prober) Measure() error {
	if p.rounds.Load() == 0 {
		p.nextRound(0)
	}
	return p.Check()
}

// Verify returns nil while this node's clock is verified: it holds a
// lease (see the package comment), or is a cluster of one. Without one it
// waits for a probe round (the one under way, or one of its own) and
// looks again, so that a node verifies before it coordinates rather than
// refuse the first writes after a start. It returns ErrClockSkew while
// the clock is off, ErrClockUnverified while it is not verified.
func (p *Prober) Verify() error {
	if err := p.Check(); err != nil {
		return err
	}
	if p.leaseErr(time.Now()) == nil {
		return nil
	}
	p.nextRound(p.rounds.Load())
	if err := p.Check(); err != nil {
		return err
	}
	return p.leaseErr(time.Now())
}

// leaseErr returns nil if the lease holds at now (time.Now, with its
// monotonic reading), else ErrClockUnverified with why.
func (p *Prober) leaseErr(now time.Time) error {
	v := p.views()
	need := quorum(v)
	if need == 0 {
		return nil
	}
	l := p.lease.Load()
	var why string
	switch {
	case l == nil:
		why = "no probe round measured a majority within the bound"
	case now.Sub(l.start) >= p.o.Lease:
		why = fmt.Sprintf("the round that last verified it began %v ago (--clock-lease %v)", now.Sub(l.start).Round(time.Millisecond), p.o.Lease)
	default:
		step := p.o.Wall().Round(0).Sub(l.wall) - now.Sub(l.start)
		if step.Abs() <= maxRoundStep {
			step = 0 // the two clocks' readings' own distance, not a step
		}
		agreed := 0
		for _, s := range l.agreed {
			if p.agrees(s, step) {
				agreed++
			}
		}
		if agreed >= need {
			return nil
		}
		why = fmt.Sprintf("it stepped by %v since it was verified", step.Round(time.Millisecond))
	}
	err := fmt.Errorf("%s; %d of its %d peers must be within --max-clock-skew %v (measured: %s): refusing to coordinate writes with ack of 2 or more",
		why, need, len(v.Map.Nodes)-1, p.o.MaxClockSkew, p.offsets(v, now))
	// The last round measured enough peers and they did not vouch for
	// this clock (503), or it measured too few to tell (504), however
	// recently other exchanges heard from them.
	if int(p.measured.Load()) < need {
		return fmt.Errorf("%w: %w: %w", ErrClockUnverified, ErrTooFewPeers, err)
	}
	return fmt.Errorf("%w: %w", ErrClockUnverified, err)
}

// offsets describes each peer's last measured offset, for an error.
func (p *Prober) offsets(v *view.View, now time.Time) string {
	var b strings.Builder
	for i, peer := range v.Peers {
		if peer == nil {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString(v.URL(i))
		if s, ok := peer.ClockOffset(); ok {
			fmt.Fprintf(&b, " %v ±%v, %v ago", s.Offset.Round(time.Millisecond), s.Error.Round(time.Millisecond), now.Sub(s.At).Round(time.Millisecond))
		} else {
			b.WriteString(" never")
		}
	}
	return b.String()
}

// observeReachable records a probe's outcome and logs a change: a peer
// that stops answering (a warning), one that answers again, and, at
// information level, one that has not answered since this node started
// (in a cluster starting up, its peers may simply not be up yet).
func (p *Prober) observeReachable(s *peerState, url string, err error) {
	down := err != nil
	seen := s.seen.Load()
	if !down {
		s.seen.Store(true)
	}
	s.mu.Lock()
	if down {
		s.lastErr, s.lastErrAt = err.Error(), time.Now()
	} else {
		s.lastOK = time.Now()
	}
	s.mu.Unlock()
	if s.down.Swap(down) == down {
		return
	}
	switch {
	case down && refused(err):
		// It answers, and refuses this node (a 4xx: its cluster secret or
		// its CA is not this node's): a configuration to fix, not a peer
		// still starting.
		p.log.Warn("peer refuses this node", "peer", url, "err", err)
	case down && seen:
		p.log.Warn("peer not answering", "peer", url, "err", err)
	case down:
		p.log.Info("peer not answering yet", "peer", url, "err", err)
	case seen:
		p.log.Info("peer answering again", "peer", url)
	}
}

// refused reports whether err is a peer's answer that refuses this node
// (a 4xx, which rpc's status errors say by Refused): the peer is up, and
// its configuration and this node's disagree.
func refused(err error) bool {
	var r interface{ Refused() bool }
	return errors.As(err, &r) && r.Refused()
}

// ClockWarning says why this node refuses writes, or "" when it does not:
// its clock is off, or not verified (in a cluster of more than one node).
// It does not run a round.
func (p *Prober) ClockWarning() string {
	if err := p.Check(); err != nil {
		return err.Error()
	}
	if err := p.leaseErr(time.Now()); err != nil {
		return err.Error()
	}
	return ""
}

// PeerState is what this node knows of another's reachability, from its
// probes.
type PeerState struct {
	URL       string
	Probed    bool // a probe has ended since this node started
	Reachable bool // the last probe succeeded
	// Rebuilding: the last answer said its replica is rebuilding after a
	// lost disk, and refuses reads until done.
	Rebuilding bool
	// Settings: the last answer's settings that every node must share
	// (view.PingAnswer.Settings; "": not said, or no answer since start).
	Settings  string
	LastOK    time.Time // the last probe that succeeded (zero: none since start)
	LastError string    // the last probe that failed ("" : none since start)
	LastErrAt time.Time
}

// PeerStates returns every peer's state, in topology order (this node is
// left out).
func (p *Prober) PeerStates() []PeerState {
	var out []PeerState
	v := p.views()
	for i, peer := range v.Peers {
		if peer == nil {
			continue
		}
		s := p.state(v.URL(i))
		s.mu.Lock()
		out = append(out, PeerState{
			URL: v.URL(i), Probed: !s.lastOK.IsZero() || !s.lastErrAt.IsZero(),
			Reachable: s.seen.Load() && !s.down.Load(), Rebuilding: s.rebuilding.Load(),
			LastOK: s.lastOK, LastError: s.lastErr, LastErrAt: s.lastErrAt, Settings: s.settings,
		})
		s.mu.Unlock()
	}
	return out
}

// metrics are the prober's instruments.
type metrics struct {
	// formed is 1 once every peer has answered.
	formed prometheus.Gauge
}

func newMetrics() *metrics {
	return &metrics{formed: prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "dhtkv_cluster_formed",
		Help: "1 once this node has seen every other node answer: a member starting with an empty data directory from then on rebuilds before serving reads.",
	})}
}

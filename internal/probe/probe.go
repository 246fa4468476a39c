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
// behind makes writes that lose to earlier ones. So a node whose clock is
// off from its peers' by more than MaxClockSkew refuses to coordinate
// writes (ErrClockSkew, a 503 with the reason) until it is back. Which
// clock is off is decided by the median: this node takes the median of the
// offsets it measured (its own counting as 0) and refuses when that median
// is beyond the bound. In a cluster of three with one clock 30 s ahead,
// that node sees its peers 30 s behind and stops, while the two others
// see one peer ahead and one at 0, a median of 0, and go on. With an even
// count the median nearer 0 is taken, so in a cluster of two neither
// refuses: two clocks cannot say which one is wrong (the replicas' own
// bound on versions ahead of them still applies). Offsets older than
// three probe intervals do not count.
package probe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
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

// Options configures the prober. Zero fields take the defaults noted
// (EnsureDefaults).
type Options struct {
	// Interval is how often every peer is pinged (default 1 s).
	Interval time.Duration
	// MaxClockSkew is how far this node's clock may be off from its
	// peers' before it refuses to coordinate writes (--max-clock-skew;
	// default 5 s).
	MaxClockSkew time.Duration
	// Timeout is one ping's deadline (the node's --replica-timeout;
	// default 300 ms).
	Timeout time.Duration
	// Formed is whether this node had seen every member answer in an
	// earlier run (its identity records it).
	Formed bool
	// RecordFormed persists that every member answered, the first time
	// they all did (nil: not persisted).
	RecordFormed func() error
}

// EnsureDefaults fills the zero fields with their defaults.
func (o *Options) EnsureDefaults() {
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.MaxClockSkew <= 0 {
		o.MaxClockSkew = hlc.DefaultMaxAhead
	}
	if o.Timeout <= 0 {
		o.Timeout = 300 * time.Millisecond
	}
}

// Prober pings the peers. Its methods are safe for concurrent use.
type Prober struct {
	views  func() *view.View
	o      Options
	skew   atomic.Int64 // the median offset while beyond MaxClockSkew, else 0 (ns)
	formed atomic.Bool
	log    *slog.Logger
	m      *metrics
	work   *worker.Group

	mu    sync.Mutex
	peers map[string]*peerState // by URL
}

// peerState is what the probes found of one peer.
type peerState struct {
	down atomic.Bool // the last probe failed
	seen atomic.Bool // a probe succeeded once
	// The probes' last outcomes, for status (PeerStates).
	mu                sync.Mutex
	lastOK, lastErrAt time.Time
	lastErr           string
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
func (p *Prober) Register(reg prometheus.Registerer) { reg.MustRegister(p.m.formed) }

// Start pings every peer now and then every Interval; Close stops it.
func (p *Prober) Start() { p.work.Every(p.o.Interval, func(context.Context) { p.round() }) }

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

// round pings every peer at once and then judges this node's clock.
func (p *Prober) round() {
	var wg sync.WaitGroup
	var failed atomic.Int32
	v := p.views()
	for i, peer := range v.Peers {
		if peer == nil {
			continue
		}
		s := p.state(v.URL(i))
		wg.Go(func() {
			_, err := peer.Ping(v.Epoch(), time.Now().Add(p.o.Timeout))
			p.observeReachable(s, v.URL(i), err)
			if err != nil || !s.seen.Load() {
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	p.judge(v, time.Now())
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
		if off, at, ok := peer.ClockOffset(); ok && now.Sub(at) < 3*p.o.Interval {
			offsets = append(offsets, off)
		}
	}
	slices.Sort(offsets)
	median := offsets[len(offsets)/2]
	if len(offsets)%2 == 0 {
		if lower := offsets[len(offsets)/2-1]; lower.Abs() < median.Abs() {
			median = lower
		}
	}
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

// Check returns ErrClockSkew while the clock is off.
func (p *Prober) Check() error {
	if off := time.Duration(p.skew.Load()); off != 0 {
		return fmt.Errorf("%w by %v (more than --max-clock-skew %v): refusing to coordinate writes", ErrClockSkew, off.Round(time.Millisecond), p.o.MaxClockSkew)
	}
	return nil
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
	case down && seen:
		p.log.Warn("peer not answering", "peer", url, "err", err)
	case down:
		p.log.Info("peer not answering yet", "peer", url, "err", err)
	case seen:
		p.log.Info("peer answering again", "peer", url)
	}
}

// ClockWarning says why this node refuses writes, or "" when it does not.
func (p *Prober) ClockWarning() string {
	if err := p.Check(); err != nil {
		return err.Error()
	}
	return ""
}

// PeerState is what this node knows of another's reachability, from its
// probes.
type PeerState struct {
	URL       string
	Probed    bool      // a probe has ended since this node started
	Reachable bool      // the last probe succeeded
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
			Reachable: s.seen.Load() && !s.down.Load(),
			LastOK:    s.lastOK, LastError: s.lastErr, LastErrAt: s.lastErrAt,
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

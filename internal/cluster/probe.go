package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The probe
//
// Every ProbeInterval the coordinator pings each peer (an empty batch).
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

// ErrClockSkew refuses a write while this node's clock is off from its
// peers' by more than --max-clock-skew.
var ErrClockSkew = errors.New("this node's clock is off from its peers'")

type prober struct {
	c        *Coordinator
	interval time.Duration
	maxSkew  time.Duration
	skew     atomic.Int64 // the median offset while beyond maxSkew, else 0 (ns)

	ctx    context.Context
	cancel context.CancelFunc
	done   sync.WaitGroup
}

func newProber(c *Coordinator, interval, maxSkew time.Duration) *prober {
	ctx, cancel := context.WithCancel(context.Background())
	return &prober{c: c, interval: interval, maxSkew: maxSkew, ctx: ctx, cancel: cancel}
}

func (p *prober) start() {
	p.done.Add(1)
	go p.run()
}

func (p *prober) close() {
	p.cancel()
	p.done.Wait()
}

func (p *prober) run() {
	defer p.done.Done()
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for {
		p.round()
		select {
		case <-p.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// round pings every peer at once and then judges this node's clock.
func (p *prober) round() {
	var wg sync.WaitGroup
	var failed atomic.Int32
	v := p.c.v()
	for i, peer := range v.peers {
		if peer == nil {
			continue
		}
		wg.Go(func() {
			_, err := peer.client.Ping(v.m.Epoch, time.Now().Add(p.c.timeout))
			peer.observeReachable(p.c, v.url(i), err)
			if err != nil || !peer.seen.Load() {
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	p.judge(time.Now())
	p.noteFormed(failed.Load() == 0)
}

// noteFormed records, once, that every peer has answered.
func (p *prober) noteFormed(allSeen bool) {
	c := p.c
	if !allSeen || c.formed.Load() {
		return
	}
	c.formedMu.Lock()
	defer c.formedMu.Unlock()
	if c.recordFormed == nil {
		return // not known yet whether it was recorded before (node start)
	}
	if err := c.recordFormed(); err != nil {
		c.log.Error("record that the cluster is formed", "err", err)
		return
	}
	c.formed.Store(true)
	c.m.formed.Set(1)
}

// judge sets the skew from the fresh offsets.
func (p *prober) judge(now time.Time) {
	offsets := []time.Duration{0}
	for _, peer := range p.c.v().peers {
		if peer == nil {
			continue
		}
		if off, at, ok := peer.client.ClockOffset(); ok && now.Sub(at) < 3*p.interval {
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
	if median.Abs() > p.maxSkew {
		off = -median
	}
	if prev := time.Duration(p.skew.Swap(int64(off))); (prev == 0) != (off == 0) {
		if off != 0 {
			p.c.log.Error("clock off from the peers': refusing to coordinate writes", "off", off, "max_clock_skew", p.maxSkew)
		} else {
			p.c.log.Warn("clock back within the peers': coordinating writes again", "was_off", prev)
		}
	}
}

// check returns ErrClockSkew while the clock is off.
func (p *prober) check() error {
	if off := time.Duration(p.skew.Load()); off != 0 {
		return fmt.Errorf("%w by %v (more than --max-clock-skew %v): refusing to coordinate writes", ErrClockSkew, off.Round(time.Millisecond), p.maxSkew)
	}
	return nil
}

// observeReachable records a probe's outcome and logs a change: a peer
// that stops answering (a warning), one that answers again, and, at
// information level, one that has not answered since this node started
// (in a cluster starting up, its peers may simply not be up yet).
func (p *peer) observeReachable(c *Coordinator, url string, err error) {
	down := err != nil
	seen := p.seen.Load()
	if !down {
		p.seen.Store(true)
	}
	p.stateMu.Lock()
	if down {
		p.lastErr, p.lastErrAt = err.Error(), time.Now()
	} else {
		p.lastOK = time.Now()
	}
	p.stateMu.Unlock()
	if p.down.Swap(down) == down {
		return
	}
	switch {
	case down && seen:
		c.log.Warn("peer not answering", "peer", url, "err", err)
	case down:
		c.log.Info("peer not answering yet", "peer", url, "err", err)
	case seen:
		c.log.Info("peer answering again", "peer", url)
	}
}

// ClockWarning says why this node refuses writes, or "" when it does not.
func (c *Coordinator) ClockWarning() string {
	if err := c.probe.check(); err != nil {
		return err.Error()
	}
	return ""
}

// Warnings are what an operator must know about this node, one line each
// (empty when all is well): a clock off from the peers', a rebuild under
// way.
func (c *Coordinator) Warnings() []string {
	var ws []string
	if w := c.ClockWarning(); w != "" {
		ws = append(ws, w)
	}
	if c.Rebuilding() {
		ws = append(ws, "rebuilding: copying this node's share from its peers; its replica is not read until done")
	}
	return append(ws, c.ae.warnings(time.Now())...)
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
func (c *Coordinator) PeerStates() []PeerState {
	var out []PeerState
	v := c.v()
	for i, p := range v.peers {
		if p == nil {
			continue
		}
		p.stateMu.Lock()
		out = append(out, PeerState{
			URL: v.url(i), Probed: !p.lastOK.IsZero() || !p.lastErrAt.IsZero(),
			Reachable: p.seen.Load() && !p.down.Load(),
			LastOK:    p.lastOK, LastError: p.lastErr, LastErrAt: p.lastErrAt,
		})
		p.stateMu.Unlock()
	}
	return out
}

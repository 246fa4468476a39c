// Package hlc implements the hybrid logical clock that versions dhtkv's
// writes.
//
// A version is a uint64 laid out as
//
//	bits 63..20  wall-clock milliseconds since the Unix epoch (44 bits: until year 2527)
//	bits 19..8   logical counter (12 bits: 4096 writes per millisecond per node)
//	bits  7..0   node id (0..255)
//
// Versions are strictly increasing on one node even when the wall clock
// stalls or steps back (the logical counter, then the millisecond, advance),
// unique across nodes (the node id is the tie-break), and monotonic with
// causality: a node that observes a version from another node (Observe) never
// issues a smaller one afterwards. Two writes in the same millisecond from
// different coordinators are therefore still ordered, deterministically, by
// the node id. Comparing versions is plain integer comparison.
//
// Across restarts: with Restore, the clock keeps a persisted upper bound of
// every version it has issued or observed, written before any version beyond
// it is used, and restarts from that bound. Since a node stores only versions
// its clock issued or observed, versions issued after a restart are newer
// than everything already stored, even if the wall clock is behind them (a
// peer's clock ran ahead, or the wall clock stepped back).
//
// The bound runs at most PersistWindow ahead of the clock, so a restart
// finds it at most that far ahead of the versions issued before; Restore
// reports how far ahead of the wall clock it is, and the node waits that
// out before serving. Versions after a restart are then wall-clock
// versions again: restarts do not push the clock ahead, however many there
// are in a row.
//
// Skew: a version more than the clock's MaxAhead ahead of this node's wall
// clock is refused (ErrTooFarAhead), never observed.
package hlc

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

const (
	nodeBits    = 8
	logicalBits = 12
	// MaxNodeID is the largest node id a version can carry.
	MaxNodeID  = 1<<nodeBits - 1
	logicalMax = 1<<logicalBits - 1
)

// Clock issues versions. The zero value is not usable; call New.
type Clock struct {
	node     uint64
	now      func() time.Time
	maxAhead time.Duration

	mu      sync.Mutex
	last    uint64 // last issued or observed version, node bits cleared
	bound   uint64 // persisted upper bound of last (0: not persisting)
	persist func(bound uint64) error
	// renewing: a caller is writing a new bound, without mu (renew).
	// renewed (on mu) is broadcast when it is done.
	renewing bool
	renewed  sync.Cond
	stats    Stats
}

// Stats counts the clock's writes of its bound and the calls that waited
// for one: what the bound costs the requests (Clock.Stats).
type Stats struct {
	// Renewals counts the writes of the bound, Failed those that failed.
	Renewals, Failed uint64
	// RenewalTime is their time in all: each one's caller waited for it.
	RenewalTime time.Duration
	// Waits counts the calls that waited for another caller's write (their
	// version was beyond the bound written), and WaitTime their time.
	Waits    uint64
	WaitTime time.Duration
}

// Stats returns the clock's counts so far.
func (c *Clock) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// PersistWindow is how far ahead of the clock the persisted bound is set.
// A restart waits out at most this long before the node's versions are
// the wall clock's. Under a steady stream of versions the bound is
// renewed (one synced Pebble write) about every half window: the caller
// whose version passes the bound's first half writes the next bound and
// waits for it, without holding the clock, while the others go on with
// versions within the bound already written. A caller waits for a write
// only when its version is beyond the bound written: after a pause longer
// than a window (the first caller writes, those arriving meanwhile wait
// for it), for an observed version well ahead of the bound, and while
// the disk takes longer than half a window to sync. The clock's mutex is
// never held across an fsync, which a busy disk makes long and every
// request (writes, and reads observing their replicas' versions) would
// wait behind.
const PersistWindow = 100 * time.Millisecond

const persistWindow = uint64(PersistWindow/time.Millisecond) << (logicalBits + nodeBits)

// New returns a clock for node id (0..MaxNodeID). now may be nil for the
// wall clock; tests pass a fake.
func New(node int, now func() time.Time) (*Clock, error) {
	if node < 0 || node > MaxNodeID {
		return nil, fmt.Errorf("hlc: node id %d out of range 0..%d", node, MaxNodeID)
	}
	if now == nil {
		now = time.Now
	}
	c := &Clock{node: uint64(node), now: now, maxAhead: DefaultMaxAhead}
	c.renewed.L = &c.mu
	return c, nil
}

// SetMaxAhead sets how far ahead of this node's wall clock a version from
// elsewhere may be (--max-clock-skew; default DefaultMaxAhead). Call it
// before the clock is used.
func (c *Clock) SetMaxAhead(d time.Duration) { c.maxAhead = d }

// MaxAhead is the bound SetMaxAhead set.
func (c *Clock) MaxAhead() time.Duration { return c.maxAhead }

// Restore makes the clock durable: it starts above bound (the last bound
// persisted, 0 for none) and calls persist with a new bound, before using
// any version beyond the current one. Call it before the clock is used.
//
// It returns how far bound is ahead of the wall clock (0 if it is not).
// Up to PersistWindow that is the window of the last run: waiting it out
// before issuing versions keeps them the wall clock's. More means the
// clock had observed versions from a clock running ahead (or this one
// stepped back), and versions continue from the bound.
func (c *Clock) Restore(bound uint64, persist func(bound uint64) error) (ahead time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	bound &^= MaxNodeID
	if bound > c.last {
		c.last = bound
	}
	c.bound, c.persist = bound, persist
	ms, _, _ := Parts(bound)
	return max(time.Duration(ms-c.now().UnixMilli())*time.Millisecond, 0)
}

// covered reports whether v (node bits cleared) may be used: it is within
// the persisted bound. The caller holds mu, and a true comes back without
// mu having been released, so that the caller may use v at once. A v
// past the bound's first half renews the bound, unless it is within the
// bound and a renewal is under way or this call made one already
// (*renewed); a v beyond the bound waits for the renewal under way, or
// makes one. Both release mu meanwhile and return false: the caller must
// look again, as the clock may have moved. The error is a failed renewal
// that v needed.
func (c *Clock) covered(v uint64, renewed *bool) (bool, error) {
	if c.persist == nil || v+persistWindow/2 <= c.bound {
		return true, nil
	}
	if v <= c.bound && (c.renewing || *renewed) {
		return true, nil
	}
	if c.renewing {
		start := time.Now()
		c.renewed.Wait()
		c.stats.Waits++
		c.stats.WaitTime += time.Since(start)
		return false, nil
	}
	*renewed = true
	if err := c.renew(v + persistWindow); err != nil && v > c.bound {
		return false, fmt.Errorf("hlc: persist clock bound: %w", err)
	}
	// Renewed, or failed with v still within the old bound (usable; a
	// later call tries the renewal again): look again either way.
	return false, nil
}

// renew persists nb as the bound, with mu released during the write. The
// caller holds mu and no renewal is under way.
func (c *Clock) renew(nb uint64) error {
	c.renewing = true
	c.mu.Unlock()
	start := time.Now()
	err := c.persist(nb)
	took := time.Since(start)
	c.mu.Lock()
	c.renewing = false
	c.stats.Renewals++
	c.stats.RenewalTime += took
	if err != nil {
		c.stats.Failed++
	} else if nb > c.bound {
		c.bound = nb
	}
	c.renewed.Broadcast()
	return err
}

// Next returns a version greater than every version this clock has issued or
// observed, since Restore's bound if it was restored.
func (c *Clock) Next() (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	renewed, waited := false, false
	begun := uint64(0)
	for {
		wall := uint64(c.now().UnixMilli()) << (logicalBits + nodeBits)
		if begun == 0 {
			begun = wall // the wall clock when this call began
		}
		v := c.last + 1<<nodeBits // same millisecond: next logical tick
		if wall > v {
			v = wall
		}
		if waited && v > c.bound {
			// After a wait for a renewal, the version the bound written
			// was made for (the bound less a window), rather than the
			// wall clock: a disk slower than a window would otherwise
			// leave every caller chasing a bound that the wall clock has
			// passed again by the time it is durable. The version then
			// lags the wall clock by the disk's delay, as a version made
			// before a synchronous write of its bound does; not by the
			// time since the last version (c.last may be an hour old),
			// and never below the wall clock when this call began: a
			// write's version is at least its coordinator's clock when
			// it was asked (docs/replication.md, the clock rules' rule
			// 3), and a bound's write slower than a window would break
			// that.
			v = max(c.last+1<<nodeBits, c.bound-min(c.bound, persistWindow), begun)
		}
		// Overflowing the logical counter carries into the millisecond
		// field, which makes this clock run slightly ahead of the wall
		// clock: allowed by the HLC, and it keeps versions strictly
		// increasing.
		ok, err := c.covered(v, &renewed)
		if err != nil {
			return 0, err
		}
		if ok {
			c.last = v
			return v | c.node, nil
		}
		waited = true
	}
}

// DefaultMaxAhead bounds how far ahead of this node's wall clock a version
// from elsewhere may be, unless SetMaxAhead says otherwise. Observing a
// version drags the clock, and every later version, up to it: a forged or
// skewed one would make this node's writes lose to it for that long, and
// one near the top of the 64-bit range would make the clock's arithmetic
// wrap around. Clocks kept by NTP differ by milliseconds; 500 ms is
// CockroachDB's default maximum offset, room for a bad minute of NTP, not
// for a clock that is off. It is also how long a failed write waits
// before it answers (cluster.Coordinator.Write), so it is kept small.
const DefaultMaxAhead = 500 * time.Millisecond

// ErrTooFarAhead refuses a version more than MaxAhead ahead of the wall
// clock.
var ErrTooFarAhead = errors.New("version too far ahead of the wall clock")

// CheckAhead returns ErrTooFarAhead for a version beyond MaxAhead.
func (c *Clock) CheckAhead(v uint64) error {
	ms, _, _ := Parts(v)
	if limit := c.now().Add(c.maxAhead).UnixMilli(); ms > limit {
		return fmt.Errorf("%w: %d ms ahead, at most %v", ErrTooFarAhead, ms-limit+c.maxAhead.Milliseconds(), c.maxAhead)
	}
	return nil
}

// Observe advances the clock past a version seen from another node, so that
// writes this node coordinates later are ordered after it. A node must
// observe a version before storing it (the restart guarantee relies on it).
// A version beyond MaxAhead is refused with ErrTooFarAhead and not observed.
func (c *Clock) Observe(v uint64) error {
	if err := c.CheckAhead(v); err != nil {
		return err
	}
	v &^= MaxNodeID
	c.mu.Lock()
	defer c.mu.Unlock()
	renewed := false
	for v > c.last { // looked at again after covered released mu
		ok, err := c.covered(v, &renewed)
		if err != nil {
			return err
		}
		if ok {
			c.last = v
		}
	}
	return nil
}

// Wall is the wall clock this clock's versions are made from.
func (c *Clock) Wall() time.Time { return c.now() }

// VersionAt is the smallest version of time t: every version issued at t
// or later is at least this.
func VersionAt(t time.Time) uint64 { return uint64(t.UnixMilli()) << (logicalBits + nodeBits) }

// TimeOf is the wall-clock time a version was issued at (to the
// millisecond): the inverse of VersionAt.
func TimeOf(v uint64) time.Time { return time.UnixMilli(int64(v >> (logicalBits + nodeBits))) }

// Parts splits a version into its fields, for logs and tests.
func Parts(v uint64) (ms int64, logical int, node int) {
	return int64(v >> (logicalBits + nodeBits)), int(v>>nodeBits) & logicalMax, int(v & MaxNodeID)
}

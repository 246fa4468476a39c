package membership

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/maplog"
)

// Changes through the map's log (docs/membership.md, "The map on a
// consensus log"). The service drives no change of its own:
//
//   - a change asked of this node (Join, Decommission, Replace, Abort) is
//     a command of the log made from the log's current epoch, answered
//     with the log's real outcome: accepted with its first map, or
//     refused with the reason (two changes asked at once: one accepted,
//     the other refused, never both and never one silently lost);
//   - follow installs every map the log applies, behind the same gate as
//     any map (install), and only then acknowledges its epoch to the log
//     (Log.Ack); in the stream stage it reports the copy of the gained
//     partitions once the mover finished it (Log.Copied). The log itself
//     advances a stage once every member of it acknowledged, so a stage
//     never advances on "some node has a higher epoch".
//
// Maps still reach peers the old way too (a refusal's map, Behind's
// push): every map installed comes from the log, so that is a catch-up
// path, and what a node acknowledges is only what it installed.

// logCallTimeout bounds one call into the log from the service (an
// acknowledgement, a copy report, a change asked by an operator): the
// log retries while it has no leader, and follow looks at the log's
// newest state again after this.
const logCallTimeout = 30 * time.Second

// logRetry is the wait before follow tries a failed acknowledgement or
// install again.
const logRetry = 200 * time.Millisecond

// follow installs the log's maps and acknowledges them, until ctx ends
// or this node is out of the map.
func (s *Service) follow(ctx context.Context) {
	l := s.o.Log
	for {
		st, changed := l.Watch()
		ok := s.followOnce(ctx, st)
		if v := s.View(); v.Self < 0 {
			return
		}
		var retry <-chan time.Time
		if !ok {
			retry = time.After(logRetry)
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-s.kick:
		case <-retry:
		}
	}
}

// followOnce does what the log's state st asks of this node; false when
// something failed or waits (an acknowledgement held while the node
// rebuilds) and is to be tried again.
func (s *Service) followOnce(ctx context.Context, st *maplog.State) bool {
	m := st.Map
	held := false
	if m != nil {
		if _, err := s.install(m); err != nil {
			s.log.Warn("membership: install the log's cluster map", "map", m.String(), "err", err)
			return false
		}
		// Another map of the log's epoch (a seed of other settings, say
		// --replicas, or one an earlier release made in a rolling
		// upgrade): acknowledged, the log would count this node as
		// routing by its map while it routes by other replica sets. The
		// log's is the cluster's.
		if cur := s.View().Map; cur.Epoch == m.Epoch && !bytes.Equal(cur.Encode(), m.Encode()) {
			s.log.Warn("membership: this node holds another cluster map of the log's epoch; installing the log's",
				"installed", cur.String(), "replicas", cur.Replicas, "log", m.String(), "log_replicas", m.Replicas)
			if _, err := s.installMap(m, true); err != nil {
				s.log.Warn("membership: install the log's cluster map", "map", m.String(), "err", err)
				return false
			}
		}
	}
	v := s.View()
	if v.Self < 0 || v.Map == nil {
		return true
	}
	// The members of the installed map are routes to the log's leader
	// when this replica knows none: a node that joined while cut off from
	// the leader holds the map a member gave it, and neither the log's
	// configuration nor its map yet, and must acknowledge that map for
	// the change to go on (maplog.Log.SetPeers).
	s.o.Log.SetPeers(v.Map)
	if m != nil && !st.Changed && v.Map.Cluster == m.Cluster && v.Map.Epoch > m.Epoch {
		// A rolling upgrade: members still on a release without the log
		// changed the map (their changes are the only ones: the log
		// refuses every change until every member acknowledged its map,
		// which only a member running the log does). While the log holds
		// only seeds it takes the newer map as its seed (the seed rule),
		// so that once every member runs the log, its map is the
		// cluster's. See docs/membership.md, "Upgrading to the log".
		if !s.reseed(ctx, v.Map) {
			return false
		}
	}
	// Only what this node installed. It may be ahead of this replica of
	// the log (a map a peer pushed while the leader cannot reach this
	// node): every map installed came from the log, whose rule refuses an
	// acknowledgement of an epoch it does not hold, and the command
	// reaches the leader through another member if need be (Submit).
	//
	// A node that rebuilds its share (a new machine that took a dead
	// member's id) acknowledges no stage of a change until it holds its
	// partitions of both sets: the rebuild copies from every peer the
	// partitions both hold in the old or the new set (placement.Sets.Shared),
	// so each from every other replica of each set. Acknowledged earlier,
	// the change could end while this node holds nothing, and the old set
	// would then drop its copies of the partitions this node holds in the
	// new set: their acknowledged writes would be left on fewer replicas
	// than a write's ack (with ack=2 of 3, on one) until the rebuild ends.
	// Held, the old set keeps them until the new set is whole again.
	if e := v.Map.Epoch; st.Acks[v.Self] < e {
		if v.Map.Change != nil && s.o.Rebuilding() {
			if s.held.Swap(e) != e {
				s.log.Info("membership: rebuilding; the change's stage waits for this node's acknowledgement until its partitions of both sets are copied",
					"map", v.Map.String())
			}
			held = true
		} else if !s.report(ctx, "acknowledge", e, s.o.Log.Ack) {
			return false
		}
	}
	if ch := v.Map.Change; ch != nil && ch.Stage == clustermap.Stream && (m == nil || v.Map.Epoch >= m.Epoch) &&
		s.moved.Load() >= v.Map.Epoch && st.Copied[v.Self] < v.Map.Epoch {
		if !s.report(ctx, "report the copy of", v.Map.Epoch, s.o.Log.Copied) {
			return false
		}
	}
	// A held acknowledgement is looked at again after logRetry: the
	// rebuild's end wakes nothing.
	return !held
}

// reseed proposes m, a map newer than the log's seed, as the log's seed.
// A refusal because the log changed its map meanwhile, or holds a newer
// seed, is not a failure: follow looks at the log's state again.
func (s *Service) reseed(ctx context.Context, m *clustermap.Map) bool {
	ctx, cancel := context.WithTimeout(ctx, logCallTimeout)
	defer cancel()
	res, err := s.o.Log.Submit(ctx, maplog.Command{Op: maplog.OpSeed, Map: m})
	switch {
	case err != nil:
		if ctx.Err() == nil {
			s.log.Warn("membership: propose the installed cluster map as the log's seed", "map", m.String(), "err", err)
		}
		return false
	case res.Accepted:
		s.log.Info("membership: the log's seed follows the installed cluster map (a member without the log changed it)", "map", m.String())
	}
	return true
}

// report sends an acknowledgement or a copy report of epoch to the log.
func (s *Service) report(ctx context.Context, what string, epoch uint64, send func(context.Context, uint64) (*maplog.Result, error)) bool {
	ctx, cancel := context.WithTimeout(ctx, logCallTimeout)
	defer cancel()
	res, err := send(ctx, epoch)
	switch {
	case err != nil:
		if ctx.Err() == nil {
			s.log.Warn("membership: "+what+" a cluster map to its log", "epoch", epoch, "err", err)
		}
		return false
	case !res.Accepted:
		if res.Map != nil { // without a map the log is not seeded yet: no news
			s.log.Warn("membership: the log refused to "+what+" a cluster map", "epoch", epoch, "reason", res.Reason)
		}
		return false
	}
	return true
}

// setMoved records that this node copied the partitions it gains at the
// stream stage of epoch, and wakes follow to report it.
func (s *Service) setMoved(epoch uint64) {
	s.moved.Store(epoch)
	s.wake()
}

// wake wakes follow (it looks at the log and the installed map again).
func (s *Service) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// logMap is the map this node's replica of the log holds: the one a
// change is made from (its epoch is the compare-and-set's). Right after
// a cluster's first start the log holds none until its leader applied
// the seed: it waits for it, up to logCallTimeout.
func (s *Service) logMap() (*clustermap.Map, error) {
	t := time.NewTimer(logCallTimeout)
	defer t.Stop()
	ackTimer := time.NewTimer(logAckWait)
	defer ackTimer.Stop()
	acks := ackTimer.C
	for {
		st, changed := s.o.Log.Watch()
		if st.Map != nil && (acks == nil || st.Map.Change != nil || allAcked(st)) {
			return st.Map, nil
		}
		select {
		case <-changed:
		case <-acks:
			acks = nil // let the log decide (a dead node never acknowledges)
		case <-t.C:
			return nil, fmt.Errorf("this node's log holds no cluster map yet (no leader of the log reached within %v): %w", logCallTimeout, context.DeadlineExceeded)
		}
	}
}

// logAckWait is how long a change asked while members have not all
// acknowledged the log's map yet (right after the cluster's start, or
// after the last stage of a change) waits for them before it is
// submitted anyway: the log refuses it unless the missing member is
// the one a replace removes.
const logAckWait = 5 * time.Second

// allAcked reports whether every member acknowledged the log's map, but
// those it counts dead (clustermap.Map.Dead), which never do.
func allAcked(st *maplog.State) bool {
	for _, n := range st.Map.Nodes {
		if st.Acks[n.ID] < st.Map.Epoch && !st.Map.Dead(n.ID) {
			return false
		}
	}
	return true
}

// submit asks the log for change c and answers its outcome: the change's
// first map, or ErrChangeRefused with the log's reason.
func (s *Service) submit(c maplog.Command) (*clustermap.Map, error) {
	ctx, cancel := context.WithTimeout(context.Background(), logCallTimeout)
	defer cancel()
	c.From = s.View().Self
	res, err := s.o.Log.Submit(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("membership: %s through the cluster map's log: %w", c.Op, err)
	}
	s.catchUp(ctx, res.Map, catchUpWait)
	if !res.Accepted {
		return nil, fmt.Errorf("%w: %s", ErrChangeRefused, res.Reason)
	}
	s.log.Info("membership: change accepted by the log", "op", string(c.Op), "map", res.Map.String(), "node", res.Node)
	return res.Map, nil
}

// catchUpWait bounds catchUp: a replica of the log learns a commit with
// the leader's next message, in milliseconds; one cut from the leader
// (a command relayed by another member) is not waited for longer.
const catchUpWait = 2 * time.Second

// catchUp waits, for up to wait, for this node's replica of the log to
// hold m (the log's map after a command, accepted or refused): the next
// change asked of this node is then made from it, where a follower that
// applies the commit a moment after the leader would make it from the
// epoch before, and see it refused as made from a map that moved on.
func (s *Service) catchUp(ctx context.Context, m *clustermap.Map, wait time.Duration) {
	if m == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		st, changed := s.o.Log.Watch()
		if st.Map != nil && st.Map.Epoch >= m.Epoch {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}

// Abort ends the change under way with the old set of nodes, as the log
// allows it: before the read-new stage, while every read still goes to
// the old set. It returns the map without the change.
func (s *Service) Abort() (*clustermap.Map, error) {
	m, err := s.logMap()
	if err != nil {
		return nil, err
	}
	return s.submit(maplog.Command{Op: maplog.OpAbort, Epoch: m.Epoch})
}

// AwaitMember waits until the map of l (a node's replica of the log,
// started) names url, and returns the map and the node's id in it: what a
// new node waits for when it is started before the change that adds it
// was asked for.
func AwaitMember(ctx context.Context, l *maplog.Log, url string) (*clustermap.Map, int, error) {
	u, err := clustermap.NormalizeURL(url)
	if err != nil {
		return nil, 0, err
	}
	for {
		st, changed := l.Watch()
		if st.Map != nil {
			if n := st.Map.ByURL(u); n != nil {
				return st.Map, n.ID, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, 0, fmt.Errorf("%s is not in the cluster map's log yet (%v): %w", u, st.Map, ctx.Err())
		case <-changed:
		}
	}
}

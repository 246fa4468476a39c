package maplog

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/hashicorp/raft"

	"github.com/dhtkv/dhtkv/internal/clustermap"
)

// Op names a command of the log.
type Op string

const (
	// OpSeed puts the first map in the log: a new cluster's (seeded from
	// --cluster) or, on upgrade, a data directory's stored map.
	OpSeed Op = "seed"
	// OpJoin begins adding the node at URL; the log gives it its id.
	OpJoin Op = "join"
	// OpDecommission begins removing Node.
	OpDecommission Op = "decommission"
	// OpReplace makes the new machine at URL take dead Node's identity.
	OpReplace Op = "replace"
	// OpRemove begins removing dead Node, or marks it dead in the
	// decommission under way that removes it (clustermap.Map.Remove).
	OpRemove Op = "remove"
	// OpAbort ends the change under way with the old set.
	OpAbort Op = "abort"
	// OpReplicas begins changing the replication factor to Replicas
	// (clustermap.Map.BeginReplicas); From drives it.
	OpReplicas Op = "replicas"
	// OpAck is Node's report that it installed the map of Epoch.
	OpAck Op = "ack"
	// OpCopied is Node's report that it copied every partition it gains
	// in the stream stage of Epoch.
	OpCopied Op = "copied"
	// OpAddr records Node's log address (where the group reaches it).
	OpAddr Op = "addr"
)

// Rules is the version of the log's rules this release applies, which it
// reports with every acknowledgement (Command.Rules). Every member applies
// every command with its own release's rules, so a rule whose outcome a
// release changes is applied only once every member reported a release
// that has it (State.Rules): until then the members of two releases would
// apply the same command differently and their replicas of the log part.
//
//	0  every release before the versions (none reported)
//	1  a remove of a member of a change under way, other than a
//	   decommission's leaving node, counts it dead there
//	   (clustermap.Map.Removing); before, it is refused
//	2  a join at a URL whose hash a member holds as its seed (a replaced
//	   node's former URL) gets a seed of its own (clustermap.Map.BeginJoin);
//	   before, it shares that member's (BeginJoinSharingSeeds)
const Rules = 2

// Command is one entry of the log. Commands that change the map are a
// compare-and-set on its epoch: one made from epoch E applies only if the
// log's map is still at E, so of two requests made from the same map
// exactly one is accepted and the other is refused with the map it lost
// to, whatever the order they reach the leader in.
type Command struct {
	Op Op `json:"op"`
	// ID names the request, so that a request sent again after an
	// uncertain outcome (the leader lost its office before answering) is
	// answered with the outcome of the first: a change that was applied
	// answers accepted, not "the map moved on". Set by the requester,
	// unique; empty for acks.
	ID string `json:"id,omitempty"`
	// Epoch is, for a change (join, decommission, remove, replace, abort, replicas), the
	// epoch of the map it was made from; for ack and copied, the epoch
	// the node installed or copied at.
	Epoch uint64 `json:"epoch,omitempty"`
	// Node is the node decommissioned, removed or replaced, or the one
	// that reports (ack, copied, addr).
	Node int `json:"node"`
	// From is the member that asked for the change (the map's
	// Change.Driver, informational under the log).
	From int `json:"from"`
	// URL is a joining node's, or a replacing machine's, node URL.
	URL string `json:"url,omitempty"`
	// Addr is the node's log address (join, replace, addr).
	Addr string `json:"addr,omitempty"`
	// Replicas is a replicas change's new replication factor.
	Replicas int `json:"replicas,omitempty"`
	// Rules is, for an ack, the version of the log's rules the reporting
	// member's release applies (the package's Rules; 0 from releases
	// before it).
	Rules int `json:"rules,omitempty"`
	// Map and Addrs are a seed's map and its members' log addresses.
	Map   *clustermap.Map `json:"map,omitempty"`
	Addrs map[int]string  `json:"addrs,omitempty"`
	// Relay asks the member a command is forwarded to to forward it to
	// its leader when it does not lead (Log.Submit, when this member
	// cannot reach the leader itself: a link cut between the two while
	// both reach the others). Cleared before it is relayed or applied.
	Relay bool `json:"relay,omitempty"`
}

// Result is a command's outcome, as the log applied it.
type Result struct {
	Accepted bool `json:"accepted"`
	// Reason says why a command was refused.
	Reason string `json:"reason,omitempty"`
	// Map is the log's map after the command: the map a refused request
	// lost to, or the one an accepted command made.
	Map *clustermap.Map `json:"map,omitempty"`
	// Node is, for an accepted join, the id the log gave the node.
	Node int `json:"node"`
	// Index is the log entry's index.
	Index uint64 `json:"index"`
}

// Outcome is how a change ended.
type Outcome struct {
	ID      string `json:"id,omitempty"` // the request's Command.ID
	Kind    Op     `json:"kind"`
	Node    int    `json:"node"`
	Began   uint64 `json:"began"` // the epoch of its first map
	Ended   uint64 `json:"ended"` // the epoch of the map without it
	Aborted bool   `json:"aborted,omitempty"`
	// AbortID is the abort request's Command.ID: the same request sent
	// again is answered as the first was.
	AbortID string `json:"abort_id,omitempty"`
}

// State is the replicated state: the map and the bookkeeping of the
// change under way. It is a value once published (the FSM replaces it
// whole), so readers share it without copying.
type State struct {
	Map *clustermap.Map `json:"map,omitempty"`
	// Acks is each member's highest epoch reported installed (OpAck).
	Acks map[int]uint64 `json:"acks,omitempty"`
	// Copied is each member's highest stream epoch reported copied.
	Copied map[int]uint64 `json:"copied,omitempty"`
	// Addrs are the members' log addresses.
	Addrs map[int]string `json:"addrs,omitempty"`
	// Changed is set once the log has changed a seeded map: from then on
	// a seed is refused (before, a stored map with a higher epoch, from
	// a node that saw more of the old protocol, replaces the seed).
	Changed bool `json:"changed,omitempty"`
	// Rules is the version of the rules in force: the lowest every live
	// member reported (Supports), never lowered. A rule of version v
	// applies once Rules >= v.
	Rules int `json:"rules,omitempty"`
	// Supports is the rules version each member last reported with its
	// acknowledgement (absent: none, a release before the versions).
	Supports map[int]int `json:"supports,omitempty"`
	// Current is the outcome of the change under way so far (Ended 0).
	Current *Outcome `json:"current,omitempty"`
	// Last is the last change that ended.
	Last *Outcome `json:"last,omitempty"`
	// Recent are the changes with a request id that ended before Last,
	// oldest first, at most maxRecent: a request sent again after its
	// outcome left Current and Last (a remove asked during a join, the
	// join ended before the retry) is still answered with it. It changes
	// what a retry is answered, never the state a command leaves, so
	// releases without it apply the log alike (no rules version).
	Recent []Outcome `json:"recent,omitempty"`
}

// maxRecent bounds State.Recent: changes take seconds at least, and a
// request is sent again within its own deadline.
const maxRecent = 32

// keepRecent moves prev's last outcome to s.Recent if s replaced it and a
// retry could name it.
func (s *State) keepRecent(prev *State) {
	o := prev.Last
	if o == nil || s.Last == o || o.ID == "" && o.AbortID == "" {
		return
	}
	s.Recent = append(slices.Clip(s.Recent), *o) // s shares prev's array
	if len(s.Recent) > maxRecent {
		s.Recent = s.Recent[len(s.Recent)-maxRecent:]
	}
}

func (s *State) clone() *State {
	n := *s
	n.Acks = maps.Clone(s.Acks)
	n.Copied = maps.Clone(s.Copied)
	n.Addrs = maps.Clone(s.Addrs)
	n.Supports = maps.Clone(s.Supports)
	if n.Supports == nil {
		n.Supports = map[int]int{}
	}
	if n.Acks == nil {
		n.Acks = map[int]uint64{}
	}
	if n.Copied == nil {
		n.Copied = map[int]uint64{}
	}
	if n.Addrs == nil {
		n.Addrs = map[int]string{}
	}
	return &n
}

// Waiting returns the members whose acknowledgement the map's next step
// waits for: those that have not reported installing its epoch (and, in
// the stream stage, copying their gains), except skip (-1: none) and
// the members the map counts dead (clustermap.Map.Dead), which never
// acknowledge.
func (s *State) Waiting(skip int) []int {
	var out []int
	if s.Map == nil {
		return nil
	}
	for _, n := range s.Map.Nodes {
		if n.ID == skip || s.Map.Dead(n.ID) {
			continue
		}
		if s.Acks[n.ID] < s.Map.Epoch {
			out = append(out, n.ID)
		} else if c := s.Map.Change; c != nil && c.Stage == clustermap.Stream && s.Copied[n.ID] < s.Map.Epoch {
			out = append(out, n.ID)
		}
	}
	return out
}

// fsm is the raft.FSM over State. Apply, Snapshot and Restore are called
// by raft's FSM goroutine one at a time; readers take the current state
// under mu and are told of a new one by closing changed.
type fsm struct {
	// rules is the version of the rules this replica applies: Rules, the
	// release's (tests lower it to play an older release).
	rules int

	mu      sync.Mutex
	state   *State
	changed chan struct{} // closed and replaced when a new state is applied
	// behind is set once the log's rules in force are above rules: this
	// replica can no longer apply the log as the members that raised
	// them do (see checkRules). It never clears; the node must stop and
	// run a release that applies them.
	behind   error
	onBehind func(error) // called once, on raft's FSM goroutine, when behind is set
}

func newFSM() *fsm {
	return &fsm{rules: Rules, state: (&State{}).clone(), changed: make(chan struct{})}
}

// ErrBehindRules is the error of a replica whose release applies older
// rules than the log's rules in force (State.Rules).
var ErrBehindRules = errors.New("maplog: this release applies older rules than the log's")

// checkRules notes whether the rules in force, r, are above this
// replica's. The log raises its rules only once every live member
// reported a release that applies them, so a replica that finds them
// above its own runs a release older than every member's was: a node
// rolled back below them, a node counted dead that returned on an old
// release, a new node of an old release. Applying the next command by
// its older rules could decide it otherwise than the other members did,
// and its replica of the log would part from theirs: it applies no more
// (Apply refuses every command, Snapshot takes none, so that the entries
// stay in the log for a release that applies them), and the node is told
// to stop (onBehind).
func (f *fsm) checkRules(r int) error {
	f.mu.Lock()
	if f.behind != nil || r <= f.rules {
		defer f.mu.Unlock()
		return f.behind
	}
	err := fmt.Errorf("%w: the log's rules are at %d and this release applies them up to %d: "+
		"run a release that applies rules %d (docs/membership.md, \"Upgrading to the log\")", ErrBehindRules, r, f.rules, r)
	f.behind = err
	fn := f.onBehind
	f.mu.Unlock()
	if fn != nil {
		fn(err)
	}
	return err
}

// behindErr is the error checkRules set, or nil.
func (f *fsm) behindErr() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.behind
}

// current returns the state and a channel closed once a newer state is
// applied (a map, or an acknowledgement the next step may wait for).
func (f *fsm) current() (*State, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state, f.changed
}

func (f *fsm) publish(s *State) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state = s
	close(f.changed)
	f.changed = make(chan struct{})
}

// Apply implements raft.FSM: it returns a *Result. A command that does
// not decode is refused, not a panic: an entry is in every member's log
// for ever, and a member that could not apply it could never start.
func (f *fsm) Apply(l *raft.Log) any {
	var c Command
	if err := json.Unmarshal(l.Data, &c); err != nil {
		cur, _ := f.current()
		return &Result{Reason: fmt.Sprintf("bad command: %v", err), Map: cur.Map, Index: l.Index}
	}
	cur, _ := f.current()
	if err := f.checkRules(cur.Rules); err != nil {
		return &Result{Reason: err.Error(), Map: cur.Map, Index: l.Index}
	}
	next, res := apply(cur, &c)
	res.Index = l.Index
	if next != nil {
		f.publish(next)
		// The raise itself follows this release's rules; what comes
		// after it may not.
		_ = f.checkRules(next.Rules)
	}
	return res
}

// apply is the rules: it returns the next state (nil: unchanged) and the
// command's result. It only reads cur.
func apply(cur *State, c *Command) (*State, *Result) {
	next, res := applyCommand(cur, c)
	if next != nil {
		next.keepRecent(cur)
	}
	return next, res
}

// applyCommand is apply but for the outcomes kept for retries.
func applyCommand(cur *State, c *Command) (*State, *Result) {
	refuse := func(format string, args ...any) (*State, *Result) {
		return nil, &Result{Reason: fmt.Sprintf(format, args...), Map: cur.Map}
	}
	m := cur.Map
	if c.Op == OpSeed {
		return applySeed(cur, c)
	}
	if m == nil {
		return refuse("the log has no map yet: seed it first")
	}
	// A request sent again after an uncertain outcome: answer with the
	// outcome of the first.
	if c.ID != "" {
		for _, o := range []*Outcome{cur.Current, cur.Last} {
			if o != nil && (o.ID == c.ID || o.AbortID == c.ID) {
				return nil, &Result{Accepted: true, Map: m, Node: o.Node}
			}
		}
		for _, o := range cur.Recent {
			if o.ID == c.ID || o.AbortID == c.ID {
				return nil, &Result{Accepted: true, Map: m, Node: o.Node}
			}
		}
	}
	switch c.Op {
	case OpAck, OpCopied:
		if m.Node(c.Node) == nil {
			return refuse("node %d is not a member", c.Node)
		}
		if c.Epoch > m.Epoch {
			return refuse("epoch %d is not in the log (the log is at %d)", c.Epoch, m.Epoch)
		}
		n := cur.clone()
		if c.Op == OpAck {
			n.Acks[c.Node] = max(n.Acks[c.Node], c.Epoch)
			n.Supports[c.Node] = c.Rules
			n.raiseRules()
		} else {
			n.Copied[c.Node] = max(n.Copied[c.Node], c.Epoch)
		}
		advance(n)
		return n, &Result{Accepted: true, Map: n.Map}
	case OpAddr:
		if m.Node(c.Node) == nil {
			return refuse("node %d is not a member", c.Node)
		}
		if c.Addr == "" {
			return refuse("empty log address")
		}
		n := cur.clone()
		n.Addrs[c.Node] = c.Addr
		return n, &Result{Accepted: true, Map: m}
	}
	if !isChange(c.Op) {
		return refuse("unknown command %q", c.Op)
	}
	// A change: compare-and-set on the epoch.
	if c.Epoch != m.Epoch {
		return refuse("the map moved on: the request was made at epoch %d, the log is at %s", c.Epoch, m)
	}
	if c.Op != OpAbort && m.Node(c.From) == nil {
		return refuse("the requester, node %d, is not a member", c.From)
	}
	if c.Op == OpAbort {
		// A change the log took on from a seed (a rolling upgrade caught
		// it mid-change) is driven by the members still on a release
		// without the log until every member runs the log: they would
		// never learn of the abort, and would go on to make a different
		// map of the same epoch as the abort's. The log drives it, and
		// may abort it, once every member acknowledged its map through
		// the log, which only a member running the log does.
		if w := cur.Waiting(-1); !cur.Changed && len(w) > 0 {
			return refuse("nodes %v have not acknowledged %s through the log yet (a rolling upgrade drives the change until every member runs the log): try again once they have", w, m)
		}
		a, err := m.Abort()
		if err != nil {
			return refuse("%v", err)
		}
		n := cur.clone()
		o := n.current()
		o.Ended, o.Aborted, o.AbortID = a.Epoch, true, c.ID
		n.Map, n.Current, n.Last, n.Changed = a, nil, &o, true
		n.forgetLeft()
		return n, &Result{Accepted: true, Map: a, Node: o.Node}
	}
	// A change begins only once every member (but a replaced or removed,
	// dead one) has installed the current map: the stages that follow
	// assume every node is at most one stage behind. A replace, or a
	// remove of a decommission's leaving node, during a change does not
	// wait: it keeps the stage, so the members stay at most one stage
	// apart, and the stage's next step waits for every live member's
	// acknowledgement of the new epoch (and a replace's new machine).
	skip := -1
	if c.Op == OpReplace || c.Op == OpRemove {
		skip = c.Node
	}
	if w := cur.Waiting(skip); len(w) > 0 && m.Change == nil {
		return refuse("nodes %v have not acknowledged %s yet: try again", w, m)
	}
	if ch := m.Change; c.Op == OpRemove && ch != nil && !(ch.Kind == clustermap.Decommission && ch.Node == c.Node) && cur.Rules < 1 {
		return refuse("a remove during another change needs the log's rules 1, in force once every live member runs a release that has them "+
			"(the log is at rules %d; members' reports: %v): upgrade every node first, or replace node %d", cur.Rules, cur.Supports, c.Node)
	}
	var next *clustermap.Map
	var err error
	subject := c.Node
	switch c.Op {
	case OpJoin:
		subject = m.NextID
		if cur.Rules >= 2 {
			next, err = m.BeginJoin(c.URL, c.From)
		} else {
			next, err = m.BeginJoinSharingSeeds(c.URL, c.From)
		}
	case OpDecommission:
		next, err = m.BeginDecommission(c.Node, c.From)
	case OpReplace:
		next, err = m.Replace(c.Node, c.URL)
	case OpRemove:
		next, err = m.Remove(c.Node, c.From)
	case OpReplicas:
		subject = c.From // the map's Change.Node: a replicas change moves no node
		next, err = m.BeginReplicas(c.Replicas, c.From)
	}
	if err != nil {
		return refuse("%v", err)
	}
	n := cur.clone()
	n.Map, n.Changed = next, true
	o := &Outcome{ID: c.ID, Kind: c.Op, Node: subject, Began: next.Epoch}
	switch {
	case c.Op == OpReplace:
		replaced(n, m, c.Node)
		o.Ended = next.Epoch
		n.Last = o
	case c.Op == OpRemove && m.Change != nil:
		markedDead(n, m, c.Node, next.Change.Dead && next.Change.Node == c.Node)
		o.Ended = next.Epoch
		n.Last = o
	default:
		n.Current = o
	}
	if c.Addr != "" {
		n.Addrs[subject] = c.Addr
	} else if c.Op == OpReplace {
		delete(n.Addrs, c.Node)
	}
	return n, &Result{Accepted: true, Map: next, Node: subject}
}

// replaced does the bookkeeping of a replace of node id, from map prev to
// s.Map. A replace has no stages: it is over as it begins (Last), and a
// change under way (Current) goes on at its stage in the new epoch.
//
// The new machine has installed nothing: its acknowledgement and copy
// report start afresh, so the stage under way waits for it, not for the
// dead machine. Every other member acknowledges the new epoch too (it
// must route to the new URL before the stage after this one), but a copy
// it reported complete in this stream stage stays complete: the replace
// changes no partition's replicas (clustermap.Map.SamePlacement), and the
// copy read every replica of the old set, the dead one included (a copy
// that could not reach it has not completed).
func replaced(s *State, prev *clustermap.Map, id int) {
	delete(s.Acks, id)
	delete(s.Copied, id)
	keepCopies(s, prev)
}

// markedDead does the bookkeeping of a remove of node id during the
// change under way in prev, which goes on at its stage in s.Map's epoch:
// it marks the change's leaving node dead (leaving: the decommission then
// ends as a remove), or counts another member dead, to be removed after
// it (clustermap.Map.Removing). The dead node's acknowledgement and copy
// report are forgotten (nothing waits for them any more), and the live
// members' copies of this stream stage stay complete, as for a replace:
// the mark moves no partition, and a copy completed before it read every
// replica of the old set, the dead one included, more than a copy from
// the live ones.
func markedDead(s *State, prev *clustermap.Map, id int, leaving bool) {
	delete(s.Acks, id)
	delete(s.Copied, id)
	keepCopies(s, prev)
	if leaving && s.Current != nil {
		o := *s.Current
		o.Kind = OpRemove
		s.Current = &o
	}
}

// keepCopies carries the copy reports of prev's stream stage over to
// s.Map's, a map of the same placement at the same stage.
func keepCopies(s *State, prev *clustermap.Map) {
	if ch := prev.Change; ch == nil || ch.Stage != clustermap.Stream || !prev.SamePlacement(s.Map) {
		return
	}
	for n, e := range s.Copied {
		if e >= prev.Epoch {
			s.Copied[n] = s.Map.Epoch
		}
	}
}

// applySeed puts the first map in the log, or replaces a seed the log has
// not changed by one of the same cluster with a higher epoch (upgrade: the
// nodes' stored maps may differ, the newest is the truth).
func applySeed(cur *State, c *Command) (*State, *Result) {
	if c.Map == nil {
		return nil, &Result{Reason: "seed without a map", Map: cur.Map}
	}
	if err := c.Map.Validate(); err != nil {
		return nil, &Result{Reason: err.Error(), Map: cur.Map}
	}
	if m := cur.Map; m != nil {
		switch {
		case cur.Changed:
			return nil, &Result{Reason: fmt.Sprintf("the log holds %s already and has changed it", m), Map: m}
		case m.Cluster != c.Map.Cluster:
			return nil, &Result{Reason: fmt.Sprintf("the log holds cluster %d, the seed is of cluster %d", m.Cluster, c.Map.Cluster), Map: m}
		case c.Map.Epoch <= m.Epoch:
			return nil, &Result{Reason: fmt.Sprintf("the log holds %s already", m), Map: m}
		}
	}
	n := cur.clone()
	n.Map = c.Map
	for id, a := range c.Addrs {
		if c.Map.Node(id) != nil && a != "" {
			n.Addrs[id] = a
		}
	}
	if ch := c.Map.Change; ch != nil {
		// A stored map caught mid-change: the log takes the change on.
		n.Current = &Outcome{Kind: Op(ch.Kind), Node: ch.Node, Began: c.Map.Epoch}
	}
	n.forgetLeft()
	return n, &Result{Accepted: true, Map: c.Map}
}

// advance moves the change under way to its next stage once every member
// of the stage has acknowledged it (and, in the stream stage, reported
// its copy complete). Acknowledgements name the epoch the member
// installed from this log, whose epochs form one chain, so an
// acknowledgement of a later epoch covers the earlier ones.
//
// With no change under way, it begins the removal of the first member a
// remove counted dead during the last change (clustermap.Map.RemoveNext),
// once every live member acknowledged the map that ended it: the rule a
// requested change begins by.
func advance(s *State) {
	m := s.Map
	if len(s.Waiting(-1)) > 0 {
		return
	}
	if m.Change == nil {
		if len(m.Removing) == 0 {
			return
		}
		next, err := m.RemoveNext()
		if err != nil {
			return // RemoveNext only fails on a map that does not validate: none is in the log
		}
		s.Map, s.Changed = next, true
		s.Current = &Outcome{Kind: OpRemove, Node: next.Change.Node, Began: next.Epoch}
		return
	}
	next, err := m.Advance()
	if err != nil {
		return // Advance only fails on a map that does not validate: none is in the log
	}
	// The log changed the map: every member acknowledged through it, so
	// none is left on a release without the log to drive a seeded change
	// or to hold a newer map of its own (the seed rule ends here too).
	s.Map, s.Changed = next, true
	if next.Change == nil {
		o := s.current()
		o.Ended = next.Epoch
		s.Last, s.Current = &o, nil
		s.forgetLeft()
	}
}

// current returns a copy of the outcome of the change under way.
func (s *State) current() Outcome {
	if s.Current != nil {
		return *s.Current
	}
	c := s.Map.Change
	return Outcome{Kind: Op(c.Kind), Node: c.Node}
}

// forgetLeft drops the bookkeeping of nodes no longer in the map.
func (s *State) forgetLeft() {
	for _, m := range []map[int]uint64{s.Acks, s.Copied} {
		for id := range m {
			if s.Map.Node(id) == nil {
				delete(m, id)
			}
		}
	}
	for id := range s.Addrs {
		if s.Map.Node(id) == nil {
			delete(s.Addrs, id)
		}
	}
	for id := range s.Supports {
		if s.Map.Node(id) == nil {
			delete(s.Supports, id)
		}
	}
	s.raiseRules()
}

// raiseRules puts in force the lowest rules version every member not
// counted dead reported (a member that reported none counts 0), if it is
// higher than the one in force. Rules are never lowered: a member whose
// release goes back below them would apply later commands differently,
// which is why a release is not downgraded below the log's rules.
func (s *State) raiseRules() {
	if s.Map == nil {
		return
	}
	lowest := -1
	for _, n := range s.Map.Nodes {
		if s.Map.Dead(n.ID) {
			continue
		}
		if v := s.Supports[n.ID]; lowest < 0 || v < lowest {
			lowest = v
		}
	}
	if lowest > s.Rules {
		s.Rules = lowest
	}
}

// Snapshot implements raft.FSM: the state as JSON. State is a value, so
// the snapshot holds it without a copy.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	if err := f.behindErr(); err != nil {
		// The state misses the commands refused since: a snapshot would
		// drop them from the log for good.
		return nil, fmt.Errorf("maplog: no snapshot: %w", err)
	}
	s, _ := f.current()
	return &fsmSnapshot{s: s}, nil
}

// Restore implements raft.FSM: the state of a snapshot replaces the
// current one whole.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	var s State
	if err := json.NewDecoder(rc).Decode(&s); err != nil {
		return fmt.Errorf("maplog: restore snapshot: %w", err)
	}
	if s.Map != nil {
		if err := s.Map.Validate(); err != nil {
			return fmt.Errorf("maplog: restore snapshot: %w", err)
		}
	}
	f.publish(s.clone())
	_ = f.checkRules(s.Rules)
	return nil
}

type fsmSnapshot struct{ s *State }

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if err := json.NewEncoder(sink).Encode(s.s); err != nil {
		return errors.Join(fmt.Errorf("maplog: persist snapshot: %w", err), sink.Cancel())
	}
	return sink.Close()
}

func (s *fsmSnapshot) Release() {}

// String is a one-line summary of a result, for logs and errors.
func (r *Result) String() string {
	var b strings.Builder
	if r.Accepted {
		b.WriteString("accepted")
	} else {
		b.WriteString("refused: " + r.Reason)
	}
	if r.Map != nil {
		fmt.Fprintf(&b, " (map %s)", r.Map)
	}
	return b.String()
}

// sortedIDs returns a map's keys in order.
func sortedIDs[V any](m map[int]V) []int {
	return slices.Sorted(maps.Keys(m))
}

// Package clustermap holds the cluster map: which nodes form the cluster,
// under which identities, and which membership change is under way and at
// what stage. The map is the source of truth for placement (package
// placement places partitions over its nodes); every node persists it, and
// every node-to-node request carries its epoch (docs/membership.md).
//
// A Map is a value: it is never modified once built. Changes make a new
// map with a higher epoch (Begin, Advance, Replace, Remove), and a node installs
// a received map only if its epoch is higher than the one it has.
package clustermap

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// MaxNodeID is the largest node id: ids are the HLC's node bits
// (hlc.MaxNodeID), so that two nodes never issue the same version.
const MaxNodeID = 255

// MaxEpoch is the largest epoch of a valid map (Validate). Each change
// makes one map a stage, so a cluster never comes near it: a change every
// microsecond would take some 146,000 years to reach it. The bound is
// there for maps from outside, a peer's offer or a damaged directory:
// without it a map at epoch 2^64-1 was installed, and the next change's
// epoch wrapped to 0, which no map may have, so every change after it
// failed. Now next() never wraps, and a map at MaxEpoch itself refuses
// every change with that reason.
const MaxEpoch = 1 << 62

// Node is one member.
type Node struct {
	// ID is the node's identity for its lifetime in the cluster: the
	// tie-break of its versions, the index of its hints and data
	// directory identity. Never reused within a cluster.
	ID int `json:"id"`
	// URL is where the node is reached: http://host:port (under TLS
	// too, see docs/security.md). A replace changes it.
	URL string `json:"url"`
	// Seed is the node's rendezvous seed: the hash of the URL it joined
	// with. A replacement keeps it, so that it takes exactly the
	// partitions of the node it replaces.
	Seed uint64 `json:"seed"`
}

// Kind is a membership change's kind.
type Kind string

const (
	Join         Kind = "join"         // Node takes its share of partitions
	Decommission Kind = "decommission" // Node hands its partitions to the others, then leaves
	// Replicas changes the replication factor to Change.Replicas over
	// the same nodes: each partition's new replicas are the first
	// Change.Replicas of its rendezvous ranking, so growing adds the next
	// ranked node to each partition and shrinking drops the last.
	Replicas Kind = "replicas"
)

// Stage is how far a change has gone. Each stage is one epoch; a stage is
// entered only once every node has installed the previous one (the
// change's driver waits for that), so that at any moment the nodes are at
// most one stage apart:
//
//	write-both  writes go to ack replicas of the old and of the new set;
//	            reads use the old set
//	stream      as write-both; the nodes gaining a partition copy it from
//	            every replica of the old set (every write since
//	            write-both reaches the new set by itself)
//	read-new    writes still go to both sets; reads use the new set
//	(done)      the change is over: the map's nodes are the new set, and
//	            nodes delete the partitions they no longer hold
//
// Neighbouring stages are compatible: a node in write-both and one in
// stream write alike; a node in stream reads the old set, complete since
// every write reaches it; a node in read-new reads the new set, complete
// once streaming ended; a done node writes only the new set, which every
// read-new node reads.
type Stage string

const (
	WriteBoth Stage = "write-both"
	Stream    Stage = "stream"
	ReadNew   Stage = "read-new"
)

// Change is a membership change under way.
type Change struct {
	Kind Kind `json:"kind"`
	// Node is the node joining or leaving; for a replicas change, which
	// moves no node, the driver (so that it always names a member).
	Node  int   `json:"node"`
	Stage Stage `json:"stage"`
	// Replicas is, for a replicas change, the new set's replication
	// factor (the map's Replicas stays the old set's until the change is
	// over); 0 for the other kinds, whose sets share the map's factor.
	Replicas int `json:"replicas,omitempty"`
	// Driver is the node that runs the change (the one the operator asked);
	// it resumes the change after a restart.
	Driver int `json:"driver"`
	// Dead marks, for a decommission, that the leaving node is dead and
	// will not come back (a remove: Map.Remove). Nothing waits for it: no
	// stage for its acknowledgement, no gainer for a copy from it (each
	// copies from the old set's live replicas), and it leaves the map at
	// the end as a decommissioned node does. It places nothing: the sets
	// are the decommission's. Never set on the driver, nor for another
	// kind; maps from before it decode with it false.
	Dead bool `json:"dead,omitempty"`
}

// Map is the cluster map.
type Map struct {
	// Cluster identifies the cluster; it is fixed when the map is seeded
	// and checked against every data directory's identity.
	Cluster uint64 `json:"cluster"`
	// Epoch increases with every change of the map, from 1 (Seed) to at
	// most MaxEpoch.
	Epoch uint64 `json:"epoch"`
	// Replicas is the replication factor, set when the map is seeded
	// (--replicas) and changed only by a replicas change (BeginReplicas),
	// at its end; during one it is the old set's factor (NewReplicas is
	// the new set's). While the cluster has fewer nodes, every node holds
	// every partition.
	Replicas int `json:"replicas"`
	// Nodes are the members, ordered by ID, including a node joining or
	// leaving.
	Nodes []Node `json:"nodes"`
	// NextID is the id the next joining node gets.
	NextID int `json:"next_id"`
	// Change is the change under way, nil when none is.
	Change *Change `json:"change,omitempty"`
	// Removing are members that a remove counted dead while a change of
	// other nodes was under way (Map.Remove), in the order asked. They are
	// dead as a remove's leaving node is (Change.Dead, Map.Dead): nothing
	// waits for them and nothing is copied from them, and a node among
	// them that comes back stops. They stay in both sets, so the change
	// under way places every partition as before; once it is over the
	// log removes each in turn (Map.RemoveNext). Maps from before it
	// decode with none.
	Removing []int `json:"removing,omitempty"`
}

// Seed makes the first map of a cluster from the --cluster list (node
// URLs, in the order every node was given). A node's id is its position
// and the cluster's identity the hash of the list, so every node seeded
// from the same list agrees on both without asking the others, and a data
// directory whose identity came from that list (store.Identity) matches.
func Seed(urls []string, replicas int) (*Map, error) {
	if len(urls) == 0 {
		return nil, errors.New("no nodes")
	}
	if len(urls) > MaxNodeID+1 {
		return nil, fmt.Errorf("%d nodes, at most %d supported", len(urls), MaxNodeID+1)
	}
	if replicas <= 0 || replicas > len(urls) {
		replicas = len(urls)
	}
	m := &Map{Cluster: xxhash.Sum64String(strings.Join(urls, ",")), Epoch: 1, Replicas: replicas, NextID: len(urls)}
	for i, u := range urls {
		m.Nodes = append(m.Nodes, Node{ID: i, URL: u, Seed: xxhash.Sum64String(u)})
	}
	return m, m.Validate()
}

// NormalizeURL accepts http://host:port (a trailing slash is dropped) and
// nothing else: node URLs are compared textually across nodes. The scheme
// is part of a node's name, not its transport: under TLS (--tls-cert) it
// stays http:// and package rpc sends to the https:// form, so that
// turning TLS on or off keeps every data directory's identity
// (docs/security.md).
func NormalizeURL(s string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(s))
	if err != nil {
		return "", fmt.Errorf("bad node URL %q: %w", s, err)
	}
	if u.Scheme == "https" {
		return "", fmt.Errorf("bad node URL %q: want http://host:port, also under TLS: the URL names the node, --tls-cert makes the nodes talk TLS (docs/security.md)", s)
	}
	if u.Scheme != "http" || u.Host == "" || u.Port() == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return "", fmt.Errorf("bad node URL %q: want http://host:port", s)
	}
	return "http://" + u.Host, nil
}

// Validate checks the map's invariants.
func (m *Map) Validate() error {
	if m.Epoch == 0 {
		return errors.New("cluster map: epoch 0")
	}
	if m.Epoch > MaxEpoch {
		return fmt.Errorf("cluster map: epoch %d above the largest, %d", m.Epoch, uint64(MaxEpoch))
	}
	if len(m.Nodes) == 0 {
		return errors.New("cluster map: no nodes")
	}
	if m.Replicas <= 0 {
		return fmt.Errorf("cluster map: replication factor %d", m.Replicas)
	}
	urls := map[string]bool{}
	for i, n := range m.Nodes {
		if n.ID < 0 || n.ID > MaxNodeID || n.ID >= m.NextID {
			return fmt.Errorf("cluster map: node id %d out of range (next id %d)", n.ID, m.NextID)
		}
		if i > 0 && n.ID <= m.Nodes[i-1].ID {
			return errors.New("cluster map: nodes not ordered by id")
		}
		if u, err := NormalizeURL(n.URL); err != nil || u != n.URL {
			return fmt.Errorf("cluster map: node %d: bad URL %q", n.ID, n.URL)
		}
		if urls[n.URL] {
			return fmt.Errorf("cluster map: %s listed twice", n.URL)
		}
		urls[n.URL] = true
	}
	if c := m.Change; c != nil {
		if c.Kind != Join && c.Kind != Decommission && c.Kind != Replicas {
			return fmt.Errorf("cluster map: unknown change %q", c.Kind)
		}
		if c.Kind == Replicas {
			if c.Replicas < 1 || c.Replicas > len(m.Nodes) || c.Replicas == m.Replicas {
				return fmt.Errorf("cluster map: replicas change from %d to %d over %d nodes", m.Replicas, c.Replicas, len(m.Nodes))
			}
		} else if c.Replicas != 0 {
			return fmt.Errorf("cluster map: %s change with a replication factor %d", c.Kind, c.Replicas)
		}
		if c.Stage != WriteBoth && c.Stage != Stream && c.Stage != ReadNew {
			return fmt.Errorf("cluster map: unknown stage %q", c.Stage)
		}
		if m.Node(c.Node) == nil || m.Node(c.Driver) == nil {
			return fmt.Errorf("cluster map: change names node %d or driver %d, not members", c.Node, c.Driver)
		}
		if c.Kind == Decommission && len(m.Nodes) == 1 {
			return errors.New("cluster map: decommissioning the last node")
		}
		if c.Kind == Join && len(m.Nodes) == 1 {
			return errors.New("cluster map: a join of the only node: the old set would be empty")
		}
		if c.Dead && (c.Kind != Decommission || c.Driver == c.Node) {
			return fmt.Errorf("cluster map: %s of node %d driven by node %d marks a dead node: only a decommission's leaving node, which drives nothing, is", c.Kind, c.Node, c.Driver)
		}
	}
	for i, id := range m.Removing {
		switch {
		case m.Node(id) == nil:
			return fmt.Errorf("cluster map: removing node %d, not a member", id)
		case slices.Contains(m.Removing[:i], id):
			return fmt.Errorf("cluster map: removing node %d twice", id)
		case m.Change != nil && m.Change.Kind == Decommission && m.Change.Node == id:
			return fmt.Errorf("cluster map: removing node %d, which the change under way decommissions (marked dead there, Change.Dead)", id)
		}
	}
	if left := len(m.New()) - len(m.Removing); len(m.Removing) > 0 && left < m.NewReplicas() {
		return fmt.Errorf("cluster map: removing nodes %v would leave %d nodes, fewer than the replication factor %d", m.Removing, left, m.NewReplicas())
	}
	return nil
}

// Dead reports whether member id is counted dead: the leaving node of a
// remove (Change.Dead), or one of Removing. Nothing waits for it and
// nothing is copied from it.
func (m *Map) Dead(id int) bool {
	if c := m.Change; c != nil && c.Dead && c.Node == id {
		return true
	}
	return slices.Contains(m.Removing, id)
}

// Node returns the member with id, or nil.
func (m *Map) Node(id int) *Node {
	i, ok := slices.BinarySearchFunc(m.Nodes, id, func(n Node, id int) int { return n.ID - id })
	if !ok {
		return nil
	}
	return &m.Nodes[i]
}

// ByURL returns the member reached at url (normalized), or nil.
func (m *Map) ByURL(url string) *Node {
	for i := range m.Nodes {
		if m.Nodes[i].URL == url {
			return &m.Nodes[i]
		}
	}
	return nil
}

// Old returns the nodes of the placement before the change under way (all
// nodes when none is): without a joining node.
func (m *Map) Old() []Node {
	if m.Change == nil || m.Change.Kind != Join {
		return m.Nodes
	}
	return without(m.Nodes, m.Change.Node)
}

// New returns the nodes of the placement after the change under way (all
// nodes when none is): without a leaving node.
func (m *Map) New() []Node {
	if m.Change == nil || m.Change.Kind != Decommission {
		return m.Nodes
	}
	return without(m.Nodes, m.Change.Node)
}

// NewReplicas returns the replication factor of the placement after the
// change under way: the change's for a replicas change, else the map's
// (which is then both sets').
func (m *Map) NewReplicas() int {
	if m.Change != nil && m.Change.Kind == Replicas {
		return m.Change.Replicas
	}
	return m.Replicas
}

func without(nodes []Node, id int) []Node {
	out := make([]Node, 0, len(nodes))
	for _, n := range nodes {
		if n.ID != id {
			out = append(out, n)
		}
	}
	return out
}

// next returns a deep copy with the next epoch: every change's map. A
// valid map's epoch is at most MaxEpoch, so the next one never wraps to 0;
// at MaxEpoch itself no change can follow, and next refuses it.
func (m *Map) next() (*Map, error) {
	if m.Epoch >= MaxEpoch {
		return nil, fmt.Errorf("cluster map at epoch %d, the last one (MaxEpoch): no change can follow it", m.Epoch)
	}
	n := *m
	n.Epoch++
	n.Nodes = slices.Clone(m.Nodes)
	n.Removing = slices.Clone(m.Removing)
	if m.Change != nil {
		c := *m.Change
		n.Change = &c
	}
	return &n, nil
}

// ErrBusy refuses a change while another is under way.
var ErrBusy = errors.New("another membership change is under way")

// idle refuses a change while another is under way, or dead members wait
// to be removed (Removing), which the log begins as soon as it can.
func (m *Map) idle() error {
	if m.Change != nil {
		return fmt.Errorf("%w: %s", ErrBusy, m.Change.describe())
	}
	if len(m.Removing) > 0 {
		return fmt.Errorf("%w: dead nodes %v are to be removed first", ErrBusy, m.Removing)
	}
	return nil
}

// isDriver refuses a change driven by a node that is not a member.
func (m *Map) isDriver(driver int) error {
	if m.Node(driver) == nil {
		return fmt.Errorf("driver node %d is not a member", driver)
	}
	return nil
}

// keepRemoving keeps of Removing the ids still in Nodes: a change that ends
// may take one out (an aborted join's dead node).
func (m *Map) keepRemoving() {
	m.Removing = slices.DeleteFunc(m.Removing, func(id int) bool { return m.Node(id) == nil })
	if len(m.Removing) == 0 {
		m.Removing = nil
	}
}

// BeginJoin returns the map in which the node at url starts joining,
// driven by node driver. Its rendezvous seed is the hash of its URL, or,
// if a member holds that seed (a replace keeps the dead node's seed and
// frees its URL, which a new machine may then join at), one salted with
// its id: with the same seed the two nodes would tie on every partition's
// score, and the later one would rank right behind its twin everywhere
// (at factor 1 it would get nothing).
func (m *Map) BeginJoin(url string, driver int) (*Map, error) {
	return m.beginJoin(url, driver, true)
}

// BeginJoinSharingSeeds is BeginJoin as the map's log applied it under
// its rules below 2 (maplog.Rules): the seed is the URL's hash even if a
// member holds it. A log whose members do not all apply rules 2 yet
// applies a join so, so that every member makes the same map.
func (m *Map) BeginJoinSharingSeeds(url string, driver int) (*Map, error) {
	return m.beginJoin(url, driver, false)
}

func (m *Map) beginJoin(url string, driver int, ownSeed bool) (*Map, error) {
	if err := m.idle(); err != nil {
		return nil, err
	}
	if err := m.isDriver(driver); err != nil {
		return nil, err
	}
	u, err := NormalizeURL(url)
	if err != nil {
		return nil, err
	}
	if m.ByURL(u) != nil {
		return nil, fmt.Errorf("%s is already a member", u)
	}
	if m.NextID > MaxNodeID {
		return nil, fmt.Errorf("no node id left: %d nodes have joined this cluster, at most %d can", m.NextID, MaxNodeID+1)
	}
	n, err := m.next()
	if err != nil {
		return nil, err
	}
	seed := xxhash.Sum64String(u)
	for salt := 0; ownSeed && slices.ContainsFunc(m.Nodes, func(o Node) bool { return o.Seed == seed }); salt++ {
		seed = xxhash.Sum64String(fmt.Sprintf("%s#%d#%d", u, m.NextID, salt))
	}
	n.Nodes = append(n.Nodes, Node{ID: m.NextID, URL: u, Seed: seed})
	n.NextID++
	n.Change = &Change{Kind: Join, Node: m.NextID, Stage: WriteBoth, Driver: driver}
	return n, n.Validate()
}

// BeginDecommission returns the map in which node id starts leaving,
// driven by node driver.
func (m *Map) BeginDecommission(id, driver int) (*Map, error) {
	if err := m.idle(); err != nil {
		return nil, err
	}
	if m.Node(id) == nil {
		return nil, fmt.Errorf("node %d is not a member", id)
	}
	if err := m.isDriver(driver); err != nil {
		return nil, err
	}
	if len(m.Nodes) == 1 {
		return nil, errors.New("the last node cannot be decommissioned")
	}
	n, err := m.next()
	if err != nil {
		return nil, err
	}
	n.Change = &Change{Kind: Decommission, Node: id, Stage: WriteBoth, Driver: driver}
	return n, n.Validate()
}

// Remove returns the map in which dead node id is removed, driven by node
// driver: a decommission whose leaving node is dead (Change.Dead), for a
// node whose machine will not come back and no spare machine to replace
// it with (docs/membership.md, "Removing a dead member"). The gaining
// nodes copy from the old set's live replicas: a write acknowledged by
// ack >= 2 replicas reached a live one while at most one of them is dead.
//
// With no change under way it begins one, refused if the cluster would be
// left with fewer nodes than the replication factor (writes asking every
// replica could never be acknowledged again). During a decommission of
// node id it marks that change's leaving node dead, at the same stage in
// a new epoch, so that the change finishes without it; the cluster's size
// was decided when the decommission began. During any other change it
// counts node id dead in it (Removing), at the same stage in a new epoch:
// the change goes on without waiting for the node, and the node is
// removed after it (RemoveNext), so that two dead members are removed
// with no spare machine (ScyllaDB's removenode --ignore-dead-nodes).
func (m *Map) Remove(id, driver int) (*Map, error) {
	if m.Node(id) == nil {
		return nil, fmt.Errorf("node %d is not a member", id)
	}
	if id == driver {
		return nil, fmt.Errorf("node %d cannot remove itself: it answers, so it is not dead (decommission it)", id)
	}
	if err := m.isDriver(driver); err != nil {
		return nil, err
	}
	if slices.Contains(m.Removing, id) {
		return nil, fmt.Errorf("%w: node %d is counted dead and removed once the change under way is over", ErrBusy, id)
	}
	if c := m.Change; c != nil {
		switch {
		case c.Kind == Decommission && c.Node == id && c.Dead:
			return nil, fmt.Errorf("%w: node %d is being removed already (%s)", ErrBusy, id, c.describe())
		case c.Kind == Decommission && c.Node == id:
			n, err := m.next()
			if err != nil {
				return nil, err
			}
			n.Change.Dead, n.Change.Driver = true, driver
			return n, n.Validate()
		}
		if left := len(m.New()) - len(m.Removing) - 1; left < m.NewReplicas() {
			return nil, fmt.Errorf("removing node %d after the %s would leave %d nodes, fewer than the replication factor %d: "+
				"replace it instead (dhtkvctl replace)", id, c.describe(), left, m.NewReplicas())
		}
		n, err := m.next()
		if err != nil {
			return nil, err
		}
		n.Removing = append(n.Removing, id)
		return n, n.Validate()
	}
	if len(m.Nodes)-1-len(m.Removing) < m.Replicas {
		return nil, fmt.Errorf("removing node %d would leave %d nodes, fewer than the replication factor %d: lower it first (dhtkvctl replicas), or replace the node", id, len(m.Nodes)-1-len(m.Removing), m.Replicas)
	}
	n, err := m.next()
	if err != nil {
		return nil, err
	}
	n.Change = &Change{Kind: Decommission, Node: id, Stage: WriteBoth, Driver: driver, Dead: true}
	return n, n.Validate()
}

// RemoveNext returns the map that begins removing the first node of
// Removing, as Remove does with no change under way, driven by the
// member with the lowest id not counted dead (the driver places nothing;
// under the log it only names a live member). Refused while a change is
// under way or when nothing is to be removed.
func (m *Map) RemoveNext() (*Map, error) {
	if m.Change != nil {
		return nil, fmt.Errorf("%w: %s", ErrBusy, m.Change.describe())
	}
	if len(m.Removing) == 0 {
		return nil, errors.New("no dead node to remove")
	}
	driver := -1
	for _, n := range m.Nodes {
		if !m.Dead(n.ID) {
			driver = n.ID
			break
		}
	}
	n, err := m.next()
	if err != nil {
		return nil, err
	}
	id := n.Removing[0]
	n.Removing = n.Removing[1:]
	n.keepRemoving()
	n.Change = &Change{Kind: Decommission, Node: id, Stage: WriteBoth, Driver: driver, Dead: true}
	return n, n.Validate()
}

// BeginReplicas returns the map in which the replication factor starts
// changing to n, driven by node driver. The nodes stay; each partition's
// replica list in the new set is the first n of its ranking over them
// (package placement), so the change moves only the partitions' n-th
// ranked replicas (growing: copied to them in the stream stage; shrinking:
// dropped by them at the end). It is refused during another change, for
// the factor the map has (nothing to do), and outside 1 ≤ n ≤ nodes.
func (m *Map) BeginReplicas(n, driver int) (*Map, error) {
	if err := m.idle(); err != nil {
		return nil, err
	}
	if n < 1 || n > len(m.Nodes) {
		return nil, fmt.Errorf("replication factor %d out of range: from 1 to the number of nodes, %d", n, len(m.Nodes))
	}
	if n == m.Replicas {
		return nil, fmt.Errorf("the replication factor is %d already", n)
	}
	if err := m.isDriver(driver); err != nil {
		return nil, err
	}
	next, err := m.next()
	if err != nil {
		return nil, err
	}
	next.Change = &Change{Kind: Replicas, Node: driver, Stage: WriteBoth, Driver: driver, Replicas: n}
	return next, next.Validate()
}

// describe names the change for errors and logs.
func (c *Change) describe() string {
	if c.Kind == Replicas {
		return fmt.Sprintf("replicas change to %d, stage %s", c.Replicas, c.Stage)
	}
	return fmt.Sprintf("%s of node %d%s, stage %s", c.Kind, c.Node, c.deadMark(), c.Stage)
}

// deadMark is what describe and String add for a dead leaving node.
func (c *Change) deadMark() string {
	if c.Dead {
		return " (dead)"
	}
	return ""
}

// Advance returns the map of the change's next stage: the last stage
// advances to a map without a change, whose nodes are the new set.
func (m *Map) Advance() (*Map, error) {
	if m.Change == nil {
		return nil, errors.New("no change under way")
	}
	n, err := m.next()
	if err != nil {
		return nil, err
	}
	switch m.Change.Stage {
	case WriteBoth:
		n.Change.Stage = Stream
	case Stream:
		n.Change.Stage = ReadNew
	case ReadNew:
		n.Nodes = slices.Clone(m.New())
		n.Replicas = m.NewReplicas()
		n.Change = nil
		n.keepRemoving()
	}
	return n, n.Validate()
}

// ErrPastReadNew refuses to abort a change that reached read-new.
var ErrPastReadNew = errors.New("the change reached read-new: reads use the new set, so it can only complete")

// Abort returns the map that ends the change under way with the old set:
// a joining node is out of the map again (its id is not given back:
// NextID stays), a leaving node stays a member. A change is aborted only
// before read-new: until then every node reads the old set, which every
// write of every stage reaches, so a node still at the stage before and a
// node at the aborted map read and write compatibly. Once a node may read
// the new set (read-new), writes made under the old set alone could be
// missed by its reads: the change can then only complete.
func (m *Map) Abort() (*Map, error) {
	if m.Change == nil {
		return nil, errors.New("no change under way")
	}
	if m.Change.Stage == ReadNew {
		return nil, ErrPastReadNew
	}
	n, err := m.next()
	if err != nil {
		return nil, err
	}
	n.Nodes = slices.Clone(m.Old())
	n.Change = nil
	n.keepRemoving() // a join's node counted dead leaves with the join
	if left := len(n.Nodes) - len(n.Removing); len(n.Removing) > 0 && left < n.Replicas {
		return nil, fmt.Errorf("aborting would leave %d nodes once the dead nodes %v are removed, fewer than the replication factor %d: "+
			"let the change finish, or replace a dead node (dhtkvctl replace)", left, n.Removing, n.Replicas)
	}
	return n, n.Validate()
}

// Replace returns the map in which node id is reached at url instead: a
// new, empty machine takes the identity of a dead one and rebuilds its
// data from the other replicas. Its id and seed stay, so placement does
// not change: with no change under way the node's replica sets, and
// during one both the old and the new set (the node may be in either,
// or be the node a join adds or a decommission removes).
//
// During a change the change stays as it is, at the same stage, in the
// new epoch: its Node and Driver are ids, which the replacement keeps.
// The stage then waits for the new machine (docs/membership.md, "A
// member that dies during a change"): it acknowledges the stage only once
// it holds its partitions of both sets, rebuilt from the other replicas
// of each, so the change never ends, and the old set never drops a
// partition, while a replica of the new set is missing.
func (m *Map) Replace(id int, url string) (*Map, error) {
	u, err := NormalizeURL(url)
	if err != nil {
		return nil, err
	}
	if m.Node(id) == nil {
		return nil, fmt.Errorf("node %d is not a member", id)
	}
	if c := m.Change; c != nil && c.Dead && c.Node == id {
		return nil, fmt.Errorf("node %d is being removed (%s): it leaves the map when the change ends", id, c.describe())
	}
	if slices.Contains(m.Removing, id) {
		return nil, fmt.Errorf("node %d is counted dead and removed once the change under way is over", id)
	}
	if m.ByURL(u) != nil {
		return nil, fmt.Errorf("%s is already a member", u)
	}
	n, err := m.next()
	if err != nil {
		return nil, err
	}
	n.Node(id).URL = u
	return n, n.Validate()
}

// SamePlacement reports whether m and o place every partition alike, in
// both sets and at every stage's read and write sets: the same nodes by
// id and seed, the same factors, and the same change at the same stage
// (a replace's map and the one before it, whose URLs may differ; a
// remove's of a decommission under way and the one before it, which
// differ by the change's dead mark).
func (m *Map) SamePlacement(o *Map) bool {
	if m.Replicas != o.Replicas || len(m.Nodes) != len(o.Nodes) {
		return false
	}
	for i, n := range m.Nodes {
		if n.ID != o.Nodes[i].ID || n.Seed != o.Nodes[i].Seed {
			return false
		}
	}
	if m.Change == nil || o.Change == nil {
		return m.Change == nil && o.Change == nil
	}
	a, b := *m.Change, *o.Change
	a.Driver, b.Driver = 0, 0 // the driver places nothing
	a.Dead, b.Dead = false, false
	return a == b
}

// Encode returns the map as JSON.
func (m *Map) Encode() []byte {
	b, err := json.Marshal(m)
	if err != nil {
		panic(fmt.Sprintf("membership: encode map: %v", err)) // plain data: cannot fail
	}
	return b
}

// Decode parses and validates a map.
func Decode(b []byte) (*Map, error) {
	var m Map
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("cluster map: %w", err)
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// String is a one-line summary for logs.
func (m *Map) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "epoch %d, %d nodes", m.Epoch, len(m.Nodes))
	if c := m.Change; c != nil {
		if c.Kind == Replicas {
			fmt.Fprintf(&b, ", replication factor %d to %d at stage %s", m.Replicas, c.Replicas, c.Stage)
		} else {
			fmt.Fprintf(&b, ", %s of node %d%s at stage %s", c.Kind, c.Node, c.deadMark(), c.Stage)
		}
	}
	if len(m.Removing) > 0 {
		fmt.Fprintf(&b, ", nodes %v dead, to be removed", m.Removing)
	}
	return b.String()
}

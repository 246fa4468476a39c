package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/store"
)

// ErrLeft: the data directory belongs to a node that left the cluster:
// decommissioned, or removed or replaced while it was down.
// The binary exits 0 on it, as it does when the decommission ends, so that
// a supervisor restarting on failure (systemd's Restart=on-failure,
// compose's restart: on-failure) does not restart it in a loop.
var ErrLeft = errors.New("this node left the cluster")

// Bootstrap is what a node's first map comes from.
type Bootstrap struct {
	// DataDir names the data directory in messages.
	DataDir string
	// Self is this node's URL (--self).
	Self string
	// Join is a member's URL (--join), or "".
	Join string
	// Topology is the --cluster list, which seeds a new cluster's map.
	Topology clustermap.Topology
	// Listed says --cluster was given (Topology is otherwise this node
	// alone). A data directory that holds a map seeded from another list
	// is then refused: the list is read only when the directory is new,
	// and a changed one would otherwise be ignored without a word.
	Listed bool
	// Replicas is the replication factor a seeded map gets (--replicas;
	// 0: the list's size).
	Replicas int
	// Fetch asks the member at url for its State (rpc.FetchMap).
	Fetch func(url string) ([]byte, error)
	// Wait is how long a node started with Join waits for the change
	// that adds it (node.Config.JoinWait; 0: not at all), asking the
	// member again every JoinPoll; Ctx ends the wait early (the process
	// is asked to stop; nil: never), and Log tells the operator.
	Wait time.Duration
	Ctx  context.Context
	Log  *slog.Logger
}

// JoinPoll is how often a node waiting to be joined asks the member for
// its map again.
const JoinPoll = 500 * time.Millisecond

// Map returns the cluster map the node starts with, and its id in it: the
// map in st; else, with Join, the member's (joined is then true); else one
// seeded from Topology. A map taken or seeded is stored in st before
// anything else happens.
func (b Bootstrap) Map(st *store.Store) (m *clustermap.Map, self int, joined bool, err error) {
	selfURL, err := clustermap.NormalizeURL(b.Self)
	if err != nil {
		return nil, 0, false, fmt.Errorf("--self: %w", err)
	}
	stored, ok, err := st.ClusterMap()
	if err != nil {
		return nil, 0, false, err
	}
	id, hasID, err := st.Identity()
	if err != nil {
		return nil, 0, false, err
	}
	switch {
	case ok:
		if m, err = clustermap.Decode(stored); err != nil {
			return nil, 0, false, fmt.Errorf("data directory %s: %w", b.DataDir, err)
		}
		if err := b.sameList(m); err != nil {
			return nil, 0, false, err
		}
		me := m.ByURL(selfURL)
		if hasID && m.Node(id.Node) == nil {
			return nil, 0, false, fmt.Errorf("%w: data directory %s belongs to node %d, which was decommissioned (map %s): delete the directory to use this machine again", ErrLeft, b.DataDir, id.Node, m)
		}
		if me == nil {
			return nil, 0, false, fmt.Errorf("--self %s is not in the cluster map of data directory %s (%s)", selfURL, b.DataDir, m)
		}
		if err := b.stillMember(m, *me); err != nil {
			return nil, 0, false, err
		}
		return m, me.ID, false, nil
	case b.Join != "":
		if hasID {
			return nil, 0, false, fmt.Errorf("--join: data directory %s already belongs to node %d of cluster %016x", b.DataDir, id.Node, id.Cluster)
		}
		me, theirs, err := b.awaitJoined(selfURL)
		if err != nil {
			return nil, 0, false, err
		}
		m, self, joined = theirs, me.ID, true
	default:
		if m, err = clustermap.Seed(b.Topology.Nodes, b.Replicas); err != nil {
			return nil, 0, false, fmt.Errorf("--cluster: %w", err)
		}
		self = b.Topology.Self
	}
	if err := st.SetClusterMap(m.Encode()); err != nil {
		return nil, 0, false, err
	}
	return m, self, joined, nil
}

// stillMember asks the other members of the stored map m, at once, for
// their maps, and refuses with ErrLeft a data directory whose node the
// cluster gave up on while it was down: the newest answer (of m's cluster,
// newer than m) no longer has the node (removed, or decommissioned before
// it installed the last map), gives its id to another URL (replaced), or
// marks it dead in the change under way (being removed). Such a node must
// not serve, nor rejoin with, its records: they may be older than deletes
// the cluster has collected since, and would bring the deleted values
// back. A member that does not answer (Fetch's timeout; all of them at a
// whole cluster's restart) tells nothing, and the node starts: a map
// installed later that no longer has it stops it as well (Service.leave),
// but only once it has started.
func (b Bootstrap) stillMember(m *clustermap.Map, me clustermap.Node) error {
	if b.Fetch == nil {
		return nil
	}
	answers := make(chan *clustermap.Map, len(m.Nodes))
	asked := 0
	for _, n := range m.Nodes {
		if n.ID == me.ID {
			continue
		}
		asked++
		go func() {
			var theirs *clustermap.Map
			if b, err := b.Fetch(n.URL); err == nil {
				if st, err := ParseState(b); err == nil && st.Map.Cluster == m.Cluster {
					theirs = st.Map
				}
			}
			answers <- theirs
		}()
	}
	newest := m
	for range asked {
		if theirs := <-answers; theirs != nil && theirs.Epoch > newest.Epoch {
			newest = theirs
		}
	}
	why := ""
	switch n := newest.Node(me.ID); {
	case n == nil:
		why = "was removed from the cluster (or decommissioned) while it was down"
	case n.URL != me.URL:
		why = fmt.Sprintf("was replaced by %s while it was down", n.URL)
	case newest.Dead(me.ID):
		why = "is being removed from the cluster as dead"
	default:
		return nil
	}
	return fmt.Errorf("%w: data directory %s belongs to node %d (%s), which %s (the members' cluster map: %s): "+
		"its records may be older than deletes the cluster has collected since, so it must not serve them or rejoin with them; "+
		"delete the directory to use this machine again (dhtkvctl join)", ErrLeft, b.DataDir, me.ID, me.URL, why, newest)
}

// awaitJoined fetches the member's map until it names selfURL, for up to
// Wait: a node may be started before the change that adds it. A member
// that does not answer, or answers a map without this node, is asked
// again; the last answer is the error once Wait is over.
func (b Bootstrap) awaitJoined(selfURL string) (*clustermap.Node, *clustermap.Map, error) {
	ctx := b.Ctx
	if ctx == nil {
		ctx = context.Background()
	}
	log := b.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	deadline := time.Now().Add(b.Wait)
	logged := time.Time{}
	for {
		var err error
		ans, ferr := b.Fetch(b.Join)
		if ferr != nil {
			err = fmt.Errorf("--join: %w", ferr)
		} else if theirs, perr := ParseState(ans); perr != nil {
			err = fmt.Errorf("--join: the cluster map from %s: %w", b.Join, perr)
		} else if me := theirs.Map.ByURL(selfURL); me != nil {
			return me, theirs.Map, nil
		} else {
			err = fmt.Errorf("--join: %s is not in the cluster map of %s (%s): add it with dhtkvctl join %s (or replace)", selfURL, b.Join, theirs.Map, selfURL)
		}
		if !time.Now().Add(JoinPoll).Before(deadline) {
			return nil, nil, err
		}
		if time.Since(logged) > 30*time.Second {
			logged = time.Now()
			log.Info("waiting to be added to the cluster", "self", selfURL, "member", b.Join, "for_at_most", time.Until(deadline).Round(time.Second), "now", err.Error())
		}
		select {
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("--join: stopped while waiting to be added to the cluster: %w", ctx.Err())
		case <-time.After(JoinPoll):
		}
	}
}

// sameList refuses a --cluster list other than the one stored's map was
// seeded from (the cluster id is a hash of that list). Membership changes
// since keep the id, so the list a node was first started with stays
// valid after joins and decommissions; a node that joined has no list
// (--join) and is not checked.
func (b Bootstrap) sameList(stored *clustermap.Map) error {
	if !b.Listed || b.Join != "" {
		return nil
	}
	seed, err := clustermap.Seed(b.Topology.Nodes, b.Replicas)
	if err != nil {
		return fmt.Errorf("--cluster: %w", err)
	}
	if seed.Cluster == stored.Cluster {
		return nil
	}
	urls := make([]string, len(stored.Nodes))
	for i, n := range stored.Nodes {
		urls[i] = n.URL
	}
	return fmt.Errorf("--cluster %s is not the list data directory %s was created with: it holds the map of cluster %016x (%s; members %s). "+
		"--cluster is read only when the directory is new: start with the original list, change membership with dhtkvctl join, decommission or replace (docs/membership.md), or use an empty directory for a new cluster",
		strings.Join(b.Topology.Nodes, ","), b.DataDir, stored.Cluster, stored, strings.Join(urls, ","))
}

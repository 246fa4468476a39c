package node

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/maplog"
	"github.com/dhtkv/dhtkv/internal/rpc"
)

// The cluster map's Raft log, which every node runs (Config.MapLog;
// docs/membership.md, "The map on a consensus log").
//
//   - Where: a Pebble instance of its own under <data-dir>/maplog, on the
//     store's file system (vfs.NewMem in the in-memory test cluster).
//   - Transport: the node's public port. A peer upgrades an internal
//     request (rpc.LogPath) and the connection goes to the log's network
//     (rpc.LogListener); peers are dialed with rpc.DialLog over the
//     node's PeerDial and client TLS. A node's log address is therefore
//     its URL's host:port (maplog.URLAddr, maplog.Options.AddrFromURL):
//     --cluster names every seed's, and a join needs none.
//   - Start-up: a node started without --join whose log has no state
//     bootstraps the voting group from the --cluster list (ids by
//     position, as the map is seeded; the first 3 or 5 vote), and every
//     such node proposes its map as the log's seed until the log holds a
//     map: the seeds all propose the same map, the first applied wins and
//     the others are refused. A node started with --join learns its id
//     from the member's map (membership.Bootstrap) and opens the log with
//     it; the leader's upkeep adds it to the group (maplog.Log.Rebalance).
//     A restart resumes from the persisted log and bootstraps nothing.
//   - Upgrade of a data directory that holds a map and no log state:
//     the --cluster seeds bootstrap as above and each proposes its
//     stored map; the log keeps the seed of the highest epoch proposed
//     while it holds only a seed (maplog's seed rule), so the most
//     advanced of the seeds' stored maps wins. Nodes that joined are added
//     by the upkeep. It needs every seed of the --cluster list to be
//     started (a quorum of its voters to be reachable), including seeds
//     decommissioned since: not supported beyond that.

// seedRetry is the wait between two proposals of the seed while the log
// holds no map (no leader yet, or a seed refused for a reason that may
// pass).
const seedRetry = time.Second

// openMapLog opens and starts this node's replica of the log, as node
// self of cmap, bootstrapping a brand-new group from topo (the --cluster
// list) when the node is a seed and the log has no state. It sets n.mapLog
// and n.logConns; the public port carries the log's traffic once served.
func (n *Node) openMapLog(cmap *clustermap.Map, self int, topo clustermap.Topology, peerTLS *tls.Config) (err error) {
	cfg := n.cfg
	me := cmap.Node(self)
	if me == nil {
		return fmt.Errorf("maplog: node %d is not in the cluster map %s", self, cmap)
	}
	addr := maplog.URLAddr(me.URL)
	o := cfg.MapLog
	o.AddrFromURL = true
	n.logConns = rpc.NewLogListener(addr)
	dialOpts := rpc.LogDialOptions{Dial: cfg.PeerDial, TLS: peerTLS, Secret: cfg.ClusterSecret}
	dial := func(ctx context.Context, a string, timeout time.Duration) (net.Conn, error) {
		return rpc.DialLog(ctx, a, timeout, dialOpts)
	}
	network := maplog.NewNetwork(n.logConns, addr, dial, maplog.Auth{Secret: cfg.ClusterSecret, Upgraded: true}, o, n.log)
	fsys := cfg.FS
	if fsys == nil {
		fsys = vfs.Default
	}
	l, err := maplog.Open(fsys, filepath.Join(cfg.DataDir, "maplog"), self, maplog.NewTCPTransport(network, n.log), network, o, n.log)
	if err != nil {
		network.Close()
		return err
	}
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	has, err := l.HasState()
	if err != nil {
		return fmt.Errorf("maplog: read its state: %w", err)
	}
	// A replica whose release applies older rules than the log's stops
	// applying it; the node then stops (maplog.ErrBehindRules).
	l.OnBehind(func(err error) {
		n.log.Error("the node can no longer follow the cluster map's log", "err", err)
		n.fail(err)
	})
	network.Start()
	if err := l.Start(); err != nil {
		return err
	}
	if err := l.Behind(); err != nil {
		return err // found in the snapshot restored at Start
	}
	seed := cfg.Join == ""
	if seed && !has {
		servers := make([]maplog.Server, len(topo.Nodes))
		for i, u := range topo.Nodes {
			servers[i] = maplog.Server{ID: i, Addr: maplog.URLAddr(u)}
		}
		if err := l.Bootstrap(servers); err != nil {
			return err
		}
	}
	l.Register(n.registry)
	n.mapLog = l
	ctx, cancel := context.WithCancel(context.Background())
	n.stopSeed = cancel
	if seed {
		n.seedDone.Go(func() { n.seedMapLog(ctx, l, cmap) })
	}
	return nil
}

// seedMapLog proposes m as the log's first map until the log holds one
// or ctx ends.
func (n *Node) seedMapLog(ctx context.Context, l *maplog.Log, m *clustermap.Map) {
	for {
		st, changed := l.Watch()
		if st.Map != nil {
			return
		}
		actx, cancel := context.WithTimeout(ctx, n.cfg.MapLog.ApplyTimeout+seedRetry)
		res, err := l.Submit(actx, maplog.Command{Op: maplog.OpSeed, Map: m})
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && !errors.Is(err, context.DeadlineExceeded):
			n.log.Warn("maplog: propose the cluster map's seed", "err", err)
		case err == nil && res.Accepted:
			n.log.Info("maplog: the log is seeded", "map", res.Map.String())
			return
		case err == nil && res.Map != nil && !bytes.Equal(res.Map.Encode(), m.Encode()):
			// Another seed won (another seed node's settings, say
			// --replicas): membership installs the log's.
			n.log.Warn("maplog: the log was seeded with another map than this node's; this node follows the log's",
				"log", res.Map.String(), "log_replicas", res.Map.Replicas, "own", m.String(), "own_replicas", m.Replicas)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-time.After(seedRetry):
		}
	}
}

// closeMapLog stops the seeding and closes the log (after membership,
// which follows it).
func (n *Node) closeMapLog() {
	if n.mapLog == nil {
		return
	}
	n.stopSeed()
	n.seedDone.Wait()
	if err := n.mapLog.Close(); err != nil {
		n.log.Warn("maplog: close", "err", err)
	}
	n.mapLog = nil
}

// MapLog is the node's replica of the cluster map's log (nil before the
// node's cluster parts are built and after they are closed).
func (n *Node) MapLog() *maplog.Log { return n.mapLog }

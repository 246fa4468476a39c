package testcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/node"
)

// InMemory is a cluster of real nodes (node.New, the code that ships) in
// the test's process with no socket and no disk: each node serves a
// fasthttputil.InmemoryListener, keeps its Pebble store in its own
// vfs.NewMem(), and reaches the other nodes through a dialer that routes
// by address to their listeners over a MemLink per ordered pair of nodes,
// which the test cuts, delays and heals. Test clients (Client) reach every
// node directly: a cut separates the nodes, not the clients.
//
// A node's address (its name in the cluster list) is 127.0.0.1:<port> with
// a port nothing listens on: the nodes' loopback checks (node/security.go,
// the internal endpoints' peer check) see a loopback peer, as on one
// machine.
//
// A stopped node keeps its file system, so StartNode brings it back with
// its data (a restart); WipeNode gives it an empty one (a lost disk).
//
// Clock: a node's clock is the process's, shifted by its
// node.Config.ClockOffset (Reconfigure, then a restart) and by the step
// StepClock sets while it runs. Run in a
// testing/synctest bubble (InBubble), that is the bubble's fake clock:
// it starts at 2000-01-01 00:00 UTC and moves only when every goroutine
// of the bubble is blocked, jumping to the next timer due, so timeouts,
// intervals and versions no longer depend on the machine's speed, and a
// test moves time on with time.Sleep. Outside a bubble it is the wall
// clock: protocol steps are then triggered on demand (Repair, short hint
// intervals) and their effects awaited (Await), never slept for.
type InMemory struct {
	t testing.TB

	mu    sync.Mutex
	nodes []*memNode
	links map[[2]int]*MemLink // [from, to]
}

// InBubble runs f in a testing/synctest bubble of its own, for tests of an
// in-memory cluster on the bubble's fake clock (see InMemory). Everything
// a node does in memory blocks durably, as synctest requires (channels,
// sync.Cond, timers; no socket, no file), so the bubble's clock moves
// whenever the nodes wait. Two things need help, both fasthttp's:
//
//   - its process-wide date updater, a goroutine that never ends, is
//     started here, outside the bubble: started inside, it would keep the
//     bubble from ending;
//   - after a node stops, its server's worker-pool cleaner and its peer
//     clients' idle-connection cleaners sleep up to 30 s before they see
//     it and end: a last cleanup sleeps two minutes of fake time (no real
//     time) so that the bubble ends with no goroutine left.
//
// f must not call t.Run or t.Parallel (synctest forbids them), and every
// cluster it starts is stopped by its cleanups, inside the bubble.
func InBubble(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	var h fasthttp.ResponseHeader
	h.AppendBytes(nil) // starts fasthttp's date updater, once per process
	synctest.Test(t, func(t *testing.T) {
		// Registered first, so it runs last, after the clusters stopped.
		t.Cleanup(func() { time.Sleep(2 * time.Minute) })
		f(t)
	})
}

// memNode is one node's configuration and state across restarts.
type memNode struct {
	cfg   node.Config
	addr  string // public address, host:port (cfg.Listen)
	admin string // admin address, host:port
	fs    vfs.FS // kept across a stop; replaced by WipeNode
	// step is how far StepClock moved the node's clock from the
	// process's, in nanoseconds; kept across restarts, as a host's clock.
	step atomic.Int64

	// While running (all nil while stopped):
	n       *node.Node
	ln      *fasthttputil.InmemoryListener
	adminLn *fasthttputil.InmemoryListener
}

// inMemoryBasePort numbers the nodes' addresses: node i is 127.0.0.1 at
// inMemoryBasePort+i, its admin listener 1000 above. Nothing listens
// there; they are names.
const inMemoryBasePort = 7001

// StartInMemory starts n nodes forming one cluster in memory and stops
// them at the end of the test. Options adjust each node's configuration
// as for Start; the defaults differ from node.DefaultConfig as Start's
// do, and anti-entropy runs only on demand (Repair).
func StartInMemory(t testing.TB, n int, opts ...Option) *InMemory {
	t.Helper()
	c := &InMemory{t: t, links: map[[2]int]*MemLink{}}
	urls := make([]string, n)
	for i := range n {
		urls[i] = "http://" + memAddr(i)
	}
	for i := range n {
		cfg := memConfig(i)
		cfg.Cluster = strings.Join(urls, ",")
		for _, o := range opts {
			o(i, &cfg)
		}
		c.add(cfg)
	}
	t.Cleanup(c.StopAll)
	for i := range n {
		c.StartNode(i)
	}
	return c
}

// memAddr is node i's public address.
func memAddr(i int) string { return "127.0.0.1:" + strconv.Itoa(inMemoryBasePort+i) }

// memConfig is node i's configuration before options: small caches, no
// fsync (a MemFS has nothing to sync to), anti-entropy only on demand.
func memConfig(i int) node.Config {
	cfg := node.DefaultConfig()
	cfg.Listen = memAddr(i)
	cfg.DataDir = fmt.Sprintf("/node%d", i+1)
	cfg.Store.Sync = false
	cfg.CacheBytes = 1 << 20
	cfg.Store.BlockCacheBytes = 1 << 20
	cfg.Store.MemTableBytes = 1 << 20
	cfg.ReplicaTimeout = 500 * time.Millisecond
	cfg.AntiEntropy.Interval = 0
	// Background work at its configured rates, whatever the machine's
	// scheduler latency (package pace): in-memory runs depend on nothing
	// real.
	cfg.Pace.Target = 0
	// No descriptors are involved: skip the derivation from the limit.
	cfg.MaxConnections = 1 << 12
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return cfg
}

// add registers a node (not started) and its links to and from every
// other node, and returns its index.
func (c *InMemory) add(cfg node.Config) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := len(c.nodes)
	port := inMemoryBasePort + i
	c.nodes = append(c.nodes, &memNode{
		cfg: cfg, addr: cfg.Listen, admin: "127.0.0.1:" + strconv.Itoa(port+1000), fs: vfs.NewMem(),
	})
	for j := range i {
		c.links[[2]int{i, j}] = &MemLink{conns: map[*linkConn]struct{}{}}
		c.links[[2]int{j, i}] = &MemLink{conns: map[*linkConn]struct{}{}}
	}
	return i
}

// Size is the number of nodes, stopped ones included.
func (c *InMemory) Size() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.nodes)
}

// URL is node i's base URL, its name in the cluster list.
func (c *InMemory) URL(i int) string { return "http://" + c.member(i).addr }

// AdminURL is node i's admin listener's base URL (reached with Client).
func (c *InMemory) AdminURL(i int) string { return "http://" + c.member(i).admin }

// Index returns the index of the node at url (-1: none).
func (c *InMemory) Index(url string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, m := range c.nodes {
		if "http://"+m.addr == url {
			return i
		}
	}
	return -1
}

func (c *InMemory) member(i int) *memNode {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i]
}

// Node returns running node i (nil if stopped).
func (c *InMemory) Node(i int) *node.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i].n
}

// Config returns node i's configuration (without its listeners and FS).
func (c *InMemory) Config(i int) node.Config {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i].cfg
}

// Reconfigure changes node i's configuration for its next start.
func (c *InMemory) Reconfigure(i int, fn func(*node.Config)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fn(&c.nodes[i].cfg)
}

// StartNode starts stopped node i on fresh in-memory listeners and the
// file system it had.
func (c *InMemory) StartNode(i int) {
	c.t.Helper()
	require.NoError(c.t, c.startNode(i), "start node %d", i)
}

func (c *InMemory) startNode(i int) error {
	c.mu.Lock()
	m := c.nodes[i]
	if m.n != nil {
		c.mu.Unlock()
		return fmt.Errorf("node %d already running", i)
	}
	cfg := m.cfg
	c.mu.Unlock()
	ln, adminLn := fasthttputil.NewInmemoryListener(), fasthttputil.NewInmemoryListener()
	ln.SetLocalAddr(tcpAddr(m.addr))
	adminLn.SetLocalAddr(tcpAddr(m.admin))
	cfg.Listener, cfg.AdminListener, cfg.FS = ln, adminLn, m.fs
	cfg.PeerDial = func(addr string, _ time.Duration) (net.Conn, error) { return c.dialFrom(i, addr) }
	if cfg.WallClock == nil {
		cfg.WallClock = func() time.Time { return time.Now().Add(time.Duration(m.step.Load())) }
	}
	n, err := node.New(cfg)
	if err != nil {
		ln.Close()
		adminLn.Close()
		return err
	}
	// Registered before Serve: Serve returns once the node accepts, and
	// its peers may dial it from then on.
	c.mu.Lock()
	m.ln, m.adminLn = ln, adminLn
	c.mu.Unlock()
	if err := n.Serve(); err != nil {
		c.mu.Lock()
		m.ln, m.adminLn = nil, nil
		c.mu.Unlock()
		n.Close()
		ln.Close()
		adminLn.Close()
		return err
	}
	c.mu.Lock()
	m.n = n
	c.mu.Unlock()
	return nil
}

// StopNode shuts node i down gracefully; its file system stays for the
// next StartNode.
func (c *InMemory) StopNode(i int) {
	c.t.Helper()
	c.mu.Lock()
	m := c.nodes[i]
	n, readTimeout := m.n, m.cfg.ReadTimeout
	m.n, m.ln, m.adminLn = nil, nil, nil // refuse new dials from now on
	c.mu.Unlock()
	if n == nil {
		return
	}
	// As Cluster.stop: a connection mid-request may hold a graceful
	// shutdown up to the read timeout.
	ctx, cancel := context.WithTimeout(context.Background(), readTimeout+10*time.Second)
	defer cancel()
	require.NoError(c.t, n.Shutdown(ctx), "stop node %d", i)
	// The links' connections to and from it are dead; drop them.
	for _, l := range c.linksOf(i) {
		l.closeConns()
	}
}

// StepClock sets node i's clock to offset from the process's (the
// bubble's), at once, whether it runs or not: a host's clock stepped
// while the node serves, as a wrong NTP source or a date command would,
// which the node sees only through its clock (its monotonic time is the
// process's). 0 puts it right again. It adds to the node's ClockOffset.
func (c *InMemory) StepClock(i int, offset time.Duration) {
	c.member(i).step.Store(int64(offset))
}

// WipeNode gives stopped node i an empty file system: its disk was lost.
func (c *InMemory) WipeNode(i int) {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	require.Nil(c.t, c.nodes[i].n, "node %d is running", i)
	c.nodes[i].fs = vfs.NewMem()
}

// RestoreCheckpoint gives stopped node i, as its data directory, the
// checkpoint it wrote to dir (store.Store.Checkpoint) on its own file
// system: its backup restored, and nothing else of the file system kept.
func (c *InMemory) RestoreCheckpoint(i int, dir string) {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.nodes[i]
	require.Nil(c.t, m.n, "node %d is running", i)
	restored := vfs.NewMem()
	ok, err := vfs.Clone(m.fs, restored, dir, m.cfg.DataDir)
	require.NoError(c.t, err)
	require.True(c.t, ok, "node %d has no %s", i, dir)
	m.fs = restored
}

// StopAll stops every running node.
func (c *InMemory) StopAll() {
	for i := range c.Size() {
		c.StopNode(i)
	}
}

// AddNode prepares a node that will join the cluster through node via: an
// address, an empty file system, and --join naming via, with via's
// configuration otherwise. It is neither a member nor started: Join
// begins the change that adds it, StartNode starts it. It returns the
// node's index.
func (c *InMemory) AddNode(via int, opts ...Option) int {
	c.mu.Lock()
	i := len(c.nodes)
	cfg := c.nodes[via].cfg
	c.mu.Unlock()
	fresh := memConfig(i)
	cfg.Listen, cfg.DataDir, cfg.Logger = fresh.Listen, fresh.DataDir, fresh.Logger
	cfg.Self, cfg.Cluster = "", ""
	cfg.Join = c.URL(via)
	for _, o := range opts {
		o(i, &cfg)
	}
	return c.add(cfg)
}

// Join asks node via, through its admin listener, to add node i (from
// AddNode), and returns the answer's status (202: the change began). Node
// i is not started: the change waits for it in its first stage until
// StartNode.
func (c *InMemory) Join(via, i int) int {
	c.t.Helper()
	code, body := c.Client().Do(c.t, http.MethodPost, c.AdminURL(via)+"/cluster/join?node="+c.URL(i), nil)
	if code != http.StatusAccepted {
		c.t.Logf("join: %d %s", code, body)
	}
	return code
}

// Decommission asks node via to remove node i; it returns the admin
// answer's status.
func (c *InMemory) Decommission(via, i int) int {
	c.t.Helper()
	code, body := c.Client().Do(c.t, http.MethodPost, c.AdminURL(via)+"/cluster/decommission?node="+c.URL(i), nil)
	if code != http.StatusAccepted {
		c.t.Logf("decommission: %d %s", code, body)
	}
	return code
}

// AwaitLeft waits until node i knows it was decommissioned, then stops
// it, as its process would.
func (c *InMemory) AwaitLeft(i int, timeout time.Duration) {
	c.t.Helper()
	n := c.Node(i)
	require.NotNil(c.t, n, "node %d is stopped", i)
	select {
	case <-n.Left():
	case <-time.After(timeout):
		c.t.Fatalf("node %d did not learn that it left within %v", i, timeout)
	}
	c.StopNode(i)
}

// MapStatus is what node i's admin listener says of its cluster map
// (GET /cluster).
type MapStatus struct {
	Map   *clustermap.Map `json:"map"`
	Self  int             `json:"self"`
	Moved uint64          `json:"moved"`
}

// ClusterStatus asks running node i for its cluster map.
func (c *InMemory) ClusterStatus(i int) MapStatus {
	c.t.Helper()
	code, body := c.Client().Do(c.t, http.MethodGet, c.AdminURL(i)+"/cluster", nil)
	require.Equal(c.t, http.StatusOK, code, "GET /cluster: %s", body)
	var st MapStatus
	require.NoError(c.t, json.Unmarshal(body, &st))
	return st
}

// AwaitStable waits until every running member has installed the same map
// with no change under way, and has dropped the partitions it no longer
// holds, and returns that map.
func (c *InMemory) AwaitStable(timeout time.Duration) *clustermap.Map {
	c.t.Helper()
	return c.AwaitStableAfter(0, timeout)
}

// AwaitStableAfter is AwaitStable for a map newer than epoch: what a change
// accepted at epoch ends with. (An admin call answers once the log accepted
// the change, before the members installed it: AwaitStable may find them
// all still at the map before.)
func (c *InMemory) AwaitStableAfter(epoch uint64, timeout time.Duration) *clustermap.Map {
	c.t.Helper()
	return c.awaitMap(epoch, timeout, true)
}

// AwaitNoChange is AwaitStable without waiting for the members' drops of
// the partitions they no longer hold: a test that acts while a drop is
// under way.
func (c *InMemory) AwaitNoChange(timeout time.Duration) *clustermap.Map {
	c.t.Helper()
	return c.awaitMap(0, timeout, false)
}

// awaitMap waits until every running member has installed the same map,
// newer than epoch, with no change under way, and, with drops, has dropped
// the partitions it no longer holds.
func (c *InMemory) awaitMap(epoch uint64, timeout time.Duration, drops bool) *clustermap.Map {
	c.t.Helper()
	var m *clustermap.Map
	c.Await(timeout, "a stable cluster map", func() (bool, string) {
		m = nil
		for i := range c.Size() {
			n := c.Node(i)
			if n == nil {
				continue
			}
			nm, self := n.Members().Map()
			if self < 0 {
				continue // left, not stopped yet
			}
			switch {
			case m == nil:
				m = nm
			case nm.Epoch != m.Epoch:
				return false, fmt.Sprintf("node %d at %s, another at %s", i, nm, m)
			}
			if nm.Change != nil {
				return false, fmt.Sprintf("node %d at %s", i, nm)
			}
			if drops && n.Members().CleanupPending() {
				return false, fmt.Sprintf("node %d still drops partitions it no longer holds", i)
			}
		}
		if m != nil && m.Epoch <= epoch {
			return false, fmt.Sprintf("every member at %s, not after epoch %d yet", m, epoch)
		}
		return m != nil, "no running member"
	})
	return m
}

// AwaitFormed waits until every running node knows that the cluster
// exists (it has seen every other node answer, and recorded it in its
// data's identity): from then on a node that starts with an empty disk
// rebuilds its share instead of starting a new cluster.
func (c *InMemory) AwaitFormed(timeout time.Duration) {
	c.t.Helper()
	c.Await(timeout, "formed cluster", func() (bool, string) {
		for i := range c.Size() {
			n := c.Node(i)
			if n == nil {
				continue
			}
			id, ok, err := n.Store().Identity()
			if err != nil || !ok || !id.Formed {
				return false, fmt.Sprintf("node %d: identity %+v, %v", i, id, err)
			}
		}
		return true, ""
	})
}

// Await polls cond until it holds or timeout passes, then fails the test
// with what and cond's last reason. The poll is the only wait: a protocol
// step's effect is awaited, never slept for.
func (c *InMemory) Await(timeout time.Duration, what string, cond func() (ok bool, why string)) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("no %s within %v: %s", what, timeout, why)
		}
		time.Sleep(2 * time.Millisecond) // the polling interval of a condition
	}
}

// Repair asks node i for an anti-entropy exchange with every peer through
// its admin listener (POST /repair) and returns what each found and did.
func (c *InMemory) Repair(i int) []client.Exchange {
	c.t.Helper()
	code, body := c.Client().Do(c.t, http.MethodPost, c.AdminURL(i)+"/repair", nil)
	require.Equal(c.t, http.StatusOK, code, "POST /repair: %s", body)
	var out []client.Exchange
	require.NoError(c.t, json.Unmarshal(body, &out))
	return out
}

// Client returns a test client that reaches every running node's public
// and admin listeners in memory, whatever the links' state. It opens a
// connection per request: a node's restart never leaves it holding a dead
// one.
func (c *InMemory) Client() *Client {
	tr := &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(_ context.Context, _, addr string) (net.Conn, error) {
			return c.dialDirect(addr)
		},
	}
	return &Client{HTTP: &http.Client{Timeout: 10 * time.Second, Transport: tr}}
}

// listenerAt returns the running listener at addr (public or admin), and
// the index of its node; nil if that node is stopped or addr names none.
func (c *InMemory) listenerAt(addr string) (*fasthttputil.InmemoryListener, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, m := range c.nodes {
		switch addr {
		case m.addr:
			return m.ln, i
		case m.admin:
			return m.adminLn, i
		}
	}
	return nil, -1
}

// dialDirect connects a test client to addr from 127.0.0.1:1.
func (c *InMemory) dialDirect(addr string) (net.Conn, error) {
	ln, _ := c.listenerAt(addr)
	if ln == nil {
		return nil, refused(addr)
	}
	return ln.DialWithLocalAddr(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1})
}

// dialFrom connects node from to the node at addr over their link: as a
// closed port would, it refuses while the link is cut or the node is
// stopped.
func (c *InMemory) dialFrom(from int, addr string) (net.Conn, error) {
	ln, to := c.listenerAt(addr)
	if ln == nil {
		return nil, refused(addr)
	}
	c.mu.Lock()
	l := c.links[[2]int{from, to}]
	local := tcpAddr(c.nodes[from].addr)
	c.mu.Unlock()
	if l == nil {
		return nil, refused(addr)
	}
	return l.dial(addr, func() (net.Conn, error) { return ln.DialWithLocalAddr(local) })
}

// Link is the link carrying node from's connections to node to.
func (c *InMemory) Link(from, to int) *MemLink {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.links[[2]int{from, to}]
	require.NotNil(c.t, l, "no link %d->%d", from, to)
	return l
}

// linksOf returns every link from or to node i.
func (c *InMemory) linksOf(i int) []*MemLink {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*MemLink
	for k, l := range c.links {
		if k[0] == i || k[1] == i {
			out = append(out, l)
		}
	}
	return out
}

// Cut cuts the links between nodes i and j, both ways.
func (c *InMemory) Cut(i, j int) {
	c.Link(i, j).Cut()
	c.Link(j, i).Cut()
}

// Isolate cuts node i off from every other node, both ways.
func (c *InMemory) Isolate(i int) {
	for _, l := range c.linksOf(i) {
		l.Cut()
	}
}

// Heal restores every link.
func (c *InMemory) Heal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range c.links {
		l.Heal()
	}
}

// Package testcluster runs real dhtkv nodes for tests: in-process servers on
// real 127.0.0.1 ports, each with its own Pebble directory under t.TempDir(),
// which a test can stop and start again on the same port and data. The
// process-level tests (SIGKILL) build and run cmd/dhtkv instead; see
// BuildBinary.
//
// StartInMemory (inmem.go) runs the same nodes with no socket and no disk:
// in-memory listeners, a MemFS each, links between them that a test cuts,
// delays and heals, and, inside a testing/synctest bubble (InBubble), a
// fake clock. The protocol stories of testdata/scenarios run on it
// (scenario_test.go); what needs real sockets or processes stays in
// internal/e2e.
//
// It also holds what the single-node tests (internal/httpapi) and the
// whole-cluster tests (internal/e2e) both use to read the range-scan API:
// a raw HTTP/1.1 client that shows the chunked encoding as it is on the
// wire (RawGet), readers of both framings (ReadChunks, ReadBinary), and
// generated data sets written straight into a node's store (FillStore).
//
// And the small helpers every test package would otherwise write again:
// Eventually (wait for a condition, failing with what was awaited),
// RepoRoot, DeadEndpoint (an address that refuses connections), Single (a
// one-node cluster), NewClient and NewAPIClient (an HTTP client and a
// package client client, both closed when the test ends), FreePorts.
// The internal tests (package x, not x_test) of packages testcluster
// imports, such as faultnet's, cannot import it back and keep their own
// where they need one.
package testcluster

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/faultnet"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/sizeflag"
	"github.com/dhtkv/dhtkv/internal/testpki"
)

// Cluster is a set of nodes that know each other.
type Cluster struct {
	t     testing.TB
	cfgs  []node.Config
	links [][]*faultnet.Link // StartLinked only: [from][to]
	mu    sync.Mutex
	nodes []*node.Node // nil while stopped
}

// Option adjusts every node's configuration before start.
type Option func(i int, c *node.Config)

// Start runs n nodes forming one cluster and stops them at the end of the
// test.
func Start(t testing.TB, n int, opts ...Option) *Cluster {
	t.Helper()
	return start(t, FreePorts(t, n), opts)
}

func start(t testing.TB, ports []int, opts []Option) *Cluster {
	t.Helper()
	n := len(ports)
	urls := make([]string, n)
	for i, p := range ports {
		urls[i] = fmt.Sprintf("http://127.0.0.1:%d", p)
	}
	c := &Cluster{t: t, nodes: make([]*node.Node, n)}
	for i := range n {
		cfg := node.DefaultConfig()
		cfg.Listen = fmt.Sprintf("127.0.0.1:%d", ports[i])
		cfg.DataDir = filepath.Join(t.TempDir(), fmt.Sprintf("node%d", i+1))
		cfg.Cluster = strings.Join(urls, ",")
		cfg.Store.Sync = false // tests that need fsync semantics run the binary
		cfg.CacheBytes = 8 << 20
		cfg.Store.BlockCacheBytes = 8 << 20
		cfg.Store.MemTableBytes = 4 << 20
		OnSharedDisk(&cfg)
		cfg.ReplicaTimeout = 500 * time.Millisecond
		// Anti-entropy only when a test asks (Repair, or an Option setting
		// AEInterval): a scheduled exchange would repair what a test of
		// another mechanism means to watch.
		cfg.AntiEntropy.Interval = 0
		// Background work at its configured rates: under -race on a
		// shared machine the scheduler's latency would slow it by up to
		// eight times (package pace), as the machine's load decides.
		cfg.Pace.Target = 0
		cfg.AdminListen = "127.0.0.1:0"
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		if testing.Verbose() {
			cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		}
		for _, o := range opts {
			o(i, &cfg)
		}
		c.cfgs = append(c.cfgs, cfg)
	}
	for i := range n {
		c.StartNode(i)
	}
	t.Cleanup(c.StopAll)
	return c
}

// MutualTLS gives every node a certificate of its own from ca (both
// extended key usages) and --peer-tls-ca ca: TLS on every listener and
// mutual TLS between the nodes. Send requests to Endpoint(i), with a
// client from NewTLSClient.
func MutualTLS(ca *testpki.CA) Option {
	return func(i int, c *node.Config) {
		c.TLSCert, c.TLSKey, _ = ca.Issue(fmt.Sprintf("node%d-%s", i+1, strings.ReplaceAll(c.Listen, ":", "-")))
		c.PeerTLSCA = ca.File
	}
}

// Size is the number of nodes.
func (c *Cluster) Size() int { return len(c.cfgs) }

// URL is node i's base URL: its name in the cluster list, always
// http://.
func (c *Cluster) URL(i int) string { return "http://" + c.cfgs[i].Listen }

// Endpoint is where requests to node i go: URL(i), or its https:// form
// when the node serves TLS.
func (c *Cluster) Endpoint(i int) string {
	if c.cfgs[i].TLSCert != "" {
		return "https://" + c.cfgs[i].Listen
	}
	return c.URL(i)
}

// Config returns node i's configuration.
func (c *Cluster) Config(i int) node.Config { return c.cfgs[i] }

// Node returns running node i (nil if stopped).
func (c *Cluster) Node(i int) *node.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i]
}

// AwaitReady waits until every running node is ready (node.Ready): its
// probes found a majority of each partition's replicas, which a node may
// not yet have just after the cluster started (its first probe of a peer
// that started after it failed). It also waits until no node is still
// asking its peers whether it lost its disk (node.Unconfirmed): a node
// started before its peers asks again only every 250 ms, and one whose
// peer stops before it asked stays unconfirmed, and says so in its
// status's warnings, until that peer is back.
func (c *Cluster) AwaitReady(timeout time.Duration) {
	c.t.Helper()
	var why error
	deadline := time.Now().Add(timeout)
	for {
		why = nil
		for i := range c.cfgs {
			if n := c.Node(i); n != nil {
				if err := n.Ready(); err != nil {
					why = fmt.Errorf("node %d: %w", i, err)
					break
				}
				if n.Unconfirmed() {
					why = fmt.Errorf("node %d: unconfirmed: has not heard from every peer since it started with an empty directory", i)
					break
				}
			}
		}
		if why == nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("cluster not ready after %v: %v", timeout, why)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition: no event to wait on
	}
}

// StartNode starts node i on its port and data directory. The port was
// released when the node stopped; in the rare case another process took it
// meanwhile, starting is retried briefly.
func (c *Cluster) StartNode(i int) {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	require.Nil(c.t, c.nodes[i], "node %d already running", i)
	var err error
	for try := 0; try < 50; try++ {
		var n *node.Node
		if n, err = node.Start(c.cfgs[i]); err == nil {
			c.nodes[i] = n
			return
		}
		time.Sleep(20 * time.Millisecond) // the retry interval
	}
	require.NoError(c.t, err, "start node %d", i)
}

// StopNode shuts node i down gracefully (its data stays).
func (c *Cluster) StopNode(i int) {
	c.t.Helper()
	c.mu.Lock()
	n := c.nodes[i]
	c.nodes[i] = nil
	c.mu.Unlock()
	if n == nil {
		return
	}
	c.stop(i, n, c.cfgs[i].ReadTimeout+10*time.Second)
}

// stop shuts node n (index i) down within d. Callers give it the node's
// read timeout and more: now and then, after load, a connection is still
// mid-request when the node stops and holds fasthttp's graceful shutdown
// until the read timeout ends it (about one run in ten of the membership
// load test; why that connection is still busy is not known).
func (c *Cluster) stop(i int, n *node.Node, d time.Duration) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	require.NoError(c.t, n.Shutdown(ctx), "stop node %d", i)
}

// WipeNode deletes stopped node i's data directory: its disk was lost.
func (c *Cluster) WipeNode(i int) {
	c.t.Helper()
	require.Nil(c.t, c.Node(i), "node %d is running", i)
	require.NoError(c.t, os.RemoveAll(c.cfgs[i].DataDir))
}

// StopAll stops every running node.
func (c *Cluster) StopAll() {
	for i := range c.cfgs {
		c.StopNode(i)
	}
}

// FreePorts returns n distinct TCP ports on 127.0.0.1 that were free a
// moment ago: each was bound and closed again. Where the kernel says which
// range it draws ephemeral ports from (Linux), they are taken from below
// that range, so that no outgoing connection (a client's, a peer's, in this
// test binary or in another package's running beside it) can be given one
// as its local port between the look-up and the node's bind, nor while a
// stopped node waits to start again on it; the look-up walks the band from
// a random point, so test binaries running side by side rarely meet.
// Elsewhere the kernel picks them (port 0).
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	var ls []net.Listener
	var ports []int
	for misses := 0; len(ports) < n; {
		port := 0
		if p, ok := nextPort(); ok && misses < 1000 {
			port = p
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil && port != 0 {
			misses++ // in use: the next one (after many, the kernel picks)
			continue
		}
		require.NoError(t, err)
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}

// nextPort is the next candidate of FreePorts' band below the ephemeral
// range, ok false where there is no such band.
func nextPort() (port int, ok bool) {
	portBand.once.Do(func() {
		b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
		if err != nil {
			return
		}
		var lo, hi int
		if _, err := fmt.Sscan(string(b), &lo, &hi); err != nil || lo <= 2048 {
			return
		}
		portBand.lo, portBand.size = max(1024, lo-20000), lo-max(1024, lo-20000)
		portBand.next.Store(rand.Int64N(int64(portBand.size)))
	})
	if portBand.size == 0 {
		return 0, false
	}
	return portBand.lo + int((portBand.next.Add(1)-1)%int64(portBand.size)), true
}

var portBand struct {
	once     sync.Once
	lo, size int          // the band is [lo, lo+size)
	next     atomic.Int64 // the next candidate's offset in the band, modulo size
}

// Client is a small HTTP client for tests, with ack/from helpers.
type Client struct{ HTTP *http.Client }

// NewClient returns a client whose requests time out after 10 seconds and
// which keeps up to 64 idle connections per node; its idle connections are
// closed at the end of the test, so none outlives it (goleak, a node's
// graceful shutdown).
func NewClient(t testing.TB) *Client {
	return newClient(t, nil)
}

// NewTLSClient is NewClient over TLS with cfg (testpki.CA.ClientConfig
// makes one).
func NewTLSClient(t testing.TB, cfg *tls.Config) *Client {
	return newClient(t, cfg)
}

func newClient(t testing.TB, cfg *tls.Config) *Client {
	c := &Client{HTTP: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64, TLSClientConfig: cfg}}}
	t.Cleanup(c.HTTP.CloseIdleConnections)
	return c
}

// EntityURL builds /v0/entity?id=key[&ack=a&from=f] (ack/from 0: omitted).
func EntityURL(base, key string, ack, from int) string {
	u := base + "/v0/entity?id=" + url.QueryEscape(key)
	if ack > 0 {
		u += fmt.Sprintf("&ack=%d", ack)
	}
	if from > 0 {
		u += fmt.Sprintf("&from=%d", from)
	}
	return u
}

// Do sends a request and returns status and body.
func (c *Client) Do(t testing.TB, method, u string, body []byte) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != nil {
		r = strings.NewReader(string(body))
	}
	req, err := http.NewRequest(method, u, r)
	require.NoError(t, err)
	resp, err := c.HTTP.Do(req)
	require.NoError(t, err, "%s %s", method, u)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, b
}

// Put is PUT /v0/entity.
func (c *Client) Put(t testing.TB, base, key string, val []byte, ack, from int) int {
	t.Helper()
	code, _ := c.Do(t, http.MethodPut, EntityURL(base, key, ack, from), val)
	return code
}

// Get is GET /v0/entity.
func (c *Client) Get(t testing.TB, base, key string, ack, from int) (int, []byte) {
	t.Helper()
	return c.Do(t, http.MethodGet, EntityURL(base, key, ack, from), nil)
}

// Delete is DELETE /v0/entity.
func (c *Client) Delete(t testing.TB, base, key string, ack, from int) int {
	t.Helper()
	code, _ := c.Do(t, http.MethodDelete, EntityURL(base, key, ack, from), nil)
	return code
}

// BuildBinary compiles cmd/dhtkv into a temporary directory once per test
// binary and returns its path. root is the repository root.
func BuildBinary(t testing.TB, root string) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "dhtkv-bin-")
		if err != nil {
			buildErr = err
			return
		}
		builtPath = filepath.Join(dir, "dhtkv")
		cmd := exec.Command("go", "build", "-o", builtPath, "./cmd/dhtkv")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	require.NoError(t, buildErr)
	return builtPath
}

var (
	buildOnce sync.Once
	builtPath string
	buildErr  error
)

// LoggedAddr waits for a dhtkv process started with --listen host:0 to log
// the address it picked (log returns the process's output so far), then
// for it to answer there, and returns the address. Letting the node pick
// its port means no other test's node can take it between a look-up and
// the bind (the suite runs packages in parallel).
func LoggedAddr(t testing.TB, log func() string, timeout time.Duration) string {
	t.Helper()
	addr := LoggedListen(t, log, timeout)
	WaitReady(t, "http://"+addr, timeout)
	return addr
}

// LoggedListen is LoggedAddr without the wait for an answer: for a node
// that does not answer plain HTTP (TLS), whose test waits its own way.
func LoggedListen(t testing.TB, log func() string, timeout time.Duration) string {
	t.Helper()
	var addr string
	require.Eventually(t, func() bool {
		m := startedRE.FindStringSubmatch(log())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	}, timeout, 10*time.Millisecond, "the node logs its address once it listens")
	return addr
}

var startedRE = regexp.MustCompile(`msg="dhtkv node started" listen=(\S+)`)

// Status is GET /v0/status on a fresh connection: its status code, or 0 if
// there was no answer (refused, reset, timed out).
func Status(base string) int {
	cl := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := cl.Get(base + "/v0/status")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// WaitReady polls /v0/status until it answers 200 or the timeout passes.
func WaitReady(t testing.TB, base string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		resp, err := http.Get(base + "/v0/status")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(20 * time.Millisecond) // the polling interval
	}
	t.Fatalf("%s not ready after %v", base, timeout)
}

// Metric returns what node i's registry holds under name, summed over the
// series whose labels include every given name/value pair: a counter's or
// gauge's value, a histogram's sample count. A series never touched counts
// 0. The node must be running.
func (c *Cluster) Metric(t testing.TB, i int, name string, labels ...string) float64 {
	t.Helper()
	n := c.Node(i)
	require.NotNil(t, n, "node %d is stopped", i)
	return Metric(t, n.Registry(), name, labels...)
}

// Metric is Cluster.Metric for any registry.
func Metric(t testing.TB, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	require.Zero(t, len(labels)%2, "labels come in name/value pairs")
	families, err := reg.Gather()
	require.NoError(t, err)
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			for j := 0; j < len(labels); j += 2 {
				if !hasLabel(m, labels[j], labels[j+1]) {
					continue series
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Histogram != nil:
				sum += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return sum
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

// Repair asks node i for an anti-entropy exchange with every peer through
// its admin endpoint (POST /repair) and returns what each found and did.
func (c *Cluster) Repair(t testing.TB, i int) []client.Exchange {
	t.Helper()
	n := c.Node(i)
	require.NotNil(t, n, "node %d is stopped", i)
	resp, err := http.Post("http://"+n.AdminAddr()+"/repair", "", nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var out []client.Exchange
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return out
}

// Reconfigure changes node i's configuration for its next start.
func (c *Cluster) Reconfigure(i int, fn func(*node.Config)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fn(&c.cfgs[i])
}

// OnSharedDisk sets cfg for a node that shares the test machine's disk
// with every other test: no ballast (1% of the volume by default), and a
// guard that refuses writes only when the disk is all but full, where the
// default (5% of the volume free) made a node on a machine's fuller disk
// answer 507 to a test's writes.
func OnSharedDisk(cfg *node.Config) {
	cfg.Store.Ballast = sizeflag.Amount{}
	cfg.Store.MinFreeSpace = sizeflag.Amount{Bytes: 16 << 20}
}

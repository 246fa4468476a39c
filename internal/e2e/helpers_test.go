package e2e_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/placement"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// withReplicaTimeout sets every node's replica deadline.
func withReplicaTimeout(d time.Duration) testcluster.Option {
	return func(_ int, c *node.Config) { c.ReplicaTimeout = d }
}

// withSecret sets --cluster-secret on every node.
func withSecret(s string) testcluster.Option {
	return func(_ int, c *node.Config) { c.ClusterSecret = s }
}

// withExtraMembers appends members that are not testcluster nodes (fake or
// absent peers) to every node's --cluster, after the real nodes: with n real
// nodes, the first extra member is node n.
func withExtraMembers(urls ...string) testcluster.Option {
	return func(_ int, c *node.Config) { c.Cluster += "," + strings.Join(urls, ",") }
}

// placementOf computes the cluster's placement the way every node does.
func placementOf(t testing.TB, c *testcluster.Cluster) *placement.Placement {
	t.Helper()
	topo, err := clustermap.ParseTopology(c.Config(0).Cluster, c.URL(0))
	require.NoError(t, err)
	require.GreaterOrEqual(t, topo.Size(), c.Size())
	for i := range c.Size() {
		require.Equal(t, c.URL(i), topo.Nodes[i], "testcluster URL order is the --cluster order")
	}
	m, err := clustermap.Seed(topo.Nodes, 0)
	require.NoError(t, err)
	return placement.New(m.Nodes)
}

// replicasOf returns key's first `from` replicas.
func replicasOf(p *placement.Placement, key string, from int) []int {
	return p.Replicas([]byte(key), from, nil)
}

// findKey returns a key (prefix + counter) whose first len(want) replicas are
// exactly want, in that order.
func findKey(t testing.TB, p *placement.Placement, prefix string, want ...int) string {
	t.Helper()
	for i := range 100_000 {
		k := fmt.Sprintf("%s-%d", prefix, i)
		if slices.Equal(replicasOf(p, k, len(want)), want) {
			return k
		}
	}
	t.Fatalf("no key with replicas %v", want)
	return ""
}

// findKeySet is findKey ignoring the order of the replicas.
func findKeySet(t testing.TB, p *placement.Placement, prefix string, want ...int) string {
	t.Helper()
	sorted := slices.Sorted(slices.Values(want))
	for i := range 100_000 {
		k := fmt.Sprintf("%s-%d", prefix, i)
		if slices.Equal(slices.Sorted(slices.Values(replicasOf(p, k, len(want)))), sorted) {
			return k
		}
	}
	t.Fatalf("no key with replica set %v", want)
	return ""
}

// internalBatch posts a raw batch body to node base and returns the status
// and the answer's body.
func internalBatch(t testing.TB, cl *testcluster.Client, base string, body []byte, secret string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+rpc.BatchPath, bytes.NewReader(body))
	require.NoError(t, err)
	if secret != "" {
		req.Header.Set(rpc.SecretHeader, secret)
	}
	resp, err := cl.HTTP.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, out
}

// internalGet reads key from node base's local replica only, through a
// batch of one read: 200 and the record, 404 if never written there, or
// the batch's own status when it was refused.
func internalGet(t testing.TB, cl *testcluster.Client, base, key, secret string) (int, record.Record) {
	t.Helper()
	code, out := internalBatch(t, cl, base, rpc.AppendBatchOp(nil, rpc.OpRead, []byte(key), nil), secret)
	if code != http.StatusOK {
		return code, record.Record{}
	}
	require.NotEmpty(t, out)
	switch out[0] {
	case rpc.ResNotFound:
		require.Len(t, out, 1)
		return http.StatusNotFound, record.Record{}
	case rpc.ResFound:
		n, w := binary.Uvarint(out[1:])
		require.Positive(t, w)
		require.Equal(t, int(n), len(out)-1-w, "one result, the whole answer")
		rec, err := record.Decode(out[1+w:])
		require.NoError(t, err, "the result is an envelope")
		return http.StatusOK, rec // out is this test's own buffer
	}
	t.Fatalf("unexpected result %q", out)
	return 0, record.Record{}
}

// internalPut writes an explicit envelope into node base's local replica
// through a batch of one write: 201 applied, 409 refused because a newer
// version is there, or the batch's own status when it was refused.
func internalPut(t testing.TB, cl *testcluster.Client, base, key string, rec record.Record, secret string) int {
	t.Helper()
	code, out := internalBatch(t, cl, base, rpc.AppendBatchOp(nil, rpc.OpWrite, []byte(key), rec.Encode()), secret)
	if code != http.StatusOK {
		return code
	}
	require.NotEmpty(t, out)
	switch out[0] {
	case rpc.ResApplied:
		require.Len(t, out, 1)
		return http.StatusCreated
	case rpc.ResNewer:
		require.Len(t, out, 9)
		require.Greater(t, binary.BigEndian.Uint64(out[1:]), rec.Version)
		return http.StatusConflict
	}
	t.Fatalf("unexpected result %q", out)
	return 0
}

// holders returns the running nodes whose local replica has key (live or
// tombstone).
func holders(t testing.TB, c *testcluster.Cluster, cl *testcluster.Client, key, secret string) []int {
	t.Helper()
	var hs []int
	for i := range c.Size() {
		if c.Node(i) == nil {
			continue
		}
		code, _ := internalGet(t, cl, c.URL(i), key, secret)
		require.Contains(t, []int{http.StatusOK, http.StatusNotFound}, code)
		if code == http.StatusOK {
			hs = append(hs, i)
		}
	}
	return hs
}

// waitBlocked waits until at least n goroutines are blocked receiving from
// a channel in function fn (named as in a stack trace, with its package
// path): a way to know that calls have reached a queue that the test
// cannot see.
func waitBlocked(t testing.TB, n int, fn string) {
	t.Helper()
	testcluster.Eventually(t, testcluster.WaitFor, fmt.Sprintf("%d goroutines blocked in %s", n, fn), func() bool {
		buf := make([]byte, 1<<20)
		for {
			if m := runtime.Stack(buf, true); m < len(buf) {
				buf = buf[:m]
				break
			}
			buf = make([]byte, 2*len(buf))
		}
		blocked := 0
		for _, g := range strings.Split(string(buf), "\n\n") {
			header, frames, _ := strings.Cut(g, "\n")
			if strings.Contains(header, "[chan receive") && strings.Contains("\n"+frames, "\n"+fn+"(") {
				blocked++
			}
		}
		return blocked >= n
	})
}

// rawURL builds an entity URL with ack/from given verbatim ("" omits one).
func rawURL(base, key, ack, from string) string {
	u := base + "/v0/entity?id=" + url.QueryEscape(key)
	if ack != "" {
		u += "&ack=" + ack
	}
	if from != "" {
		u += "&from=" + from
	}
	return u
}

// timed runs f and returns how long it took.
func timed(f func()) time.Duration {
	start := time.Now()
	f()
	return time.Since(start)
}

// fakePeer speaks the batch protocol without a store: every write is
// acknowledged and every read answers "never written", once hold (if not
// nil) has returned for the batch; hold can delay or block a batch. It
// records when a client closes its connection.
type fakePeer struct {
	ln     net.Listener
	hold   func(ops []rpc.BatchOp)
	mu     sync.Mutex
	open   int
	served int
	conns  []net.Conn
	wg     sync.WaitGroup
}

// newFakePeer listens on a fresh 127.0.0.1 port.
func newFakePeer(t testing.TB, hold func(ops []rpc.BatchOp)) *fakePeer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := &fakePeer{ln: ln, hold: hold}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			f.open++
			f.conns = append(f.conns, conn)
			f.mu.Unlock()
			f.wg.Add(1)
			go f.serve(conn)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		f.mu.Lock()
		for _, c := range f.conns {
			c.Close()
		}
		f.mu.Unlock()
		f.wg.Wait()
	})
	return f
}

func (f *fakePeer) serve(conn net.Conn) {
	defer f.wg.Done()
	defer func() {
		conn.Close()
		f.mu.Lock()
		f.open--
		f.mu.Unlock()
	}()
	r := bufio.NewReader(conn)
	for {
		req, err := http.ReadRequest(r)
		if err != nil {
			return // the client closed the connection (or the test ended)
		}
		body, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return
		}
		ops, err := rpc.ParseBatch(body, nil)
		if err != nil {
			return
		}
		if f.hold != nil && len(ops) > 0 { // an empty batch is the coordinator's ping
			f.hold(ops)
		}
		var out []byte
		for _, op := range ops { // acknowledge every write, hold nothing
			out = append(out, map[byte]byte{rpc.OpWrite: rpc.ResApplied, rpc.OpRead: rpc.ResNotFound}[op.Kind])
		}
		// Counted before the answer goes out: the client may act on the
		// answer before this goroutine runs again.
		f.mu.Lock()
		f.served += len(ops)
		f.mu.Unlock()
		// Its clock, as a node's answer carries it: the coordinator
		// verifies its own against it before it writes with ack=2.
		if _, err := fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\n%s: %d\r\nContent-Length: %d\r\n\r\n%s",
			rpc.TimeHeader, time.Now().UnixMicro(), len(out), out); err != nil {
			return
		}
	}
}

func (f *fakePeer) URL() string { return "http://" + f.ln.Addr().String() }

func (f *fakePeer) state() (open, served int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.open, f.served
}

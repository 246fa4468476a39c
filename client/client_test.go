package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func urls(c *testcluster.Cluster) []string {
	var us []string
	for i := range c.Size() {
		us = append(us, c.URL(i))
	}
	return us
}

func TestNewValidatesEndpoints(t *testing.T) {
	for _, tc := range []struct {
		endpoints []string
		want      string // normalized first endpoint, or the error
	}{
		{[]string{"127.0.0.1:8080"}, "http://127.0.0.1:8080"},
		{[]string{"http://127.0.0.1:8080/"}, "http://127.0.0.1:8080"},
		{[]string{" https://db.example:443 "}, "https://db.example:443"},
		{nil, "no endpoints"},
		{[]string{"ftp://127.0.0.1:21"}, "want http://host:port"},
		{[]string{"http://127.0.0.1:8080/v0"}, "want http://host:port"},
		{[]string{"http://127.0.0.1:8080?x=1"}, "want http://host:port"},
		{[]string{"http://"}, "want http://host:port"},
	} {
		c, err := client.New(client.Config{Endpoints: tc.endpoints})
		if err != nil {
			assert.ErrorContains(t, err, tc.want, "%q", tc.endpoints)
			continue
		}
		assert.Equal(t, tc.want, c.Endpoints()[0], "%q", tc.endpoints)
	}
}

// Get, Put and Delete through every node of a real cluster, with keys and
// values of arbitrary bytes, and the answers a program acts on as typed
// errors.
func TestClientCalls(t *testing.T) {
	c := testcluster.Start(t, 3, func(_ int, cfg *node.Config) {
		cfg.MaxKeyBytes = 64
		cfg.MaxValueBytes = 1000
	})
	ctx := ctxFor(t)
	binary := string([]byte{0, '\n', ' ', '+', '%', '&', '=', 0xff, 0xfe, '?', '#'})
	for i := range 3 {
		cl := testcluster.NewAPIClient(t, c.URL(i))
		for _, kv := range [][2]string{{"plain", "v"}, {binary, binary}, {"empty value", ""}, {"multi\nline", "a\r\nb\n"}} {
			key, value := fmt.Sprintf("n%d/%s", i, kv[0]), []byte(kv[1])
			require.NoError(t, cl.Put(ctx, key, value, client.WithAck(3), client.WithFrom(3)), "%q", key)
			got, err := testcluster.NewAPIClient(t, c.URL((i+1)%3)).Get(ctx, key, client.WithAck(3))
			require.NoError(t, err, "%q", key)
			require.True(t, bytes.Equal(value, got), "%q: got %q", key, got)
			require.NoError(t, cl.Delete(ctx, key))
			_, err = cl.Get(ctx, key)
			require.ErrorIs(t, err, client.ErrNotFound, "%q", key)
		}
	}
	cl := testcluster.NewAPIClient(t, urls(c)...)
	require.NoError(t, cl.Delete(ctx, "never written"), "deleting an absent key succeeds")
	for _, tc := range []struct {
		name   string
		call   func() error
		code   int
		reason string
	}{
		{"empty key", func() error { _, err := cl.Get(ctx, ""); return err }, 400, "empty id"},
		{"key too long", func() error { return cl.Put(ctx, strings.Repeat("k", 65), nil) }, 400, "id is 65 bytes, limit is 64"},
		{"ack above from", func() error { return cl.Delete(ctx, "k", client.WithAck(3), client.WithFrom(2)) }, 400, "ack=3 exceeds from=2"},
		{"from above the cluster", func() error { _, err := cl.Get(ctx, "k", client.WithFrom(4)); return err }, 400, "from=4 exceeds the cluster's replication factor 3"},
		{"value too large", func() error { return cl.Put(ctx, "k", make([]byte, 1001)) }, 413, "value too large"},
	} {
		err := tc.call()
		var bad *client.BadRequestError
		require.ErrorAs(t, err, &bad, tc.name)
		assert.Equal(t, tc.code, bad.StatusCode, tc.name)
		assert.Contains(t, bad.Reason, tc.reason, tc.name)
		assert.NotErrorIs(t, err, client.ErrUnavailable, tc.name)
	}
}

// With one node down, a call through it goes on to the next endpoint, and
// the next call starts there; with every endpoint down the call fails with
// each endpoint's reason. A 504 is not retried elsewhere: the replicas are
// the same whichever node coordinates.
func TestClientFailover(t *testing.T) {
	c := testcluster.Start(t, 3)
	ctx := ctxFor(t)
	cl := testcluster.NewAPIClient(t, c.URL(0), c.URL(1), c.URL(2))
	require.NoError(t, cl.Put(ctx, "k", []byte("v1")))
	c.StopNode(0)

	before := c.Metric(t, 1, "dhtkv_requests_total", "op", "put")
	require.NoError(t, cl.Put(ctx, "k", []byte("v2")), "node 0 is down: node 1 serves")
	require.Equal(t, before+1, c.Metric(t, 1, "dhtkv_requests_total", "op", "put"))
	v, err := cl.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, "v2", string(v))
	require.Equal(t, 1.0, c.Metric(t, 1, "dhtkv_requests_total", "op", "get"), "the next call starts at the endpoint that served")

	// ack=3 with a replica down: 504 from node 1, and node 2 is not asked.
	gets2 := c.Metric(t, 2, "dhtkv_requests_total", "op", "get")
	_, err = cl.Get(ctx, "k", client.WithAck(3))
	require.ErrorIs(t, err, client.ErrNotEnoughReplicas)
	require.Regexp(t, `^dhtkv: not enough replicas: \d of 3 answered, 3 needed`, err.Error(), "the node's reason is kept, once")
	require.Equal(t, gets2, c.Metric(t, 2, "dhtkv_requests_total", "op", "get"), "a 504 does not fail over")
	require.ErrorIs(t, cl.Put(ctx, "k", []byte("v3"), client.WithAck(3)), client.ErrNotEnoughReplicas)

	// Failover before a scan's stream begins.
	var keys []string
	for rec, err := range testcluster.NewAPIClient(t, "http://"+testcluster.DeadEndpoint(t), c.URL(2)).Scan(ctx, "", "") {
		require.NoError(t, err)
		keys = append(keys, string(rec.Key))
	}
	require.Equal(t, []string{"k"}, keys)

	dead := testcluster.NewAPIClient(t, "http://"+testcluster.DeadEndpoint(t), c.URL(0))
	_, err = dead.Get(ctx, "k")
	require.ErrorIs(t, err, client.ErrUnavailable)
	assert.Contains(t, err.Error(), "connection refused")
	assert.Contains(t, err.Error(), c.URL(0)+": ")
	assert.Equal(t, 1, strings.Count(err.Error(), "\n")+1, "one line: %q", err)
}

// A node whose clock is off refuses to coordinate writes with 503: the
// client writes through the next endpoint.
func TestClientFailsOverOn503(t *testing.T) {
	c := testcluster.Start(t, 3, func(i int, cfg *node.Config) {
		if i == 0 {
			cfg.ClockOffset = 30 * time.Second
		}
	})
	ctx := ctxFor(t)
	require.Eventually(t, func() bool {
		st, err := testcluster.NewAPIClient(t, c.URL(0)).Status(ctx, c.URL(0))
		return err == nil && strings.Contains(strings.Join(st.Warnings, "\n"), "clock")
	}, 10*time.Second, 20*time.Millisecond, "node 0 notices its clock is off")
	require.Error(t, testcluster.NewAPIClient(t, c.URL(0)).Put(ctx, "k", []byte("v")), "node 0 alone refuses")
	cl := testcluster.NewAPIClient(t, c.URL(0), c.URL(1))
	require.NoError(t, cl.Put(ctx, "k", []byte("v")))
	v, err := cl.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, "v", string(v))
}

// A node at its --max-scans answers a range request 429 ("try again
// later"): that is the node's load, not the request's fault, so the
// scan goes on to the next endpoint (it was a *BadRequestError, and the
// caller never reached the idle node).
func TestClientScanFailsOverOn429(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "filled")
	testcluster.FillStore(t, dir, 4096, 2048) // 8 MiB: a stream outlasts the sockets' buffers
	busy := testcluster.Start(t, 1, func(_ int, cfg *node.Config) {
		cfg.DataDir = dir
		cfg.MaxScans = 1
	})
	held := testcluster.RawGet(t, busy.Config(0).Listen, "/v0/entities?start=key&format=binary", 4096)
	require.Equal(t, http.StatusOK, held.Status, "the busy node's one stream, not read")
	_, idle := testcluster.Single(t)
	ctx := ctxFor(t)
	require.NoError(t, testcluster.NewAPIClient(t, idle).Put(ctx, "k", []byte("v")))

	var keys []string
	for rec, err := range testcluster.NewAPIClient(t, busy.Endpoint(0), idle).Scan(ctx, "", "", client.WithLocal()) {
		require.NoError(t, err)
		keys = append(keys, string(rec.Key))
	}
	require.Equal(t, []string{"k"}, keys, "served by the idle node")

	var last error
	for _, err := range testcluster.NewAPIClient(t, busy.Endpoint(0)).Scan(ctx, "", "", client.WithLocal()) {
		last = err
	}
	require.ErrorIs(t, last, client.ErrUnavailable, "every endpoint busy")
	require.ErrorContains(t, last, "too many range scans in flight")
}

// A call ends with its context, and says so.
func TestClientContext(t *testing.T) {
	// A listener that accepts and never answers: the call waits for the
	// context, not for another endpoint.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- conn
		}
	}()
	defer func() {
		l.Close()
		for conn := range accepted {
			conn.Close()
		}
	}()
	cl := testcluster.NewAPIClient(t, l.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = cl.Get(ctx, "k")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 5*time.Second)

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, cl.Put(cancelled, "k", nil), context.Canceled)
}

// Scan merges the cluster's records in key order, over any range, with
// keys and values of any bytes; stops at its limit or when the loop
// breaks; reads one node with WithLocal; and yields ErrNotEnoughReplicas,
// before any record, when too many nodes are down for its ack.
func TestClientScan(t *testing.T) {
	c := testcluster.Start(t, 3)
	ctx := ctxFor(t)
	cl := testcluster.NewAPIClient(t, urls(c)...)
	want := map[string]string{}
	for i := range 200 {
		k := fmt.Sprintf("key%03d", i)
		if i%10 == 0 {
			k += "\x00\n\xff"
		}
		want[k] = strings.Repeat(fmt.Sprint(i), i%7)
		require.NoError(t, cl.Put(ctx, k, []byte(want[k])))
	}
	require.NoError(t, cl.Delete(ctx, "key005"))
	delete(want, "key005")
	sorted := make([]string, 0, len(want))
	for k := range want {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)

	scan := func(cl *client.Client, start, end string, opts ...client.Option) ([]string, error) {
		var keys []string
		for rec, err := range cl.Scan(ctx, start, end, opts...) {
			if err != nil {
				return keys, err
			}
			assert.Equal(t, want[string(rec.Key)], string(rec.Value), "%q", rec.Key)
			keys = append(keys, string(rec.Key))
		}
		return keys, nil
	}

	// The node applies WithLimit: it streams that many records and ends
	// the stream complete, rather than the client closing it early (the
	// node would then have counted a whole batch, all 199 records, and an
	// aborted stream).
	got, err := scan(testcluster.NewAPIClient(t, c.URL(1)), "", "", client.WithLocal(), client.WithLimit(3))
	require.NoError(t, err)
	require.Equal(t, sorted[:3], got)
	records := func() float64 { return testcluster.Metric(t, c.Node(1).Registry(), "dhtkv_scan_records_total") }
	require.Eventually(t, func() bool { return records() == 3 }, 5*time.Second, 10*time.Millisecond, "records streamed: %v", records())
	assert.Zero(t, testcluster.Metric(t, c.Node(1).Registry(), "dhtkv_scan_aborts_total"))
	between := func(start, end string) []string {
		var ks []string
		for _, k := range sorted {
			if k >= start && (end == "" || k < end) {
				ks = append(ks, k)
			}
		}
		return ks
	}
	for _, tc := range []struct {
		name, start, end string
		opts             []client.Option
		want             []string
	}{
		{"everything", "", "", nil, sorted},
		{"a range", "key010", "key020", nil, between("key010", "key020")},
		{"from a key", "key190", "", nil, between("key190", "")},
		{"empty range", "key100", "key100", nil, nil},
		{"limit", "key050", "", []client.Option{client.WithLimit(3)}, between("key050", "")[:3]},
		{"limit beyond the range", "key195", "", []client.Option{client.WithLimit(50)}, between("key195", "")},
		{"one node", "", "", []client.Option{client.WithLocal()}, sorted},
		{"ack=3", "key000", "key010", []client.Option{client.WithAck(3)}, between("key000", "key010")},
	} {
		got, err := scan(cl, tc.start, tc.end, tc.opts...)
		require.NoError(t, err, tc.name)
		assert.Equal(t, tc.want, got, tc.name)
	}

	n := 0
	for _, err := range cl.Scan(ctx, "", "") {
		require.NoError(t, err)
		if n++; n == 5 {
			break // closes the stream
		}
	}

	_, err = scan(cl, "", "", client.WithLocal(), client.WithAck(1))
	var bad *client.BadRequestError
	require.ErrorAs(t, err, &bad)
	assert.Contains(t, bad.Reason, "scope=cluster")
	_, err = scan(cl, "", "", client.WithLimit(1_000_000_001))
	require.ErrorAs(t, err, &bad)
	assert.Contains(t, bad.Reason, "limit")

	c.StopNode(2)
	got, err = scan(cl, "", "")
	require.NoError(t, err, "the default ack (2 of 3) holds with one node down")
	assert.Equal(t, sorted, got)
	got, err = scan(cl, "", "", client.WithAck(3))
	require.ErrorIs(t, err, client.ErrNotEnoughReplicas)
	assert.Empty(t, got)
	assert.False(t, errors.Is(err, client.ErrUnavailable))
}

// A 504 keeps the node's reason once: a node answers the bare "not
// enough replicas" when the failure carries no replica account
// (httpapi.replicaStatus), and the client must not say it twice.
func TestGatewayTimeoutReasonNotRepeated(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"not enough replicas\n", "dhtkv: not enough replicas"},
		{"not enough replicas: 1 of 3 answered, 2 needed\n", "dhtkv: not enough replicas: 1 of 3 answered, 2 needed"},
		{"clock not verified: too few peers answered\n", "dhtkv: not enough replicas: clock not verified: too few peers answered"},
		{"", "dhtkv: not enough replicas"},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusGatewayTimeout)
			_, _ = w.Write([]byte(tc.body))
		}))
		cl, err := client.New(client.Config{Endpoints: []string{srv.URL}})
		require.NoError(t, err)
		_, err = cl.Get(ctxFor(t), "k")
		require.ErrorIs(t, err, client.ErrNotEnoughReplicas)
		assert.Equal(t, tc.want, err.Error(), "body %q", tc.body)
		cl.Close()
		srv.Close()
	}
}

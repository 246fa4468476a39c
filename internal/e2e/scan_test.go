package e2e_test

// Cluster-wide range scans (scope=cluster) on 3-node clusters: the merge
// of the replicas' streams, and a replica failing mid-stream. The
// node-local scan tests stay in internal/httpapi.

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/scan"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// clusterScan reads scope=cluster through node i in the three framings and
// checks that they agree; it returns the records, or the status if not 200.
func clusterScan(t *testing.T, c *testcluster.Cluster, i int, query string) (int, [][2]string) {
	t.Helper()
	resp := testcluster.HTTPGet(t, c.URL(i)+"/v0/entities?scope=cluster&format=binary&"+query)
	if resp.StatusCode != 200 {
		return resp.StatusCode, nil
	}
	bin := testcluster.ReadBinary(t, resp.Body)
	rc := testcluster.RawGet(t, c.Config(i).Listen, "/v0/entities?scope=cluster&"+query, 0)
	require.Equal(t, 200, rc.Status)
	chunks := testcluster.ReadChunks(t, rc.ChunkedReader)
	require.Equal(t, bin, chunks, "binary and chunks framings disagree")
	resp = testcluster.HTTPGet(t, c.URL(i)+"/v0/entities?scope=cluster&format=json&"+query)
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, bin, testcluster.ReadJSON(t, resp.Body), "binary and json framings disagree")
	return 200, bin
}

// TestScanClusterMerge writes through different nodes with different
// ack/from, overwrites and deletes, and lets one node miss writes entirely
// (stopped meanwhile), so the nodes' stores disagree; the merged range must
// still be exactly the newest live value of every key.
func TestScanClusterMerge(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 3, withSecret("s"))
	cl := testcluster.NewClient(t)
	want := map[string]string{}
	put := func(node int, k, v string, ack, from int) {
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(node), k, []byte(v), ack, from), "put %q", k)
		want[k] = v
	}
	del := func(node int, k string, ack, from int) {
		require.Equal(t, http.StatusAccepted, cl.Delete(t, c.URL(node), k, ack, from), "delete %q", k)
		delete(want, k)
	}
	// Binary bytes in keys, except '\n', which the chunks framing cannot
	// carry in a key (TestEntitiesBinaryFramingIsUnambiguous covers it).
	key := func(i int) string {
		b := byte(i)
		if b == '\n' {
			b = 'N'
		}
		return fmt.Sprintf("k%04d\x00%c", i, b)
	}
	for i := range 300 {
		put(i%3, key(i), fmt.Sprintf("v%d\nfirst", i), 0, 0)
	}
	for i := 0; i < 300; i += 3 { // overwrites acknowledged by one of two replicas
		put((i+1)%3, key(i), fmt.Sprintf("v%d\nsecond", i), 1, 2)
	}
	for i := 1; i < 300; i += 7 {
		del((i+2)%3, key(i), 1, 3)
	}
	// Node 2 misses a round of overwrites, deletes and new keys: its store
	// keeps the old versions, which the merge must not return.
	c.StopNode(2)
	for i := 0; i < 300; i += 5 {
		put(i%2, key(i), fmt.Sprintf("v%d\nthird", i), 0, 0)
	}
	for i := 2; i < 300; i += 11 {
		del(1, key(i), 0, 0)
	}
	for i := 300; i < 330; i++ {
		put(0, key(i), "new", 0, 0)
	}
	c.StartNode(2)
	// Node 2 answers a local scan with stale data...
	resp := testcluster.HTTPGet(t, c.URL(2)+"/v0/entities?start=k&format=binary")
	local := testcluster.ReadBinary(t, resp.Body)
	require.NotEqual(t, testcluster.ScanOf(want, "k", ""), local)

	// ...while a cluster scan through any node is exact.
	for i := range 3 {
		code, got := clusterScan(t, c, i, "start=k")
		require.Equal(t, 200, code)
		require.Equal(t, testcluster.ScanOf(want, "k", ""), got, "via node %d", i)
	}
	start, end := key(50), key(250)
	code, got := clusterScan(t, c, 2, "start="+url.QueryEscape(start)+"&end="+url.QueryEscape(end))
	require.Equal(t, 200, code)
	require.Equal(t, testcluster.ScanOf(want, start, end), got)
	code, got = clusterScan(t, c, 1, "start=zzz")
	require.Equal(t, 200, code)
	require.Empty(t, got)

	// From the first key, and limits, which count the merged live records: the
	// keys deleted on some nodes only, or overwritten on node 0 and 1 while
	// node 2 was down, are merged before they are counted.
	all := testcluster.ScanOf(want, "", "")
	code, got = clusterScan(t, c, 2, "start=%00")
	require.Equal(t, 200, code)
	require.Equal(t, all, got, "start=%00: from the first key")
	for _, tc := range []struct {
		query string
		want  [][2]string
	}{
		{"start=%00&limit=1", all[:1]},
		{"start=%00&limit=40", all[:40]},
		{"start=" + url.QueryEscape(start) + "&limit=25", testcluster.ScanOf(want, start, "")[:25]},
		{"start=%00&end=" + url.QueryEscape(key(30)) + "&limit=1000", testcluster.ScanOf(want, "", key(30))},
		{"start=" + url.QueryEscape(key(1)) + "&end=" + url.QueryEscape(key(5)) + "&limit=1", testcluster.ScanOf(want, key(3), key(4))}, // key(1) and key(2) are deleted
		{"start=%00&limit=2&from=2&ack=2", all[:2]},
	} {
		for i := range 3 {
			code, got := clusterScan(t, c, i, tc.query)
			require.Equal(t, 200, code, tc.query)
			require.Equal(t, tc.want, got, "%s via node %d", tc.query, i)
		}
	}

	t.Run("node stopped before the call", func(t *testing.T) {
		c.StopNode(1)
		defer c.StartNode(1)
		// Default from=3 ack=2 tolerates one node down: still complete.
		for _, i := range []int{0, 2} {
			code, got := clusterScan(t, c, i, "start=k")
			require.Equal(t, 200, code)
			require.Equal(t, testcluster.ScanOf(want, "k", ""), got, "via node %d", i)
		}
		code, got := clusterScan(t, c, 0, "start=k&from=2&ack=1")
		require.Equal(t, 200, code)
		require.Equal(t, testcluster.ScanOf(want, "k", ""), got)
		// ack=3, or from=2&ack=2, cannot be met with a node down: 504
		// before any record is sent.
		for _, q := range []string{"start=k&ack=3", "start=k&from=2&ack=2", "start=k&from=1"} {
			code, _ := clusterScan(t, c, 0, q)
			require.Equal(t, http.StatusGatewayTimeout, code, q)
		}
	})
}

// TestScanClusterNodeFailsMidStream stops a node while the coordinator is
// merging its stream: the response must end in an error the client sees,
// in both framings, never as a complete (shorter) result.
func TestScanClusterNodeFailsMidStream(t *testing.T) {
	const n, valueSize = 6000, 4096 // 24 MiB per node, more than the socket buffers hold
	dirs := make([]string, 3)
	for i := range dirs {
		dirs[i] = filepath.Join(t.TempDir(), fmt.Sprintf("node%d", i))
		testcluster.FillStore(t, dirs[i], n, valueSize)
	}
	c := testcluster.Start(t, 3, func(i int, cfg *node.Config) { cfg.DataDir = dirs[i] })
	coordAborts := func() float64 { return c.Metric(t, 0, "dhtkv_scan_aborts_total", "reason", scan.AbortSourceError) }

	t.Run("binary", func(t *testing.T) {
		resp := testcluster.HTTPGet(t, c.URL(0)+"/v0/entities?scope=cluster&format=binary&start=key")
		require.Equal(t, 200, resp.StatusCode)
		d := scan.NewDecoder(resp.Body, 1024, 1<<20)
		for range 10 {
			require.True(t, d.Next())
		}
		c.StopNode(1)
		for d.Next() {
		}
		require.Less(t, d.Count(), uint64(n))
		require.ErrorIs(t, d.Err(), scan.ErrTruncated)
		require.ErrorIs(t, d.Err(), io.ErrUnexpectedEOF, "net/http sees the chunked body cut short")
		require.Equal(t, float64(1), coordAborts())
	})
	c.StartNode(1)
	t.Run("chunks", func(t *testing.T) {
		rc := testcluster.RawGet(t, c.Config(0).Listen, "/v0/entities?scope=cluster&start=key", 0)
		require.Equal(t, 200, rc.Status)
		for range 10 {
			_, err := rc.Chunk()
			require.NoError(t, err)
		}
		c.StopNode(2)
		records := 10
		var err error
		for {
			if _, err = rc.Chunk(); err != nil {
				break
			}
			records++
		}
		require.Less(t, records, n)
		require.ErrorIs(t, err, io.ErrUnexpectedEOF, "no terminating chunk: the connection was cut, %d records", records)
		// And through net/http, the error a plain client gets:
		c.StartNode(2)
		resp := testcluster.HTTPGet(t, c.URL(0)+"/v0/entities?scope=cluster&start=key")
		buf := make([]byte, 64<<10)
		_, err = io.ReadFull(resp.Body, buf)
		require.NoError(t, err)
		c.StopNode(2)
		_, err = io.Copy(io.Discard, resp.Body)
		require.ErrorIs(t, err, io.ErrUnexpectedEOF)
		require.Equal(t, float64(3), coordAborts())
	})
}

package httpapi_test

import (
	"bytes"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/scan"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// A range stream whose client stops reading releases its store iterator
// (httpapi.DefaultScanReleaseAfter), and resumes from a new one when the
// client reads again.

// iterators is node i's count of store iterators holding a snapshot.
func iterators(t *testing.T, c *testcluster.Cluster, i int) float64 {
	return c.Metric(t, i, "dhtkv_store_range_iterators")
}

// TestScanStallReleasesIterator: a client reads the head of a range and
// stops. While its connection stays open the node's open iterators go
// back to 0; meanwhile a key behind the stream's position and one ahead
// of it are rewritten. When the client reads again it gets every key of
// the range once and in order, the one ahead at its new value, the
// stream complete (end marker and count).
func TestScanStallReleasesIterator(t *testing.T) {
	c := startFilled(t, 0)
	base := testcluster.NewBase(flowValueSize)
	require.Zero(t, iterators(t, c, 0))

	rc := testcluster.RawGet(t, c.Config(0).Listen, "/v0/entities?start=key&format=binary", 4096)
	require.Equal(t, 200, rc.Status)
	d := scan.NewDecoder(rc.ChunkedReader, 1024, 1<<20)
	var want []byte
	for range 10 {
		require.True(t, d.Next(), "err %v", d.Err())
		want = testcluster.GenValue(want, base, int(d.Count()-1))
		require.Equal(t, testcluster.GenKey(int(d.Count()-1)), d.Key())
		require.Equal(t, want, d.Value())
	}
	// The client stalls: the stream fills the socket buffers, its write
	// blocks, and after the threshold it lets the iterator go.
	require.Eventually(t, func() bool {
		return iterators(t, c, 0) == 0 && c.Metric(t, 0, "dhtkv_scan_iterator_releases_total") >= 1
	}, 10*time.Second, 10*time.Millisecond, "the stalled stream still holds its iterator")
	require.Zero(t, c.Metric(t, 0, "dhtkv_scan_aborts_total", "reason", scan.AbortClientTimeout), "the stream is still open")
	sent := c.Metric(t, 0, "dhtkv_scan_records_total")
	t.Logf("released after %v of %d records sent", sent, flowRecords)
	require.Less(t, sent, float64(flowRecords-1), "the stream stalled before its end")

	// Rewrite one key behind the position and one far ahead of it.
	const ahead = flowRecords - 2
	cl := testcluster.NewClient(t)
	require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), string(testcluster.GenKey(0)), []byte("behind"), 1, 1))
	require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), string(testcluster.GenKey(ahead)), []byte("ahead, newer"), 1, 1))

	// Resume: every key once, in order; the one ahead at its new value.
	for d.Next() {
		i := int(d.Count() - 1)
		require.Equal(t, string(testcluster.GenKey(i)), string(d.Key()), "record %d", i)
		if i == ahead {
			require.Equal(t, "ahead, newer", string(d.Value()))
			continue
		}
		want = testcluster.GenValue(want, base, i)
		require.True(t, bytes.Equal(want, d.Value()), "record %d", i)
	}
	require.NoError(t, d.Err(), "a complete stream: end marker and count")
	require.Equal(t, uint64(flowRecords), d.Count())
	require.Eventually(t, func() bool { return iterators(t, c, 0) == 0 }, 10*time.Second, 10*time.Millisecond)
}

// TestClusterScanStallReleasesIterators: the same for a cluster scan.
// The coordinator's own store iterator is one source of its merge; the
// other nodes' streams stall because the coordinator reads them only as
// fast as its client reads it, so they release theirs too.
func TestClusterScanStallReleasesIterators(t *testing.T) {
	const nodes, records = 3, 8192
	dirs := make([]string, nodes)
	for i := range dirs {
		dirs[i] = filepath.Join(t.TempDir(), fmt.Sprintf("node%d", i))
		testcluster.FillStore(t, dirs[i], records, flowValueSize)
	}
	c := testcluster.Start(t, nodes, func(i int, cfg *node.Config) { cfg.DataDir = dirs[i] })
	rc := testcluster.RawGet(t, c.Config(0).Listen, "/v0/entities?start=key&format=binary&scope=cluster", 4096)
	require.Equal(t, 200, rc.Status)
	d := scan.NewDecoder(rc.ChunkedReader, 1024, 1<<20)
	require.True(t, d.Next(), "err %v", d.Err())
	require.Eventually(t, func() bool {
		for i := range nodes {
			if iterators(t, c, i) != 0 {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "a node's stream still holds its iterator")
	for i := range nodes {
		require.GreaterOrEqual(t, c.Metric(t, i, "dhtkv_scan_iterator_releases_total"), 1.0, "node %d", i)
	}
	t.Logf("released on every node")
	base := testcluster.NewBase(flowValueSize)
	var want []byte
	start := time.Now()
	for d.Next() {
		i := int(d.Count() - 1)
		require.Equal(t, string(testcluster.GenKey(i)), string(d.Key()), "record %d", i)
		want = testcluster.GenValue(want, base, i)
		require.True(t, bytes.Equal(want, d.Value()), "record %d", i)
	}
	t.Logf("read the rest in %v", time.Since(start))
	require.NoError(t, d.Err())
	require.Equal(t, uint64(records), d.Count())
}

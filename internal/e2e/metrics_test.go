package e2e_test

import (
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// TestMetricsAfterClusterTraffic scrapes a coordinator's /metrics (admin
// listener) after replicated traffic and checks that the per-peer fan-out
// instruments moved, and that a stopped peer shows up as failures.
func TestMetricsAfterClusterTraffic(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 3, func(_ int, cfg *node.Config) { cfg.AdminListen = "127.0.0.1:0" })
	cl := testcluster.NewClient(t)
	for i := range 20 {
		k := fmt.Sprintf("m%d", i)
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), k, []byte("v"), 3, 3))
		code, _ := cl.Get(t, c.URL(0), k, 3, 3)
		require.Equal(t, http.StatusOK, code)
	}
	c.StopNode(2)
	require.Equal(t, http.StatusGatewayTimeout, cl.Put(t, c.URL(0), "down", []byte("v"), 3, 3))

	code, body := cl.Do(t, http.MethodGet, "http://"+c.Node(0).AdminAddr()+"/metrics", nil)
	require.Equal(t, http.StatusOK, code)
	m := string(body)
	value := func(pattern string) float64 {
		t.Helper()
		match := regexp.MustCompile(`(?m)^` + pattern + ` ([0-9.e+]+)$`).FindStringSubmatch(m)
		require.NotNil(t, match, "no sample %s in /metrics", pattern)
		v, err := strconv.ParseFloat(match[1], 64)
		require.NoError(t, err)
		return v
	}
	for _, peer := range []string{c.URL(1), c.URL(2)} {
		q := regexp.QuoteMeta(peer)
		require.GreaterOrEqual(t, value(`dhtkv_replica_request_duration_seconds_count\{op="put",peer="`+q+`"\}`), 20.0, peer)
		require.GreaterOrEqual(t, value(`dhtkv_replica_request_duration_seconds_count\{op="get",peer="`+q+`"\}`), 20.0, peer)
	}
	q2 := regexp.QuoteMeta(c.URL(2))
	require.GreaterOrEqual(t, value(`dhtkv_replica_failures_total\{op="put",peer="`+q2+`",reason="error"\}`), 1.0)
	require.Equal(t, 20.0, value(`dhtkv_requests_total\{code="201",op="put"\}`))
	require.Equal(t, 1.0, value(`dhtkv_requests_total\{code="504",op="put"\}`))
	require.Equal(t, 20.0, value(`dhtkv_requests_total\{code="200",op="get"\}`))
	require.Greater(t, value(`dhtkv_pebble_wal_bytes_written_total`), 0.0)
	require.Greater(t, value(`go_goroutines`), 0.0)
}

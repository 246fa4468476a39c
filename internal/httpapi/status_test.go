package httpapi_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/buildinfo"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// verboseStatus reads GET /v0/status?verbose from base.
func verboseStatus(t *testing.T, base string) (client.Status, []byte) {
	t.Helper()
	st, raw, err := fetchStatus(base)
	require.NoError(t, err)
	return st, raw
}

func fetchStatus(base string) (client.Status, []byte, error) {
	var st client.Status
	resp, err := http.Get(base + "/v0/status?verbose")
	if err != nil {
		return st, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return st, nil, err
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		return st, raw, fmt.Errorf("%s, %s: %s", resp.Status, resp.Header.Get("Content-Type"), raw)
	}
	return st, raw, json.Unmarshal(raw, &st)
}

// Plain /v0/status stays the contract's OK; ?verbose is the node's
// account of itself as JSON.
func TestStatusVerboseSingleNode(t *testing.T) {
	before := time.Now()
	_, base := testcluster.Single(t)
	cl := testcluster.NewClient(t)
	code, body := cl.Do(t, http.MethodGet, base+"/v0/status", nil)
	require.Equal(t, 200, code)
	require.Equal(t, "OK\n", string(body))

	st, raw := verboseStatus(t, base)
	assert.Equal(t, base, st.Node)
	assert.Equal(t, buildinfo.Version(), st.Version)
	assert.Equal(t, buildinfo.GoVersion(), st.GoVersion)
	assert.False(t, st.Started.Before(before.Truncate(time.Second)), "started %v, test began %v", st.Started, before)
	assert.GreaterOrEqual(t, st.UptimeSeconds, 0.0)
	assert.LessOrEqual(t, st.UptimeSeconds, time.Since(before).Seconds())
	assert.False(t, st.Rebuilding)
	assert.Contains(t, string(raw), `"warnings":[]`, "no warnings is an empty list, not null")
	yes := true
	assert.Equal(t, []client.Member{{URL: base, Self: true, Reachable: &yes}}, st.Members)

	for _, q := range []string{"?verbose=1", "?verbose=true", "?verbose="} {
		code, body := cl.Do(t, http.MethodGet, base+"/v0/status"+q, nil)
		require.Equal(t, 200, code, q)
		require.True(t, json.Valid(body), "%s: %s", q, body)
	}
}

// In a cluster, a node lists every member in --cluster order and marks
// itself; it reports the cluster formed once it has seen every member.
func TestStatusVerboseCluster(t *testing.T) {
	c := testcluster.Start(t, 3)
	require.Eventually(t, func() bool {
		st, _, err := fetchStatus(c.URL(1))
		return err == nil && st.ClusterFormed
	}, 10*time.Second, 50*time.Millisecond, "node 1 never saw every member answer")
	st, _ := verboseStatus(t, c.URL(1))
	assert.Equal(t, c.URL(1), st.Node)
	require.Len(t, st.Members, 3)
	for i, m := range st.Members {
		assert.Equal(t, c.URL(i), m.URL)
		assert.Equal(t, i == 1, m.Self)
		require.NotNil(t, m.Reachable)
		assert.True(t, *m.Reachable)
		if i != 1 {
			assert.NotNil(t, m.LastSuccess, "a peer that answered")
			require.NotNil(t, m.AntiEntropy, "anti-entropy's state with a peer")
			assert.Nil(t, m.AntiEntropy.LastComplete, "no exchange yet")
		}
	}

	// A peer stopped: node 1 says so, with the probe's error, and an
	// exchange with it fails and says why.
	c.StopNode(2)
	require.Eventually(t, func() bool {
		st, _, err := fetchStatus(c.URL(1))
		return err == nil && st.Members[2].Reachable != nil && !*st.Members[2].Reachable
	}, 10*time.Second, 50*time.Millisecond, "node 1 never saw node 2 go")
	c.Repair(t, 1)
	st, _ = verboseStatus(t, c.URL(1))
	assert.NotEmpty(t, st.Members[2].LastError)
	assert.NotNil(t, st.Members[2].LastErrorAt)
	assert.NotEmpty(t, st.Members[2].AntiEntropy.LastError)
	require.NotNil(t, st.Members[0].AntiEntropy.LastComplete, "the exchange with node 0 completed")
	assert.Equal(t, 1.0, st.Members[0].AntiEntropy.Progress)
}

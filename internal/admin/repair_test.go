package admin_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/leakcheck"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// POST /repair's exchanges and GET /repair's last exchange are written
// alike: the same fields, the duration in seconds (duration_seconds) in
// both, never duration_ns.
func TestRepairAnswersAgree(t *testing.T) {
	leakcheck.Register(t)
	c := testcluster.Start(t, 2)
	admin := "http://" + c.Node(0).AdminAddr() + "/repair"
	answer := func(method string) []map[string]any {
		req, err := http.NewRequestWithContext(t.Context(), method, admin, nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, method)
		var out []map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out), method)
		require.Len(t, out, 1, "%s: one peer", method)
		return out
	}
	posted := answer(http.MethodPost)[0]
	state := answer(http.MethodGet)[0]
	last, ok := state["last"].(map[string]any)
	require.True(t, ok, "GET /repair has the last exchange: %v", state)
	for _, tc := range []struct {
		name string
		x    map[string]any
	}{
		{"POST /repair", posted},
		{"GET /repair's last", last},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.NotContains(t, tc.x, "duration_ns")
			d, ok := tc.x["duration_seconds"].(float64)
			assert.True(t, ok, "duration_seconds, a number: %v", tc.x)
			assert.Less(t, d, 60.0, "seconds, not nanoseconds")
		})
	}
	keys := func(m map[string]any) []string {
		var ks []string
		for k := range m {
			ks = append(ks, k)
		}
		return ks
	}
	assert.ElementsMatch(t, keys(posted), keys(last), "the same fields")
	assert.Equal(t, posted["peer"], last["peer"])
	assert.Equal(t, posted["duration_seconds"], last["duration_seconds"], "the same exchange")
}

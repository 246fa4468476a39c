package admin

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// The mutex and block profiles are off until POST /debug/pprof/rates turns
// them on; GET says the rates; bad input is a 400 that changes nothing.
func TestProfileRates(t *testing.T) {
	t.Cleanup(func() {
		runtime.SetMutexProfileFraction(0)
		runtime.SetBlockProfileRate(0)
	})
	srv := httptest.NewServer(ProfileRatesHandler())
	defer srv.Close()
	call := func(method, query string) (int, map[string]int) {
		req, err := http.NewRequest(method, srv.URL+"?"+query, nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		var rates map[string]int
		if resp.StatusCode == http.StatusOK {
			require.NoError(t, json.Unmarshal(body, &rates))
		}
		return resp.StatusCode, rates
	}
	runtime.SetMutexProfileFraction(0)
	code, rates := call(http.MethodGet, "")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, map[string]int{"mutex": 0, "block": 0}, rates, "off by default")

	code, rates = call(http.MethodPost, "mutex=5&block=10000")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, map[string]int{"mutex": 5, "block": 10000}, rates)
	require.Equal(t, 5, runtime.SetMutexProfileFraction(-1), "the runtime's rate")

	for _, q := range []string{"mutex=-1", "block=x", "mutex=1&other=2"} {
		code, _ = call(http.MethodPost, q)
		require.Equal(t, http.StatusBadRequest, code, q)
	}
	code, rates = call(http.MethodGet, "")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, map[string]int{"mutex": 5, "block": 10000}, rates, "a refused change changes nothing")
	code, _ = call(http.MethodPut, "")
	require.Equal(t, http.StatusMethodNotAllowed, code)

	code, rates = call(http.MethodPost, "mutex=0&block=0")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, map[string]int{"mutex": 0, "block": 0}, rates)
}

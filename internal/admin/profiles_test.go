package admin

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
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

	for _, q := range []string{"mutex=-1", "block=x", "mutex=1&other=2", "mutex=1&block=%zz", "mutex=1&mutex=2"} {
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

// signalWriter closes started the first time its handler touches the
// headers: pprof.Profile and pprof.Trace do so first, once exclusive let
// them in.
type signalWriter struct {
	http.ResponseWriter
	once    sync.Once
	started chan struct{}
}

func (w *signalWriter) Header() http.Header {
	w.once.Do(func() { close(w.started) })
	return w.ResponseWriter.Header()
}

func (w *signalWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// One CPU profile and one trace at a time: a second asked for while one
// is taken gets 409 and a one-line reason (net/http/pprof alone answers
// 500), and once the first ended a new one is taken.
func TestOneProfileAtATime(t *testing.T) {
	for _, tc := range []struct{ name, path, busy string }{
		{"cpu", "/debug/pprof/profile?seconds=1", cpuBusy},
		{"trace", "/debug/pprof/trace?seconds=1", traceBusy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := Handler(prometheus.NewRegistry(), func() error { return nil }, 0)
			started := make(chan struct{})
			addr := serveAdmin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Query().Has("first") {
					w = &signalWriter{ResponseWriter: w, started: started}
				}
				h.ServeHTTP(w, r)
			}), Options{})
			get := func(query string) (int, string) {
				resp, err := http.Get("http://" + addr + tc.path + query)
				require.NoError(t, err)
				defer resp.Body.Close()
				body, err := io.ReadAll(resp.Body)
				require.NoError(t, err)
				return resp.StatusCode, string(body)
			}
			type answer struct {
				code int
				body string
			}
			first := make(chan answer, 1)
			go func() {
				code, body := get("&first")
				first <- answer{code, body}
			}()
			select {
			case <-started:
			case a := <-first:
				t.Fatalf("the first ended before it started: %d %s", a.code, a.body)
			}
			code, body := get("")
			require.Equal(t, http.StatusConflict, code)
			require.Equal(t, tc.busy+"\n", body)
			a := <-first
			require.Equal(t, http.StatusOK, a.code, a.body)
			require.NotEmpty(t, a.body)
			code, body = get("")
			require.Equal(t, http.StatusOK, code, "taken once the first ended: %s", body)
			require.NotEmpty(t, body)
		})
	}
}

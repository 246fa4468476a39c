package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	httppprof "net/http/pprof"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/cmd/dhtkv-bench/flamegraph"
	"github.com/dhtkv/dhtkv/internal/admin"
)

// TestRenderProfilesKeepsRaw renders this test process's own allocation
// profile and checks that the profile is kept beside its flame graph in a
// form pprof reads back, and that a missing profile removes the files an
// earlier run left.
func TestRenderProfilesKeepsRaw(t *testing.T) {
	var raw bytes.Buffer
	if err := pprof.Lookup("allocs").WriteTo(&raw, 0); err != nil {
		t.Fatal(err)
	}
	alloc, err := flamegraph.Parse(&raw)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, stale := range []string{"node-get-cpu.svg", "node-get-cpu.pb.gz"} {
		if err := os.WriteFile(filepath.Join(dir, stale), []byte("old run"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	a, err := renderProfiles(dir, "node-get", "get at 1 rps", &Profiles{Node: "http://n1", Alloc: alloc, CPUErr: errors.New("connection refused")})
	if err != nil {
		t.Fatal(err)
	}
	if a.CPUSVG != "" || a.CPURaw != "" || a.AllocSVG != "node-get-alloc.svg" || a.AllocRaw != "node-get-alloc.pb.gz" {
		t.Fatalf("artifacts %+v", a)
	}
	if len(a.Notes) != 1 || !strings.Contains(a.Notes[0], "connection refused") {
		t.Errorf("notes %q", a.Notes)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if got := strings.Join(names, " "); got != "node-get-alloc.pb.gz node-get-alloc.svg" {
		t.Errorf("files %s", got)
	}
	f, err := os.Open(filepath.Join(dir, a.AllocRaw))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	back, err := flamegraph.Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := flamegraph.SampleIndex(back, "alloc_space")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := flamegraph.SampleIndex(alloc, "alloc_space")
	if got, want := flamegraph.Total(back, idx), flamegraph.Total(alloc, want); got != want || got == 0 {
		t.Errorf("kept profile totals %d bytes, rendered one %d", got, want)
	}

	s := sampleResult(t)
	s.Profiles = a
	md := RenderScenario(s)
	if !strings.Contains(md, "[node-get-alloc.pb.gz](node-get-alloc.pb.gz)") || !strings.Contains(md, "go tool pprof -http=: node-get-alloc.pb.gz") {
		t.Errorf("report does not link the raw profile:\n%s", md)
	}
	if sum := RenderSummary([]*ScenarioResult{s}, s.Machine, false, s.Threshold, nil); !strings.Contains(sum, "| — | [svg](node-get-alloc.svg) [pb.gz](node-get-alloc.pb.gz) |") {
		t.Errorf("summary does not link the raw profile:\n%s", sum)
	}
}

// TestCaptureProfilesContention captures from a real admin handler (this
// test process's own profiles) while goroutines contend for a lock and
// block on it: the mutex and block deltas and the goroutine snapshot
// come back with samples, their flame graphs and tables are drawn, and
// the process's rates are put back as they were.
func TestCaptureProfilesContention(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", httppprof.Index) // mutex, block, goroutine, allocs
	mux.HandleFunc("/debug/pprof/profile", httppprof.Profile)
	mux.Handle("/debug/pprof/rates", admin.ProfileRatesHandler())
	srv := httptest.NewServer(mux)
	defer srv.Close()
	prevMutex := runtime.SetMutexProfileFraction(-1)

	// Contention from the moment the rates are set: each round, one
	// goroutine holds the lock for a millisecond while another waits
	// for it. (A wait begun before the rate was set is not sampled, so
	// the rounds start only once it is.)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	rounds := 0 // under mu: what the waiter does once it has the lock
	wg.Go(func() {
		for runtime.SetMutexProfileFraction(-1) == prevMutex {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
		for {
			select {
			case <-stop:
				return
			default:
			}
			mu.Lock()
			waiting := make(chan struct{})
			done := make(chan struct{})
			go func() {
				close(waiting)
				mu.Lock() // waits for the holder below
				rounds++
				mu.Unlock()
				close(done)
			}()
			<-waiting
			time.Sleep(time.Millisecond)
			mu.Unlock()
			<-done
		}
	})
	p := captureProfiles(context.Background(), srv.URL, 0, 1, Contention{MutexFraction: 1, BlockRate: time.Microsecond}, t.TempDir(), "x")
	close(stop)
	wg.Wait()

	for kind, c := range map[string]struct {
		prof *profile.Profile
		err  error
	}{"mutex": {p.Mutex, p.MutexErr}, "block": {p.Block, p.BlockErr}, "goroutine": {p.Goroutine, p.GoroutineErr}} {
		require.NoError(t, c.err, kind)
		require.NotEmpty(t, c.prof.Sample, "%s: no samples", kind)
	}
	require.Equal(t, prevMutex, runtime.SetMutexProfileFraction(-1), "the mutex rate is put back")
	resp, err := http.Get(srv.URL + "/debug/pprof/rates")
	require.NoError(t, err)
	defer resp.Body.Close()
	var rates struct{ Mutex, Block int }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&rates))
	require.Equal(t, struct{ Mutex, Block int }{prevMutex, 0}, rates, "the rates are put back")

	dir := t.TempDir()
	a, err := renderProfiles(dir, "node-put", "put at 1 rps", p)
	require.NoError(t, err)
	require.Equal(t, "node-put-mutex.svg", a.MutexSVG)
	require.Equal(t, "node-put-block.pb.gz", a.BlockRaw)
	require.Equal(t, "node-put-goroutine.svg", a.GoroutineSVG)
	require.Contains(t, a.MutexTop, "TestCaptureProfilesContention", "the contended lock's unlocker")
	s := sampleResult(t)
	s.Profiles = a
	md := RenderScenario(s)
	for _, want := range []string{"### Mutex contention (delay)", "[![block flame graph](node-put-block.svg)]", "### Goroutines", "mutex events sampled 1 in 1"} {
		require.Contains(t, md, want)
	}
}

// TestCaptureProfilesContentionOff: with both rates 0 the node's rates
// are not touched and the report says the profiles were off.
func TestCaptureProfilesContentionOff(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", httppprof.Index)
	mux.HandleFunc("/debug/pprof/profile", httppprof.Profile)
	mux.HandleFunc("/debug/pprof/rates", func(w http.ResponseWriter, _ *http.Request) {
		t.Error("the rates were asked for")
		w.WriteHeader(http.StatusInternalServerError)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	p := captureProfiles(context.Background(), srv.URL, 0, 1, Contention{}, t.TempDir(), "x")
	require.ErrorContains(t, p.MutexErr, "--mutex-profile-fraction 0")
	require.Nil(t, p.Mutex)
	require.NoError(t, p.GoroutineErr)
}

// TestSetRatesUndoesWhatTheNodeApplied: the run is cancelled while the
// node applies the new rates, so their answer is lost; the rates the
// node had are put back all the same. And a rate left at 0 is not sent:
// an operator's own mutex rate stays.
func TestSetRatesUndoesWhatTheNodeApplied(t *testing.T) {
	prev := runtime.SetMutexProfileFraction(7) // an operator's
	defer runtime.SetMutexProfileFraction(prev)
	rates := admin.ProfileRatesHandler()
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var posts []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			mu.Lock()
			posts = append(posts, r.URL.RawQuery)
			first := len(posts) == 1
			mu.Unlock()
			if first { // applied, then the run is cancelled before the answer
				rates.ServeHTTP(httptest.NewRecorder(), r)
				cancel()
				<-r.Context().Done()
				return
			}
		}
		rates.ServeHTTP(w, r)
	}))
	defer srv.Close()
	_, err := setRates(ctx, srv.Client(), srv.URL, 0, int(time.Millisecond))
	require.ErrorIs(t, err, context.Canceled)
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	var now struct{ Mutex, Block int }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&now))
	require.Equal(t, struct{ Mutex, Block int }{7, 0}, now, "the block rate put back, the operator's mutex rate untouched")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"block=1000000", "block=0"}, posts)
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/google/pprof/profile"

	"github.com/dhtkv/dhtkv/cmd/dhtkv-bench/flamegraph"
)

// Profiles are what was captured from one node during the measured run.
type Profiles struct {
	Node        string // which node (admin URL) they came from
	CPU         *profile.Profile
	Alloc       *profile.Profile
	AllocMethod string // how the allocation delta was obtained
	// Mutex and Block are the contention during the window (deltas), and
	// Goroutine a snapshot of where the goroutines were at its middle.
	Mutex, Block, Goroutine *profile.Profile
	// Rates says at what rates Mutex and Block were sampled.
	Rates                                              string
	CPUErr, AllocErr, MutexErr, BlockErr, GoroutineErr error
}

// Contention is how the mutex and block profiles are sampled during the
// measured window: the node's rates are set at its start and put back as
// they were at its end (admin.ProfileRatesHandler). Sampling costs the
// node a little CPU while it runs; both are off outside the window.
type Contention struct {
	// MutexFraction samples 1 in MutexFraction contended mutex events
	// (--mutex-profile-fraction; default 100; 0: no mutex profile).
	MutexFraction int
	// BlockRate samples blocking events, one per BlockRate blocked on
	// average; longer ones always (--block-profile-rate; default 1ms; 0:
	// no block profile). The runtime scales what it samples, so the
	// profile's totals stay unbiased.
	BlockRate time.Duration
}

// captureProfiles fetches a CPU profile, an allocation delta, the mutex
// and block deltas and a goroutine snapshot for the window
// [start+delay, start+delay+seconds] from a node's admin listener. It
// runs alongside the load run; delay skips the load generator's warm-up
// so the profiles cover the measured part only.
func captureProfiles(ctx context.Context, admin string, delay time.Duration, seconds int, c Contention, rawDir, prefix string) *Profiles {
	p := &Profiles{Node: admin}
	select {
	case <-ctx.Done():
		p.CPUErr, p.AllocErr, p.MutexErr, p.BlockErr, p.GoroutineErr = ctx.Err(), ctx.Err(), ctx.Err(), ctx.Err(), ctx.Err()
		return p
	case <-time.After(delay):
	}
	client := &http.Client{Timeout: time.Duration(seconds)*time.Second + 60*time.Second}
	p.MutexErr, p.BlockErr = errors.New("off (--mutex-profile-fraction 0)"), errors.New("off (--block-profile-rate 0)")
	if c.MutexFraction > 0 || c.BlockRate > 0 {
		restore, err := setRates(ctx, client, admin, c.MutexFraction, int(c.BlockRate.Nanoseconds()))
		var rates []string
		if c.MutexFraction > 0 {
			p.MutexErr = err
			rates = append(rates, fmt.Sprintf("mutex events sampled 1 in %d", c.MutexFraction))
		}
		if c.BlockRate > 0 {
			p.BlockErr = err
			rates = append(rates, fmt.Sprintf("blocking events one per %s blocked", c.BlockRate))
		}
		if err == nil {
			defer restore()
			p.Rates = strings.Join(rates, ", ")
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		p.CPU, p.CPUErr = fetchProfile(ctx, client, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", admin, seconds),
			filepath.Join(rawDir, prefix+"-cpu.pb.gz"))
	})
	wg.Go(func() {
		p.Alloc, p.AllocMethod, p.AllocErr = captureAllocDelta(ctx, client, admin, seconds, rawDir, prefix)
	})
	delta := func(kind string, into **profile.Profile, errp *error) {
		if *errp != nil {
			return
		}
		wg.Go(func() {
			*into, *errp = fetchProfile(ctx, client, fmt.Sprintf("%s/debug/pprof/%s?seconds=%d", admin, kind, seconds),
				filepath.Join(rawDir, prefix+"-"+kind+".pb.gz"))
		})
	}
	delta("mutex", &p.Mutex, &p.MutexErr)
	delta("block", &p.Block, &p.BlockErr)
	wg.Go(func() {
		select {
		case <-ctx.Done():
			p.GoroutineErr = ctx.Err()
			return
		case <-time.After(time.Duration(seconds) * time.Second / 2):
		}
		p.Goroutine, p.GoroutineErr = fetchProfile(ctx, client, admin+"/debug/pprof/goroutine",
			filepath.Join(rawDir, prefix+"-goroutine.pb.gz"))
	})
	wg.Wait()
	return p
}

// setRates sets a node's mutex and block profile rates (0 leaves that one
// as it is) and returns the function that puts back the rates it had.
// Once the node has answered with its rates, they are put back whatever
// happens: a change the node applied before its answer was lost (the run
// cancelled meanwhile) is undone too.
func setRates(ctx context.Context, client *http.Client, admin string, mutex, blockNS int) (restore func(), err error) {
	rates := func(ctx context.Context, method, query string) (prev struct{ Mutex, Block int }, err error) {
		req, err := http.NewRequestWithContext(ctx, method, admin+"/debug/pprof/rates"+query, nil)
		if err != nil {
			return prev, fmt.Errorf("profile rates: %w", err)
		}
		resp, err := client.Do(req)
		if err != nil {
			return prev, fmt.Errorf("profile rates: %w", err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return prev, fmt.Errorf("profile rates: %w", err)
		}
		if resp.StatusCode != http.StatusOK {
			return prev, fmt.Errorf("profile rates: %s: %.200s", resp.Status, body)
		}
		if err := json.Unmarshal(body, &prev); err != nil {
			return prev, fmt.Errorf("profile rates: %w", err)
		}
		return prev, nil
	}
	prev, err := rates(ctx, http.MethodGet, "")
	if err != nil {
		return nil, err
	}
	query := func(m, b int) string {
		var q []string
		if mutex > 0 {
			q = append(q, fmt.Sprintf("mutex=%d", m))
		}
		if blockNS > 0 {
			q = append(q, fmt.Sprintf("block=%d", b))
		}
		return "?" + strings.Join(q, "&")
	}
	restore = func() {
		// Even when the run was interrupted: a node left sampling would
		// pay for it in every later run.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := rates(ctx, http.MethodPost, query(prev.Mutex, prev.Block)); err != nil {
			slog.Warn("could not put the node's profile rates back", "admin", admin, "err", err)
		}
	}
	if _, err := rates(ctx, http.MethodPost, query(mutex, blockNS)); err != nil {
		restore()
		return nil, err
	}
	return restore, nil
}

// captureAllocDelta asks for the server-side delta (`allocs?seconds=N`, which
// net/http/pprof supports). If the admin handler does not, it subtracts a
// snapshot taken at the start of the window from one taken at its end.
func captureAllocDelta(ctx context.Context, client *http.Client, admin string, seconds int, rawDir, prefix string) (*profile.Profile, string, error) {
	before, errBefore := fetchProfile(ctx, client, admin+"/debug/pprof/allocs", filepath.Join(rawDir, prefix+"-allocs-before.pb.gz"))
	start := time.Now()
	d, err := fetchProfile(ctx, client, fmt.Sprintf("%s/debug/pprof/allocs?seconds=%d", admin, seconds),
		filepath.Join(rawDir, prefix+"-allocs-delta.pb.gz"))
	if err == nil {
		return d, fmt.Sprintf("server-side delta (`/debug/pprof/allocs?seconds=%d`)", seconds), nil
	}
	slog.Warn("allocs?seconds unsupported; falling back to before/after snapshots", "err", err)
	if errBefore != nil {
		return nil, "", fmt.Errorf("alloc delta: %w; before snapshot: %w", err, errBefore)
	}
	if rest := time.Duration(seconds)*time.Second - time.Since(start); rest > 0 {
		select {
		case <-ctx.Done():
			return nil, "", ctx.Err()
		case <-time.After(rest):
		}
	}
	after, err := fetchProfile(ctx, client, admin+"/debug/pprof/allocs", filepath.Join(rawDir, prefix+"-allocs-after.pb.gz"))
	if err != nil {
		return nil, "", fmt.Errorf("alloc after snapshot: %w", err)
	}
	delta, err := flamegraph.Delta(before, after)
	if err != nil {
		return nil, "", err
	}
	return delta, "difference of `/debug/pprof/allocs` snapshots taken at the start and end of the window", nil
}

// fetchProfile GETs and parses a pprof profile, keeping the raw bytes at
// rawPath so a reader can open it with `go tool pprof`.
func fetchProfile(ctx context.Context, client *http.Client, url, rawPath string) (*profile.Profile, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("profile request %s: %w", url, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch %s: %s: %.200s", url, resp.Status, body)
	}
	if err := os.WriteFile(rawPath, body, 0o644); err != nil {
		slog.Warn("could not keep raw profile", "path", rawPath, "err", err)
	}
	p, err := flamegraph.Parse(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	return p, nil
}

// ProfileArtifacts are the rendered outputs linked from a scenario report.
type ProfileArtifacts struct {
	Node        string
	CPUSVG      string // file name relative to the report directory; "" if none
	AllocSVG    string
	CPURaw      string // the profile the CPU flame graph was drawn from (.pb.gz); "" if none
	AllocRaw    string // the allocation profile (the delta over the window) as .pb.gz
	CPUTopFlat  string
	CPUTopCum   string
	AllocTop    string
	AllocMethod string
	// The contention profiles and the goroutine snapshot, likewise.
	MutexSVG, MutexRaw, MutexTop             string
	BlockSVG, BlockRaw, BlockTop             string
	GoroutineSVG, GoroutineRaw, GoroutineTop string
	Rates                                    string   // Profiles.Rates
	Notes                                    []string // what could not be captured, and why
}

// renderProfiles writes the flame graphs of a scenario into outDir, each
// beside the profile it was drawn from (<scenario>-<kind>.pb.gz, gzipped
// protobuf that `go tool pprof` opens), and computes its top tables. Stale
// files from an earlier run are removed when a profile is missing, so a
// report never links a picture or profile of another run.
func renderProfiles(outDir, scenario, subtitle string, p *Profiles) (*ProfileArtifacts, error) {
	a := &ProfileArtifacts{Node: p.Node, AllocMethod: p.AllocMethod, Rates: p.Rates}
	render := func(prof *profile.Profile, capErr error, typ, kind, title string) (svg, raw string, idx int, err error) {
		svg, raw = fmt.Sprintf("%s-%s.svg", scenario, kind), fmt.Sprintf("%s-%s.pb.gz", scenario, kind)
		svgPath, rawPath := filepath.Join(outDir, svg), filepath.Join(outDir, raw)
		drop := func() {
			_ = os.Remove(svgPath)
			_ = os.Remove(rawPath)
		}
		if capErr != nil {
			a.Notes = append(a.Notes, fmt.Sprintf("%s profile not captured: %v", kind, capErr))
			drop()
			return "", "", 0, nil
		}
		if prof == nil { // not asked for
			drop()
			return "", "", 0, nil
		}
		idx, err = flamegraph.SampleIndex(prof, typ)
		if err != nil {
			a.Notes = append(a.Notes, fmt.Sprintf("%s profile unusable: %v", kind, err))
			drop()
			return "", "", 0, nil
		}
		var buf bytes.Buffer
		if err := flamegraph.RenderProfile(&buf, prof, idx, flamegraph.Options{Title: title, Subtitle: subtitle}); err != nil {
			return "", "", 0, err
		}
		if err := os.WriteFile(svgPath, buf.Bytes(), 0o644); err != nil {
			return "", "", 0, fmt.Errorf("write %s: %w", svgPath, err)
		}
		buf.Reset()
		if err := prof.Write(&buf); err != nil {
			return "", "", 0, fmt.Errorf("encode %s profile: %w", kind, err)
		}
		if err := os.WriteFile(rawPath, buf.Bytes(), 0o644); err != nil {
			return "", "", 0, fmt.Errorf("write %s: %w", rawPath, err)
		}
		return svg, raw, idx, nil
	}
	var err error
	var idx int
	if a.CPUSVG, a.CPURaw, idx, err = render(p.CPU, p.CPUErr, "cpu", "cpu", scenario+": CPU time"); err != nil {
		return nil, err
	}
	if a.CPUSVG != "" {
		a.CPUTopFlat = flamegraph.Top(p.CPU, idx, 20)
		a.CPUTopCum = flamegraph.TopCum(p.CPU, idx, 20)
	}
	if a.AllocSVG, a.AllocRaw, idx, err = render(p.Alloc, p.AllocErr, "alloc_space", "alloc", scenario+": bytes allocated"); err != nil {
		return nil, err
	}
	if a.AllocSVG != "" {
		a.AllocTop = flamegraph.Top(p.Alloc, idx, 20)
	}
	// Where goroutines wait is not their leaf frame (a channel receive, a
	// mutex's Unlock): these tables are by cumulative value.
	for _, k := range []struct {
		prof          *profile.Profile
		err           error
		typ, kind     string
		title         string
		svg, raw, top *string
	}{
		{p.Mutex, p.MutexErr, "delay", "mutex", scenario + ": mutex contention (time waited, by where the holder unlocked)", &a.MutexSVG, &a.MutexRaw, &a.MutexTop},
		{p.Block, p.BlockErr, "delay", "block", scenario + ": time blocked (channels, select, sync)", &a.BlockSVG, &a.BlockRaw, &a.BlockTop},
		{p.Goroutine, p.GoroutineErr, "goroutine", "goroutine", scenario + ": goroutines, mid-window", &a.GoroutineSVG, &a.GoroutineRaw, &a.GoroutineTop},
	} {
		if *k.svg, *k.raw, idx, err = render(k.prof, k.err, k.typ, k.kind, k.title); err != nil {
			return nil, err
		}
		if *k.svg != "" {
			*k.top = flamegraph.TopCum(k.prof, idx, 20)
		}
	}
	return a, nil
}

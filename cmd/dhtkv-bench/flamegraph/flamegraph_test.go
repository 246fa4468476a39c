package flamegraph

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
)

// synthetic builds a CPU-like profile by hand:
//
//	main.main → app.handle → app.parse         3 samples, 30ms
//	main.main → app.handle → runtime.mallocgc  5 samples, 50ms (mallocgc inlined into a location with app.handle)
//	main.main → app.serve                      2 samples, 20ms
func synthetic() *profile.Profile {
	fn := func(id uint64, name string) *profile.Function {
		return &profile.Function{ID: id, Name: name, SystemName: name, Filename: "x.go"}
	}
	fMain, fHandle, fParse, fMalloc, fServe := fn(1, "main.main"), fn(2, "example.com/app.handle"), fn(3, "example.com/app.parse"), fn(4, "runtime.mallocgc"), fn(5, "example.com/app.(*srv).serve")
	loc := func(id uint64, fns ...*profile.Function) *profile.Location {
		l := &profile.Location{ID: id, Address: 0x1000 + id}
		for _, f := range fns {
			l.Line = append(l.Line, profile.Line{Function: f, Line: 1})
		}
		return l
	}
	lMain := loc(1, fMain)
	lHandle := loc(2, fHandle)
	lParse := loc(3, fParse)
	lMallocInHandle := loc(4, fMalloc, fHandle) // innermost first: mallocgc inlined into handle
	lServe := loc(5, fServe)
	sample := func(n int64, locs ...*profile.Location) *profile.Sample {
		return &profile.Sample{Location: locs, Value: []int64{n, n * 10_000_000}}
	}
	return &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		PeriodType: &profile.ValueType{Type: "cpu", Unit: "nanoseconds"},
		Period:     10_000_000,
		Sample: []*profile.Sample{
			sample(3, lParse, lHandle, lMain),
			sample(5, lMallocInHandle, lMain),
			sample(2, lServe, lMain),
		},
		Location: []*profile.Location{lMain, lHandle, lParse, lMallocInHandle, lServe},
		Function: []*profile.Function{fMain, fHandle, fParse, fMalloc, fServe},
	}
}

func TestFoldSynthetic(t *testing.T) {
	p := synthetic()
	if err := p.CheckValid(); err != nil {
		t.Fatalf("synthetic profile invalid: %v", err)
	}
	idx, err := SampleIndex(p, "cpu")
	if err != nil || idx != 1 {
		t.Fatalf("SampleIndex(cpu) = %d, %v", idx, err)
	}
	var buf bytes.Buffer
	if err := WriteFolded(&buf, Fold(p, idx)); err != nil {
		t.Fatal(err)
	}
	want := "main.main;example.com/app.(*srv).serve 20000000\n" +
		"main.main;example.com/app.handle;example.com/app.parse 30000000\n" +
		"main.main;example.com/app.handle;runtime.mallocgc 50000000\n"
	if buf.String() != want {
		t.Errorf("folded:\n%s\nwant:\n%s", buf.String(), want)
	}
	// The two handle stacks come from different locations but must merge.
	idx, _ = SampleIndex(p, "samples")
	stacks := Fold(p, idx)
	var sum int64
	for _, s := range stacks {
		sum += s.Value
	}
	if sum != 10 {
		t.Errorf("folded samples sum = %d, want 10", sum)
	}
}

func TestSampleIndexErrors(t *testing.T) {
	p := synthetic()
	if _, err := SampleIndex(p, "alloc_space"); err == nil {
		t.Error("want error for missing sample type")
	}
	if idx, err := SampleIndex(p, ""); err != nil || idx != 1 {
		t.Errorf("default sample type = %d, %v; want last (1)", idx, err)
	}
}

func TestTopSynthetic(t *testing.T) {
	p := synthetic()
	rows, total := Rows(p, 1)
	if total != 100_000_000 {
		t.Fatalf("total = %d", total)
	}
	got := map[string]Row{}
	for _, r := range rows {
		got[r.Name] = r
	}
	check := func(name string, flat, cum int64) {
		t.Helper()
		r := got[name]
		if r.Flat != flat*10_000_000 || r.Cum != cum*10_000_000 {
			t.Errorf("%s: flat=%d cum=%d, want %d/%d samples", name, r.Flat, r.Cum, flat, cum)
		}
	}
	check("main.main", 0, 10)
	check("example.com/app.handle", 0, 8)
	check("runtime.mallocgc", 5, 5)
	check("example.com/app.parse", 3, 3)
	check("example.com/app.(*srv).serve", 2, 2)
	if rows[0].Name != "runtime.mallocgc" {
		t.Errorf("first row %q, want runtime.mallocgc", rows[0].Name)
	}

	text := Top(p, 1, 2)
	for _, want := range []string{
		"Showing top 2 nodes out of 5 (total 100ms)",
		"      50ms  50.00%  50.00%       50ms  50.00%  runtime.mallocgc",
		"      30ms  30.00%  80.00%       30ms  30.00%  example.com/app.parse",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("Top missing %q in:\n%s", want, text)
		}
	}
	cum := TopCum(p, 1, 2)
	lines := strings.Split(strings.TrimSpace(cum), "\n")
	if !strings.HasSuffix(lines[3], "main.main") || !strings.Contains(lines[3], "100.00%") {
		t.Errorf("TopCum first row = %q, want main.main at 100%%", lines[3])
	}
	if !strings.HasSuffix(lines[4], "example.com/app.handle") {
		t.Errorf("TopCum second row = %q, want handle", lines[4])
	}
}

func TestRecursionCountedOnce(t *testing.T) {
	f := &profile.Function{ID: 1, Name: "pkg.rec"}
	l := &profile.Location{ID: 1, Line: []profile.Line{{Function: f}}}
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}},
		Sample:     []*profile.Sample{{Location: []*profile.Location{l, l, l}, Value: []int64{4}}},
		Location:   []*profile.Location{l},
		Function:   []*profile.Function{f},
	}
	rows, total := Rows(p, 0)
	if len(rows) != 1 || rows[0].Cum != 4 || rows[0].Flat != 4 || total != 4 {
		t.Errorf("rows = %+v total %d, want one row flat=cum=4", rows, total)
	}
}

// svgDoc is just enough of the SVG structure to check the output.
type svgDoc struct {
	XMLName xml.Name `xml:"svg"`
	Texts   []string `xml:"text"`
	Groups  []struct {
		Title string `xml:"title"`
		Rect  struct {
			Width string `xml:"width,attr"`
			Fill  string `xml:"fill,attr"`
		} `xml:"rect"`
		Text string `xml:"text"`
	} `xml:"g"`
}

func decodeSVG(t *testing.T, data []byte) svgDoc {
	t.Helper()
	// A strict token pass catches any malformed markup the struct decoder
	// would skip over.
	dec := xml.NewDecoder(bytes.NewReader(data))
	for {
		_, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v", err)
		}
	}
	var doc svgDoc
	if err := xml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("decode SVG: %v", err)
	}
	return doc
}

func TestSVGSynthetic(t *testing.T) {
	p := synthetic()
	var buf bytes.Buffer
	err := RenderProfile(&buf, p, 1, Options{Title: `node-get <cpu> & "friends"`, Subtitle: "test"})
	if err != nil {
		t.Fatal(err)
	}
	doc := decodeSVG(t, buf.Bytes())
	if len(doc.Texts) < 2 || doc.Texts[0] != `node-get <cpu> & "friends"` {
		t.Errorf("heading = %q", doc.Texts)
	}
	titles := map[string]string{}
	for _, g := range doc.Groups {
		titles[g.Title] = g.Rect.Fill
	}
	for _, want := range []string{
		"all (100ms, 100.00%)",
		"main.main (100ms, 100.00%)",
		"example.com/app.handle (80ms, 80.00%)",
		"runtime.mallocgc (50ms, 50.00%)",
		"example.com/app.(*srv).serve (20ms, 20.00%)",
	} {
		if _, ok := titles[want]; !ok {
			t.Errorf("no frame titled %q; have %v", want, titles)
		}
	}
	// Same package, same colour; different package, different colour.
	if titles["example.com/app.handle (80ms, 80.00%)"] != titles["example.com/app.(*srv).serve (20ms, 20.00%)"] {
		t.Error("frames of one package have different colours")
	}
	if titles["example.com/app.handle (80ms, 80.00%)"] == titles["runtime.mallocgc (50ms, 50.00%)"] {
		t.Error("frames of different packages share a colour")
	}
	if len(doc.Groups) != 6 {
		t.Errorf("%d frames drawn, want 6 (all, main, handle, parse, mallocgc, serve)", len(doc.Groups))
	}
	// Labels are short names; tooltips keep the import path.
	labels := map[string]string{}
	for _, g := range doc.Groups {
		labels[g.Text] = g.Title
	}
	if title := labels["app.handle"]; title != "example.com/app.handle (80ms, 80.00%)" {
		t.Errorf("label app.handle belongs to %q; labels %v", title, labels)
	}
}

func TestSVGDropsNarrowFrames(t *testing.T) {
	stacks := []Stack{
		{Frames: []string{"a.big"}, Value: 100_000},
		{Frames: []string{"a.tiny"}, Value: 50}, // 0.05% < 0.1%
	}
	var buf bytes.Buffer
	if err := SVG(&buf, stacks, Options{Unit: "count"}); err != nil {
		t.Fatal(err)
	}
	doc := decodeSVG(t, buf.Bytes())
	for _, g := range doc.Groups {
		if strings.HasPrefix(g.Title, "a.tiny") {
			t.Errorf("frame under 0.1%% drawn: %q", g.Title)
		}
	}
	if len(doc.Groups) != 2 {
		t.Errorf("%d frames, want 2", len(doc.Groups))
	}
}

func TestSVGEmpty(t *testing.T) {
	var buf bytes.Buffer
	if err := SVG(&buf, nil, Options{}); err != nil {
		t.Fatal(err)
	}
	decodeSVG(t, buf.Bytes())
}

func TestPackage(t *testing.T) {
	for in, want := range map[string]string{
		"runtime.mallocgc": "runtime",
		"github.com/dhtkv/dhtkv/internal/store.(*DB).Get":                 "github.com/dhtkv/dhtkv/internal/store",
		"net/http.(*conn).serve.func1":                                    "net/http",
		"sync/atomic.(*Pointer[go.shape.struct { net/http.x int }]).Load": "sync/atomic",
		"0x4a5f":                     "0x4a5f",
		"gopkg.in/yaml.v3.unmarshal": "gopkg.in/yaml",
	} {
		if got := Package(in); got != want {
			t.Errorf("Package(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestFormatValue(t *testing.T) {
	for _, c := range []struct {
		v    int64
		unit string
		want string
	}{
		{1_500_000_000, "nanoseconds", "1.5s"},
		{10_000_000, "nanoseconds", "10ms"},
		{2048, "bytes", "2kB"},
		{3 << 20, "bytes", "3MB"},
		{-512, "bytes", "-512B"},
		{42, "count", "42"},
	} {
		if got := FormatValue(c.v, c.unit); got != c.want {
			t.Errorf("FormatValue(%d, %s) = %q, want %q", c.v, c.unit, got, c.want)
		}
	}
}

func TestDelta(t *testing.T) {
	before := synthetic()
	after := synthetic()
	after.Sample[0].Value = []int64{7, 70_000_000} // parse went from 3 to 7 samples
	d, err := Delta(before, after)
	if err != nil {
		t.Fatal(err)
	}
	stacks := Fold(d, 1)
	if len(stacks) != 1 || stacks[0].Value != 40_000_000 || stacks[0].Frames[2] != "example.com/app.parse" {
		t.Errorf("delta stacks = %+v, want only parse with 40ms", stacks)
	}
	if before.Sample[0].Value[1] != 30_000_000 {
		t.Error("Delta modified its input")
	}
}

//go:noinline
func burn(d time.Duration) int {
	x := 0
	for end := time.Now().Add(d); time.Now().Before(end); {
		for i := range 10_000 {
			x += i * i % 7
		}
	}
	return x
}

var sink []byte

//go:noinline
func allocLots() {
	for range 2000 {
		sink = make([]byte, 4096)
	}
}

// TestRealHeapProfile runs the whole pipeline on an allocation profile the
// runtime produced, which exercises real locations, inlining and mappings.
func TestRealHeapProfile(t *testing.T) {
	old := runtime.MemProfileRate
	runtime.MemProfileRate = 1
	defer func() { runtime.MemProfileRate = old }()
	allocLots()
	runtime.GC() // publish the allocations to the profile
	var raw bytes.Buffer
	if err := pprof.Lookup("allocs").WriteTo(&raw, 0); err != nil {
		t.Fatal(err)
	}
	p, err := Parse(&raw)
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{"alloc_space", "alloc_objects"} {
		idx, err := SampleIndex(p, typ)
		if err != nil {
			t.Fatal(err)
		}
		var folded bytes.Buffer
		if err := WriteFolded(&folded, Fold(p, idx)); err != nil {
			t.Fatal(err)
		}
		line := regexp.MustCompile(`(?m)^.*flamegraph\.allocLots (\d+)$`).FindStringSubmatch(folded.String())
		if line == nil {
			t.Fatalf("%s: allocLots not a leaf in folded output:\n%.2000s", typ, folded.String())
		}
		v, _ := strconv.ParseInt(line[1], 10, 64)
		min := int64(2000 * 4096)
		if typ == "alloc_objects" {
			min = 2000
		}
		if v < min {
			t.Errorf("%s: allocLots = %d, want >= %d", typ, v, min)
		}
		if !strings.HasPrefix(folded.String(), "runtime.") && !strings.Contains(folded.String(), "testing.tRunner;") {
			t.Errorf("%s: stacks not rooted at the goroutine entry:\n%.500s", typ, folded.String())
		}
		top := Top(p, idx, 20)
		if !strings.Contains(top, "flamegraph.allocLots") {
			t.Errorf("%s: top lacks allocLots:\n%s", typ, top)
		}
		var svg bytes.Buffer
		if err := RenderProfile(&svg, p, idx, Options{Title: "heap " + typ}); err != nil {
			t.Fatal(err)
		}
		doc := decodeSVG(t, svg.Bytes())
		found := false
		for _, g := range doc.Groups {
			if strings.Contains(g.Title, "flamegraph.allocLots (") && strings.Contains(g.Title, "%)") {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: no allocLots frame in SVG", typ)
		}
	}
}

// TestRealCPUProfile captures a CPU profile of a busy loop in-process. The
// machine is shared and noisy, so it only insists on what must hold whenever
// any samples were taken.
func TestRealCPUProfile(t *testing.T) {
	var raw bytes.Buffer
	if err := pprof.StartCPUProfile(&raw); err != nil {
		t.Skipf("CPU profiling unavailable: %v", err)
	}
	if burn(400*time.Millisecond) < 0 { // use the result so the loop is not optimised away
		t.Log("unreachable")
	}
	pprof.StopCPUProfile()
	p, err := Parse(&raw)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := SampleIndex(p, "cpu")
	if err != nil {
		t.Fatal(err)
	}
	rows, total := Rows(p, idx)
	if total == 0 {
		t.Skip("no CPU samples taken (machine too busy?)")
	}
	var flatSum int64
	var burnCum int64
	for _, r := range rows {
		flatSum += r.Flat
		if strings.HasSuffix(r.Name, "flamegraph.burn") {
			burnCum = r.Cum
		}
	}
	if flatSum != total {
		t.Errorf("flat values sum to %d, total %d", flatSum, total)
	}
	if burnCum < total/2 {
		t.Errorf("burn cum = %d of %d; want the busy loop to dominate\n%s", burnCum, total, Top(p, idx, 10))
	}
	var svg bytes.Buffer
	if err := RenderProfile(&svg, p, idx, Options{Title: "cpu"}); err != nil {
		t.Fatal(err)
	}
	decodeSVG(t, svg.Bytes())
}

// TestSVGScript runs the flame graph's zoom and search script under node,
// against a stand-in for the browser's DOM (testdata/script_check.js), on
// the synthetic profile: zoom into app.handle (80% of the total), search
// for mallocgc, clear the search, reset the zoom. Skipped without node.
func TestSVGScript(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not installed")
	}
	var buf bytes.Buffer
	if err := RenderProfile(&buf, synthetic(), 1, Options{Title: "zoom"}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "g.svg")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(node, "testdata/script_check.js", path, "malloc", "example.com/app.handle").CombinedOutput()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, out)
	}
	type frame struct {
		Name         string
		Shown, Faded bool
		X, Width     float64
		Fill, Label  string
	}
	type state struct {
		Frames          []frame
		Reset           bool
		Search, Matched string
	}
	var got struct{ Initial, Zoomed, Searched, Cleared, Reset state }
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	byName := func(s state) map[string]frame {
		m := map[string]frame{}
		for _, f := range s.Frames {
			m[f.Name[:strings.LastIndex(f.Name, " (")]] = f
		}
		return m
	}
	const left, plotW = 10.0, 1180.0
	near := func(a, b float64) bool { return a > b-0.01 && a < b+0.01 }
	z := byName(got.Zoomed)
	for name, want := range map[string]struct {
		shown, faded bool
		x, width     float64
	}{
		"all":                          {true, true, left, plotW},                          // ancestor: full width, faded
		"main.main":                    {true, true, left, plotW},                          // ancestor
		"example.com/app.handle":       {true, false, left, plotW},                         // the zoomed frame
		"example.com/app.parse":        {true, false, left, plotW * 30 / 80},               // child: 30 of 80
		"runtime.mallocgc":             {true, false, left + plotW*30/80, plotW * 50 / 80}, // child: 50 of 80
		"example.com/app.(*srv).serve": {shown: false},                                     // sibling: hidden
	} {
		f := z[name]
		if f.Shown != want.shown || (want.shown && (f.Faded != want.faded || !near(f.X, want.x) || !near(f.Width, want.width))) {
			t.Errorf("zoomed: %s = %+v, want %+v", name, f, want)
		}
	}
	if !got.Zoomed.Reset || got.Initial.Reset {
		t.Errorf("reset control shown: before zoom %v, after %v", got.Initial.Reset, got.Zoomed.Reset)
	}
	if z["example.com/app.(*srv).serve"].Label != "app.(*srv).serve" {
		t.Errorf("labels: %+v", z)
	}

	s := byName(got.Searched)
	if s["runtime.mallocgc"].Fill != "rgb(230,0,230)" || s["example.com/app.parse"].Fill == "rgb(230,0,230)" {
		t.Errorf("search fills: %+v", s)
	}
	if got.Searched.Matched != "Matched: 50.0%" || got.Searched.Search != "Clear search" {
		t.Errorf("search: %q %q", got.Searched.Matched, got.Searched.Search)
	}
	init := byName(got.Initial)
	for name, f := range byName(got.Cleared) {
		if f.Fill != init[name].Fill {
			t.Errorf("cleared: %s fill %s, was %s", name, f.Fill, init[name].Fill)
		}
	}
	if got.Cleared.Matched != "" || got.Cleared.Search != "Search" {
		t.Errorf("cleared: %q %q", got.Cleared.Matched, got.Cleared.Search)
	}
	for i, f := range got.Reset.Frames {
		if f != got.Initial.Frames[i] {
			t.Errorf("after reset %+v, initially %+v", f, got.Initial.Frames[i])
		}
	}
	if got.Reset.Reset {
		t.Error("reset control still shown after reset")
	}
}

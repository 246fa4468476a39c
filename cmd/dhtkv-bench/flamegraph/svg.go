package flamegraph

import (
	"bufio"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"sort"
	"strings"

	"github.com/google/pprof/profile"
)

// Options controls SVG rendering. Zero values pick sensible defaults.
type Options struct {
	Title    string  // heading, e.g. "node-get: CPU"
	Subtitle string  // second heading line, e.g. the run parameters
	Unit     string  // unit of the values: "nanoseconds", "bytes", "count"
	Width    int     // image width in pixels (default 1200)
	MinFrac  float64 // frames narrower than this fraction of the total are dropped (default 0.001)
}

const (
	frameHeight = 16
	fontSize    = 11
	charWidth   = 6.6 // average glyph advance for fontSize in Verdana/DejaVu Sans
	padX        = 10
	headHeight  = 56
	footHeight  = 24
)

// node is one frame in the merged call tree.
type node struct {
	name     string
	value    int64
	children map[string]*node
}

func (n *node) child(name string) *node {
	if n.children == nil {
		n.children = make(map[string]*node)
	}
	c := n.children[name]
	if c == nil {
		c = &node{name: name}
		n.children[name] = c
	}
	return c
}

// sortedChildren orders siblings by name, as flamegraph.pl does, so the same
// profile always produces the same picture (the x axis is not time).
func (n *node) sortedChildren() []*node {
	out := make([]*node, 0, len(n.children))
	for _, c := range n.children {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

func buildTree(stacks []Stack) *node {
	root := &node{name: "all"}
	for _, s := range stacks {
		if s.Value <= 0 {
			continue
		}
		root.value += s.Value
		n := root
		for _, f := range s.Frames {
			n = n.child(f)
			n.value += s.Value
		}
	}
	return root
}

func depth(n *node, min int64) int {
	d := 0
	for _, c := range n.children {
		if c.value >= min {
			d = max(d, depth(c, min))
		}
	}
	return d + 1
}

// RenderProfile folds sample type idx of p and writes its flame graph. The
// unit is taken from the profile when opt.Unit is empty.
func RenderProfile(w io.Writer, p *profile.Profile, idx int, opt Options) error {
	if opt.Unit == "" {
		opt.Unit = Unit(p, idx)
	}
	return SVG(w, Fold(p, idx), opt)
}

// SVG writes a self-contained flame graph (root at the bottom, width
// proportional to value) as an SVG document with no external resources.
// Frames are labelled with their ShortName; hovering one shows its <title>:
// full name, value and percent. Opened on its own in a browser, a small
// embedded script (see script) adds click-to-zoom and a search that
// highlights matching frames; where scripts do not run (an <img> tag, a
// Markdown viewer) the picture is the same, static.
func SVG(w io.Writer, stacks []Stack, opt Options) error {
	if opt.Width <= 0 {
		opt.Width = 1200
	}
	if opt.MinFrac <= 0 {
		opt.MinFrac = 0.001
	}
	root := buildTree(stacks)
	total := root.value
	minValue := int64(math.Ceil(float64(total) * opt.MinFrac))
	levels := 1
	if total > 0 {
		levels = depth(root, minValue)
	}
	height := headHeight + levels*frameHeight + footHeight
	plotW := float64(opt.Width - 2*padX)

	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, `<?xml version="1.0" encoding="UTF-8" standalone="no"?>`+"\n")
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="%d" height="%d" viewBox="0 0 %d %d">`+"\n",
		opt.Width, height, opt.Width, height)
	fmt.Fprintf(bw, "<style>text{font-family:Verdana,'DejaVu Sans',sans-serif;font-size:%dpx;fill:#000}"+
		"g.f:hover rect{stroke:#000;stroke-width:0.5}.h{font-size:17px}.s{font-size:12px;fill:#444}"+
		".c{font-size:12px;fill:#1f4e9e;cursor:pointer}</style>\n", fontSize)
	fmt.Fprintf(bw, `<rect x="0" y="0" width="%d" height="%d" fill="#f8f8f8"/>`+"\n", opt.Width, height)
	title := opt.Title
	if title == "" {
		title = "Flame graph"
	}
	fmt.Fprintf(bw, `<text class="h" x="%d" y="24" text-anchor="middle">%s</text>`+"\n", opt.Width/2, esc(title))
	sub := fmt.Sprintf("total %s; frames under %.1f%% omitted; hover a frame for details, click to zoom", FormatValue(total, opt.Unit), 100*opt.MinFrac)
	if opt.Subtitle != "" {
		sub = opt.Subtitle + " — " + sub
	}
	fmt.Fprintf(bw, `<text class="s" x="%d" y="44" text-anchor="middle">%s</text>`+"\n", opt.Width/2, esc(sub))
	writeControls(bw, opt.Width, height, plotW)

	if total == 0 {
		fmt.Fprintf(bw, `<text x="%d" y="%d" text-anchor="middle">no samples</text>`+"\n", opt.Width/2, headHeight+frameHeight)
	} else {
		r := renderer{w: bw, total: total, min: minValue, unit: opt.Unit, scale: plotW / float64(total), baseY: float64(height - footHeight)}
		r.draw(root, 0, padX)
	}
	fmt.Fprintf(bw, "</svg>\n")
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write flame graph: %w", err)
	}
	return nil
}

type renderer struct {
	w     *bufio.Writer
	total int64
	min   int64
	unit  string
	scale float64 // pixels per unit of value
	baseY float64 // y of the bottom edge of the root frame
}

func (r *renderer) draw(n *node, level int, x float64) {
	width := float64(n.value) * r.scale
	y := r.baseY - float64(level+1)*frameHeight
	tip := fmt.Sprintf("%s (%s, %s)", n.name, FormatValue(n.value, r.unit), pct(n.value, r.total))
	// data-s carries the label for the zoom script when it is not the name.
	sn, short := ShortName(n.name), ""
	if sn != n.name {
		short = fmt.Sprintf(` data-s="%s"`, esc(sn))
	}
	fmt.Fprintf(r.w, `<g class="f"%s><title>%s</title><rect x="%.2f" y="%.0f" width="%.2f" height="%d" fill="%s" rx="2"/>`,
		short, esc(tip), x, y, width, frameHeight-1, colour(n.name))
	if label := fit(sn, width); label != "" {
		fmt.Fprintf(r.w, `<text x="%.2f" y="%.0f">%s</text>`, x+3, y+frameHeight-4, esc(label))
	}
	fmt.Fprintf(r.w, "</g>\n")
	cx := x
	for _, c := range n.sortedChildren() {
		if c.value >= r.min {
			r.draw(c, level+1, cx)
		}
		// Skipped siblings still take their share of the x axis, so the
		// widths of drawn frames stay proportional to their values.
		cx += float64(c.value) * r.scale
	}
}

// fit truncates a label (a ShortName; the tooltip has the full name) to the
// frame width; frames too narrow for three characters get no label (the
// tooltip still names them).
func fit(name string, width float64) string {
	n := int((width - 6) / charWidth)
	if n < 3 {
		return ""
	}
	r := []rune(name)
	if len(r) <= n {
		return name
	}
	return string(r[:n-2]) + ".."
}

// Package returns the Go package path of a function name as pprof prints it
// ("github.com/a/b.(*T).M" → "github.com/a/b", "runtime.mallocgc" →
// "runtime"). Type parameters are cut first because they may contain dots
// and slashes of other packages.
func Package(fn string) string {
	name := fn
	if i := strings.IndexByte(name, '['); i >= 0 {
		name = name[:i]
	}
	slash := strings.LastIndexByte(name, '/')
	dot := strings.IndexByte(name[slash+1:], '.')
	if dot < 0 {
		return name
	}
	return name[:slash+1+dot]
}

// colour derives a fill colour from the frame's package, so one package keeps
// one colour across frames, graphs and runs. Hue comes from a hash; lightness
// is kept high enough for black text to stay readable.
func colour(fn string) string {
	if fn == "all" {
		return "#d0d0d0"
	}
	h := fnv.New32a()
	h.Write([]byte(Package(fn)))
	v := h.Sum32()
	hue := float64(v % 360)
	sat := 0.55 + float64((v>>9)%20)/100
	light := 0.62 + float64((v>>17)%12)/100
	rr, gg, bb := hslToRGB(hue, sat, light)
	return fmt.Sprintf("#%02x%02x%02x", rr, gg, bb)
}

func hslToRGB(h, s, l float64) (uint8, uint8, uint8) {
	c := (1 - math.Abs(2*l-1)) * s
	hp := h / 60
	x := c * (1 - math.Abs(math.Mod(hp, 2)-1))
	var r, g, b float64
	switch {
	case hp < 1:
		r, g = c, x
	case hp < 2:
		r, g = x, c
	case hp < 3:
		g, b = c, x
	case hp < 4:
		g, b = x, c
	case hp < 5:
		r, b = x, c
	default:
		r, b = c, x
	}
	m := l - c/2
	to := func(v float64) uint8 { return uint8(math.Round((v + m) * 255)) }
	return to(r), to(g), to(b)
}

var xmlEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&apos;")

// esc escapes text for element content and attribute values, and drops
// control characters XML 1.0 forbids, so the document always parses.
func esc(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 && r != '\t' && r != '\n' && r != '\r' {
			return -1
		}
		if r == 0xFFFD || r == 0xFFFE || r == 0xFFFF {
			return -1
		}
		return r
	}, s)
	return xmlEscaper.Replace(s)
}

package main

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// The plots a report embeds are drawn with gonum.org/v1/plot and saved in
// the format the file name's extension names (.svg in the reports; .png
// works too). Plot sizes are fixed so that reports of one run line up.
const (
	plotWidth  = 7 * vg.Inch
	plotHeight = 4.2 * vg.Inch
)

// PercentilePoint is one row of a latency distribution: the latency below
// which Percentile percent of the requests completed.
type PercentilePoint struct {
	Percentile float64 // in (0, 100)
	Latency    time.Duration
}

// LatencyCurve is one named latency distribution, points in ascending
// percentile order.
type LatencyCurve struct {
	Label  string
	Points []PercentilePoint
}

// CurveFromResult is the latency curve of a dhtkv-load result: its whole
// percentile spectrum (wrk2's rows, from 0% up), or, for a result without
// one, its summary (CurveFromSummary). The 100% row is left out, as there.
func CurveFromResult(label string, r *LoadResult) LatencyCurve {
	if len(r.Spectrum) == 0 {
		return CurveFromSummary(label, r.Latency)
	}
	c := LatencyCurve{Label: label}
	for _, s := range r.Spectrum {
		if s.Percentile >= 0 && s.Percentile < 100 {
			c.Points = append(c.Points, PercentilePoint{Percentile: s.Percentile, Latency: time.Duration(s.US) * time.Microsecond})
		}
	}
	return c
}

// denseCurve is the number of points above which a curve is drawn as a
// line alone: markers on every row of a spectrum would blot it out.
const denseCurve = 20

// CurveFromSummary turns dhtkv-load's HdrHistogram summary into a curve.
// The maximum (p100) is left out: it has no place on a 1/(1-p) axis, and the
// report's table quotes it.
func CurveFromSummary(label string, l Latency) LatencyCurve {
	us := []struct {
		p float64
		v int64
	}{{50, l.P50}, {75, l.P75}, {90, l.P90}, {99, l.P99}, {99.9, l.P999}, {99.99, l.P9999}, {99.999, l.P99999}}
	c := LatencyCurve{Label: label}
	for _, u := range us {
		c.Points = append(c.Points, PercentilePoint{Percentile: u.p, Latency: time.Duration(u.v) * time.Microsecond})
	}
	return c
}

// percentileX maps a percentile to the HdrHistogram plot's x coordinate
// 1/(1-p): 50% → 2, 90% → 10, 99% → 100, and so on, so that each "nine"
// takes the same width on a log axis.
func percentileX(pct float64) float64 {
	return 1 / (1 - pct/100)
}

// percentileTicks labels the x axis at 50%, 90%, 99%, ... up to maxX,
// with unlabelled ticks at 0% (when minX
// reaches it: its label would run into 50%'s) and at 75%, 97.5% and the
// like between the labelled ones.
func percentileTicks(minX, maxX float64) plot.ConstantTicks {
	var ticks plot.ConstantTicks
	for _, pt := range []struct {
		p     float64
		label bool
	}{
		{0, false}, {50, true}, {75, false}, {90, true}, {97.5, false}, {99, true}, {99.75, false},
		{99.9, true}, {99.975, false}, {99.99, true}, {99.9975, false}, {99.999, true}, {99.99975, false}, {99.9999, true},
	} {
		x := percentileX(pt.p)
		if x < minX*0.9999 {
			continue
		}
		if x > maxX*1.0001 {
			break
		}
		t := plot.Tick{Value: x}
		if pt.label {
			t.Label = strconv.FormatFloat(pt.p, 'f', -1, 64) + "%"
		}
		ticks = append(ticks, t)
	}
	return ticks
}

// ms converts a duration to the plots' latency unit.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// newPlot is a plot with the reports' common layout: a title with room
// under it, axis labels, a grid and the legend at the top left.
func newPlot(title, xLabel, yLabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text, p.Title.Padding = title, vg.Points(8)
	p.X.Label.Text, p.Y.Label.Text = xLabel, yLabel
	p.Legend.Top, p.Legend.Left = true, true
	// A size under the title's, off the y axis.
	p.Legend.TextStyle.Font.Size = vg.Points(10)
	p.Legend.Padding = vg.Points(2)
	p.Legend.XOffs, p.Legend.YOffs = vg.Points(6), -vg.Points(2)
	p.Add(plotter.NewGrid())
	return p
}

// PercentilePlot writes an HdrHistogram-style latency-percentile plot of
// curves to path: x is the percentile on a log-scaled 1/(1-p) axis, y the
// latency in milliseconds from 0. A curve of more than denseCurve points (a
// spectrum) is a line, a shorter one (a summary) has a marker per point.
// Points with a percentile outside [0, 100) are skipped; a plot without
// any point is an error rather than an empty picture.
func PercentilePlot(path, title string, curves []LatencyCurve) error {
	p := newPlot(title, "percentile", "latency (ms)")
	p.X.Scale = plot.LogScale{}
	p.Y.Min = 0
	p.Y.Tick.Marker = evenTicks{}
	minX, maxX, maxY, n := math.Inf(1), 0.0, 0.0, 0
	for i, c := range curves {
		var xys plotter.XYs
		for _, pt := range c.Points {
			if pt.Percentile < 0 || pt.Percentile >= 100 {
				continue
			}
			x := percentileX(pt.Percentile)
			xys = append(xys, plotter.XY{X: x, Y: ms(pt.Latency)})
			minX, maxX, maxY = math.Min(minX, x), math.Max(maxX, x), math.Max(maxY, ms(pt.Latency))
		}
		if len(xys) == 0 {
			continue
		}
		color := plotutil.Color(i)
		if len(xys) > denseCurve {
			l, err := plotter.NewLine(xys)
			if err != nil {
				return fmt.Errorf("latency plot %s: curve %q: %w", path, c.Label, err)
			}
			l.Color, l.Width, l.Dashes = color, vg.Points(1.8), plotutil.Dashes(i)
			p.Add(l)
			p.Legend.Add(c.Label, l)
		} else {
			l, s, err := plotter.NewLinePoints(xys)
			if err != nil {
				return fmt.Errorf("latency plot %s: curve %q: %w", path, c.Label, err)
			}
			l.Color, l.Width = color, vg.Points(1.5)
			s.Color, s.Shape, s.Radius = color, plotutil.Shape(i), vg.Points(2.5)
			p.Add(l, s)
			p.Legend.Add(c.Label, l, s)
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("latency plot %s: no percentile to plot", path)
	}
	// A whole spectrum starts at 0% (x = 1); summaries at 50%.
	// Room to the right of the last point; ticks go up to half the axis's
	// end, so that a label is never cut at the picture's edge, and the
	// next "nine" past the last point is labelled when it is near.
	p.X.Min, p.X.Max = math.Min(minX, percentileX(40)), maxX*3
	p.Y.Max = maxY * 1.05 // the highest point off the frame
	p.X.Tick.Marker = percentileTicks(p.X.Min, p.X.Max/2)
	return save(p, path)
}

// ThroughputPlot writes the saturation search's steps to path as throughput
// (achieved rps) against p99 latency on a log axis: passing and failing
// constant-rate steps, the closed-loop probe, the p99 threshold and, when
// one was found, the saturation point. Steps without a result are skipped;
// a search without any usable step is an error.
func ThroughputPlot(path, title string, s *Search, threshold time.Duration) error {
	if s == nil {
		return fmt.Errorf("throughput plot %s: no search", path)
	}
	type pt struct{ rate, x, y float64 }
	var pass, fail, closed plotter.XYs
	var ladder []pt
	for _, st := range s.Steps {
		if st.Run == nil || st.Run.Result == nil {
			continue
		}
		r := st.Run.Result
		xy := plotter.XY{X: r.ThroughputRPS, Y: math.Max(ms(time.Duration(r.Latency.P99)*time.Microsecond), 0.001)}
		switch {
		case st.Rate == 0:
			closed = append(closed, xy)
			continue
		case st.Pass:
			pass = append(pass, xy)
		default:
			fail = append(fail, xy)
		}
		ladder = append(ladder, pt{st.Rate, xy.X, xy.Y})
	}
	if len(ladder)+len(closed) == 0 {
		return fmt.Errorf("throughput plot %s: no step with a result", path)
	}

	p := newPlot(title, "throughput achieved (requests/s)", "p99 latency (ms)")
	p.Y.Scale = plot.LogScale{}
	p.X.Min = 0

	// The curve joins the constant-rate steps in target-rate order; retries
	// at one rate appear as separate points on it.
	slices.SortStableFunc(ladder, func(a, b pt) int { return cmpFloat(a.rate, b.rate) })
	if len(ladder) > 1 {
		xys := make(plotter.XYs, len(ladder))
		for i, l := range ladder {
			xys[i] = plotter.XY{X: l.x, Y: l.y}
		}
		line, err := plotter.NewLine(xys)
		if err != nil {
			return fmt.Errorf("throughput plot %s: %w", path, err)
		}
		line.Color, line.Width = color.Gray{Y: 120}, vg.Points(1)
		p.Add(line)
	}
	green, red, blue := color.RGBA{R: 0x1b, G: 0x9e, B: 0x4b, A: 255}, color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 255}, color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 255}
	for _, set := range []struct {
		xys   plotter.XYs
		label string
		c     color.Color
		shape draw.GlyphDrawer
	}{
		{pass, "step passed", green, draw.CircleGlyph{}},
		{fail, "step failed", red, draw.CrossGlyph{}},
		{closed, "closed loop (upper bound)", blue, draw.TriangleGlyph{}},
	} {
		if len(set.xys) == 0 {
			continue
		}
		sc, err := plotter.NewScatter(set.xys)
		if err != nil {
			return fmt.Errorf("throughput plot %s: %w", path, err)
		}
		sc.Color, sc.Shape, sc.Radius = set.c, set.shape, vg.Points(3.5)
		p.Add(sc)
		p.Legend.Add(set.label, sc)
	}

	// The y range must include the threshold so its line is drawn; the
	// log axis needs a positive minimum.
	lo, hi := ms(threshold), ms(threshold)
	maxX := 0.0
	for _, xys := range []plotter.XYs{pass, fail, closed} {
		for _, xy := range xys {
			lo, hi, maxX = math.Min(lo, xy.Y), math.Max(hi, xy.Y), math.Max(maxX, xy.X)
		}
	}
	// The points take the lower 70% of the height, the legend the top:
	// the closed loop's point is often the highest, and at the right.
	p.Y.Min = lo / 1.5
	p.Y.Max = math.Exp(math.Log(p.Y.Min) + math.Log(hi*1.5/p.Y.Min)/0.7)
	p.Y.Tick.Marker = logTicks{}
	p.X.Max = maxX * 1.08
	p.X.Tick.Marker = inside{evenTicks{}}
	if threshold > 0 {
		l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: ms(threshold)}, {X: p.X.Max, Y: ms(threshold)}})
		if err != nil {
			return fmt.Errorf("throughput plot %s: %w", path, err)
		}
		l.Color, l.Dashes = red, []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(l)
		p.Legend.Add("p99 threshold "+fmtDur(threshold), l)
	}
	if s.Saturation > 0 {
		// Up to the points' top, not through the legend above them.
		l, err := plotter.NewLine(plotter.XYs{{X: s.Saturation, Y: p.Y.Min}, {X: s.Saturation, Y: hi * 1.5}})
		if err != nil {
			return fmt.Errorf("throughput plot %s: %w", path, err)
		}
		l.Color, l.Dashes = green, []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("saturation point %.0f rps", s.Saturation), l)
	}
	return save(p, path)
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// logTicks labels a log axis at 1, 2 and 5 times each power of ten, or,
// when that leaves fewer than three labels (a range narrower than a
// decade), at evenly spaced values, or, over more than three decades, where
// those labels would crowd each other, at the powers of ten only, as
// plot.LogTicks always does.
type logTicks struct{}

// Ticks implements plot.Ticker; min and max must be positive.
func (logTicks) Ticks(min, max float64) []plot.Tick {
	var ticks []plot.Tick
	labelled := 0
	wide := max/min > 1e3*1.0001
	for e := math.Floor(math.Log10(min)); math.Pow10(int(e)) <= max; e++ {
		base := math.Pow10(int(e))
		for m := 1.0; m <= 9; m++ {
			v := m * base
			if v < min || v > max {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || (!wide && (m == 2 || m == 5)) {
				t.Label = strconv.FormatFloat(v, 'g', -1, 64)
				labelled++
			}
			ticks = append(ticks, t)
		}
	}
	if labelled < 3 {
		// Under a decade or so: evenly spaced values read better, and
		// the multiples of the powers of ten leave gaps (none between
		// 10 and 20).
		return evenTicks{}.Ticks(min, max)
	}
	return ticks
}

// evenTicks labels [min, max] at the multiples of the largest step of 1,
// 2 or 5 times a power of ten that gives at least 4 labels, without
// trailing zeros: plot.DefaultTicks may give two labels, "0.00" and
// "25000.00".
type evenTicks struct{}

// Ticks implements plot.Ticker.
func (evenTicks) Ticks(min, max float64) []plot.Tick {
	if !(max > min) {
		return nil
	}
	count := func(step float64) int { return int(math.Floor(max/step) - math.Ceil(min/step) + 1) }
	e := math.Floor(math.Log10(max - min))
	step := math.Pow10(int(e))
	for _, m := range []float64{5, 2, 1, 0.5, 0.2, 0.1} {
		if step = m * math.Pow10(int(e)); count(step) >= 4 {
			break
		}
	}
	var ticks []plot.Tick
	for i := math.Ceil(min / step); i*step <= max; i++ {
		v := i * step
		ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', 12, 64)}) // 12 digits: 0.06, not 0.06000000000000001
	}
	return ticks
}

// inside drops the label of a tick so close to the axis's maximum that
// the label, centred on it, would be cut at the picture's right edge.
type inside struct{ plot.Ticker }

// Ticks implements plot.Ticker.
func (t inside) Ticks(min, max float64) []plot.Tick {
	ticks := t.Ticker.Ticks(min, max)
	for i := range ticks {
		if ticks[i].Value > max-0.04*(max-min) {
			ticks[i].Label = ""
		}
	}
	return ticks
}

// save writes p to path through a temporary file, so a failed render never
// leaves a truncated picture that a report would link.
func save(p *plot.Plot, path string) error {
	return saveDrawing(path, plotWidth, plotHeight, p.Draw)
}

// saveDrawing writes a picture of width × height that drawFn draws to
// path, as save does; drawFn may draw several plots.
func saveDrawing(path string, width, height vg.Length, drawFn func(draw.Canvas)) error {
	ext := filepath.Ext(path)
	if ext == "" {
		return fmt.Errorf("save plot %s: no extension to choose a format", path)
	}
	var wt io.WriterTo
	var c vg.CanvasSizer
	switch ext {
	case ".svg":
		sc := vgsvg.New(width, height)
		c, wt = sc, sc
	case ".png":
		ic := vgimg.PngCanvas{Canvas: vgimg.New(width, height)}
		c, wt = ic, ic
	default:
		return fmt.Errorf("save plot %s: unsupported format %s (svg or png)", path, ext)
	}
	// A margin, so that text measured with gonum's fonts and drawn by a
	// viewer with others is not cut at the picture's edge.
	m := vg.Points(6)
	drawFn(draw.Crop(draw.New(c), m, -m, m, -m))
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("save plot: %w", err)
	}
	if _, err := wt.WriteTo(f); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("save plot %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("save plot %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("save plot: %w", err)
	}
	return nil
}

// PlotArtifacts are the plot files of one scenario, relative to the report
// directory; "" when the data for that plot is missing.
type PlotArtifacts struct {
	Latency    string   // <scenario>-latency.svg: percentiles of the fixed-rate run
	Throughput string   // <scenario>-throughput.svg: the saturation search's steps
	Timeline   string   // <scenario>-timeline.svg: the fixed-rate run second by second
	Notes      []string // why a plot is missing
}

// renderPlots draws a scenario's plots into outDir. The latency plot shows
// the fixed-rate run and, beside it, the ceiling's fixed-rate run for the
// same workload when there is one. A plot whose data is missing is not
// drawn and any file of that name from an earlier run is removed, so a
// report never shows another run's picture. Only a failure to write is an
// error.
func renderPlots(outDir string, r *ScenarioResult) (*PlotArtifacts, error) {
	a := &PlotArtifacts{}
	latName, thrName := r.Name+"-latency.svg", r.Name+"-throughput.svg"
	latPath, thrPath := filepath.Join(outDir, latName), filepath.Join(outDir, thrName)

	var curves []LatencyCurve
	if r.Fixed != nil && r.Fixed.Result != nil {
		res := r.Fixed.Result
		curves = append(curves, CurveFromResult(fmt.Sprintf("%s at %s rps", r.Name, rps(res.Rate)), res))
	}
	if len(curves) > 0 && r.Ceiling != nil && r.Ceiling.Fixed != nil {
		c := r.Ceiling.Fixed
		curves = append(curves, CurveFromResult(fmt.Sprintf("%s at %s rps", r.Ceiling.Scenario, rps(c.Rate)), c))
	}
	if len(curves) == 0 {
		a.Notes = append(a.Notes, "no latency plot: there is no fixed-rate result")
		_ = os.Remove(latPath)
	} else {
		title := fmt.Sprintf("%s: latency by percentile, fixed-rate run", r.Name)
		if err := PercentilePlot(latPath, title, curves); err != nil {
			return a, err
		}
		a.Latency = latName
	}

	if !hasResult(r.Search) {
		a.Notes = append(a.Notes, "no throughput plot: the saturation search has no completed step")
		_ = os.Remove(thrPath)
	} else {
		title := fmt.Sprintf("%s: saturation search, p99 against throughput", r.Name)
		if err := ThroughputPlot(thrPath, title, r.Search, r.Threshold); err != nil {
			return a, err
		}
		a.Throughput = thrName
	}

	name, note, err := renderTimeline(outDir, r)
	if err != nil {
		return a, err
	}
	a.Timeline = name
	if note != "" {
		a.Notes = append(a.Notes, note)
	}
	return a, nil
}

// hasResult reports whether any step of s has a load result to plot.
func hasResult(s *Search) bool {
	if s == nil {
		return false
	}
	for _, st := range s.Steps {
		if st.Run != nil && st.Run.Result != nil {
			return true
		}
	}
	return false
}

package main

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/dhtkv/dhtkv/internal/loadgen"
)

// The timeline of a fixed-rate run: `dhtkv-load --timeline` adds the run
// second by second to its JSON (requests, failures, p50, p99 and max of
// the requests due in each second), and the report draws it, so that a
// stall shows at its time instead of vanishing into the run's percentiles.

// TimelinePoint is one second of a run, as dhtkv-load reports it.
type TimelinePoint = loadgen.TimelinePoint

// checkTimeline rejects a timeline that dhtkv-load cannot have written:
// it has a point for every second from 0 in order, and no negative count
// or latency, nor more failures than requests. A second without requests
// (a full stall) is a point of zeros.
func checkTimeline(tl []TimelinePoint) error {
	for i, p := range tl {
		switch {
		case p.Second != i:
			return fmt.Errorf("timeline point %d is second %d: seconds must run 0, 1, 2, ... without gaps", i, p.Second)
		case p.Requests < 0 || p.Failures < 0 || p.P50US < 0 || p.P99US < 0 || p.MaxUS < 0:
			return fmt.Errorf("timeline second %d: negative count or latency", p.Second)
		case p.Failures > p.Requests:
			return fmt.Errorf("timeline second %d: %d failures of %d requests", p.Second, p.Failures, p.Requests)
		}
	}
	return nil
}

// timelineHeight is the height of the timeline picture: two panels, each
// about as tall as half of the other plots.
const timelineHeight = 6.4 * vg.Inch

// TimelinePlot writes a run's timeline to path: on top, p50, p99 and the
// maximum latency of each second in milliseconds on a log axis; below,
// the requests due in each second (and the failed ones, when any), with
// the target rate when rate > 0. window is the measured window: a last
// second cut short by it has its requests scaled to a per-second rate, so
// it is not drawn as a drop. Seconds without requests have no latency and
// leave a gap in the latency lines. A timeline without any request is an
// error rather than an empty picture.
func TimelinePlot(path, title string, tl []TimelinePoint, window time.Duration, rate float64) error {
	if err := checkTimeline(tl); err != nil {
		return fmt.Errorf("timeline plot %s: %w", path, err)
	}
	if timelineRequests(tl) == 0 {
		return fmt.Errorf("timeline plot %s: no request in the timeline", path)
	}
	// dhtkv-load's timeline ends with the last second that recorded a
	// request; the window's seconds after it had none.
	tl = slices.Clip(tl)
	for n := int(math.Ceil(window.Seconds())); len(tl) < n; {
		tl = append(tl, TimelinePoint{Second: len(tl)})
	}
	end := float64(len(tl))
	if window > 0 {
		end = math.Min(end, window.Seconds())
	}
	// width is how much of second i the window covers.
	width := func(i int) float64 { return math.Max(math.Min(1, end-float64(i)), 1e-3) }

	lat := newPlot(title, "", "latency (ms)")
	if err := addLatencyLines(lat, tl); err != nil {
		return fmt.Errorf("timeline plot %s: %w", path, err)
	}
	thr := newPlot("", "seconds into the measured run (by intended send time)", "requests/s")
	if err := addThroughputLines(thr, tl, width, rate); err != nil {
		return fmt.Errorf("timeline plot %s: %w", path, err)
	}
	for _, p := range []*plot.Plot{lat, thr} {
		p.X.Min, p.X.Max = 0, float64(len(tl))
		p.X.Tick.Marker = evenTicks{}
	}
	// Both panels' data areas line up, so a second is at the same x.
	return saveDrawing(path, plotWidth, timelineHeight, func(c draw.Canvas) {
		tiles := draw.Tiles{Rows: 2, Cols: 1, PadY: vg.Points(4)}
		cs := plot.Align([][]*plot.Plot{{lat}, {thr}}, tiles, c)
		lat.Draw(cs[0][0])
		thr.Draw(cs[1][0])
	})
}

// addLatencyLines draws max, p99 and p50 per second, a point at the middle
// of each second, with markers unless the run is long enough for them to
// blot the lines out.
func addLatencyLines(p *plot.Plot, tl []TimelinePoint) error {
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = logTicks{}
	lo, hi := math.Inf(1), 0.0
	for i, s := range []struct {
		label string
		v     func(TimelinePoint) int64
	}{
		{"max", func(t TimelinePoint) int64 { return t.MaxUS }},
		{"p99", func(t TimelinePoint) int64 { return t.P99US }},
		{"p50", func(t TimelinePoint) int64 { return t.P50US }},
	} {
		// Consecutive seconds with a latency form one segment; a second
		// without requests breaks the line.
		var segs []plotter.XYs
		var cur plotter.XYs
		for _, t := range tl {
			v := s.v(t)
			if t.Requests == 0 || v <= 0 {
				if len(cur) > 0 {
					segs, cur = append(segs, cur), nil
				}
				continue
			}
			y := float64(v) / 1000
			cur = append(cur, plotter.XY{X: float64(t.Second) + 0.5, Y: y})
			lo, hi = math.Min(lo, y), math.Max(hi, y)
		}
		if len(cur) > 0 {
			segs = append(segs, cur)
		}
		c := plotutil.Color(i)
		for j, seg := range segs {
			l, sc, err := plotter.NewLinePoints(seg)
			if err != nil {
				return fmt.Errorf("%s line: %w", s.label, err)
			}
			l.Color, l.Width = c, vg.Points(1.5)
			sc.Color, sc.Shape, sc.Radius = c, plotutil.Shape(i), vg.Points(2.5)
			if len(tl) > denseCurve {
				sc.Radius = 0
			}
			p.Add(l, sc)
			if j == 0 {
				p.Legend.Add(s.label, l, sc)
			}
		}
	}
	if hi == 0 {
		return errors.New("no second with a latency")
	}
	// The lines take the lower 75% of the height, the legend the top.
	p.Y.Min = lo / 1.5
	p.Y.Max = math.Exp(math.Log(p.Y.Min) + math.Log(hi*1.5/p.Y.Min)/0.75)
	return nil
}

// addThroughputLines draws the requests due in each second as steps, the
// failed ones in red when there are any, and the target rate dashed.
func addThroughputLines(p *plot.Plot, tl []TimelinePoint, width func(int) float64, rate float64) error {
	steps := func(v func(TimelinePoint) int64) plotter.XYs {
		xys := make(plotter.XYs, 0, len(tl)+1)
		for i, t := range tl {
			xys = append(xys, plotter.XY{X: float64(t.Second), Y: float64(v(t)) / width(i)})
		}
		last := xys[len(xys)-1]
		return append(xys, plotter.XY{X: last.X + width(len(tl)-1), Y: last.Y})
	}
	hi := rate
	red := color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 255}
	var failures int64
	for _, t := range tl {
		failures += t.Failures
	}
	for _, s := range []struct {
		label string
		v     func(TimelinePoint) int64
		c     color.Color
		skip  bool
	}{
		{"requests per second", func(t TimelinePoint) int64 { return t.Requests }, plotutil.Color(3), false},
		{"failed per second", func(t TimelinePoint) int64 { return t.Failures }, red, failures == 0},
	} {
		if s.skip {
			continue
		}
		xys := steps(s.v)
		l, err := plotter.NewLine(xys)
		if err != nil {
			return fmt.Errorf("%s: %w", s.label, err)
		}
		l.StepStyle, l.Color, l.Width = plotter.PostStep, s.c, vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(s.label, l)
		for _, xy := range xys {
			hi = math.Max(hi, xy.Y)
		}
	}
	if rate > 0 {
		l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: rate}, {X: float64(len(tl)), Y: rate}})
		if err != nil {
			return fmt.Errorf("target rate: %w", err)
		}
		l.Color, l.Dashes = color.Gray{Y: 110}, []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("target %s rps", rps(rate)), l)
	}
	// From 0, with the top quarter for the legend.
	p.Y.Min, p.Y.Max = 0, hi/0.75
	p.Y.Tick.Marker = evenTicks{}
	return nil
}

// renderTimeline draws the timeline of r's fixed-rate run into outDir as
// <scenario>-timeline.svg and returns its name, or "" and why there is
// none; a stale picture of that name is then removed, as renderPlots does.
func renderTimeline(outDir string, r *ScenarioResult) (name, note string, err error) {
	name = r.Name + "-timeline.svg"
	path := filepath.Join(outDir, name)
	if r.Fixed == nil || r.Fixed.Result == nil || len(r.Fixed.Result.Timeline) == 0 {
		_ = os.Remove(path)
		return "", "no timeline plot: the fixed-rate run has no timeline", nil
	}
	res := r.Fixed.Result
	if timelineRequests(res.Timeline) == 0 {
		_ = os.Remove(path)
		return "", "no timeline plot: no request in the fixed-rate run's timeline", nil
	}
	title := fmt.Sprintf("%s: fixed-rate run at %s rps, second by second", r.Name, rps(res.Rate))
	if err := TimelinePlot(path, title, res.Timeline, r.Fixed.Spec.Duration, res.Rate); err != nil {
		return "", "", err
	}
	return name, "", nil
}

func timelineRequests(tl []TimelinePoint) int64 {
	var n int64
	for _, p := range tl {
		n += p.Requests
	}
	return n
}

// timelineSection is the report's text around the timeline picture.
func timelineSection(s *ScenarioResult) string {
	if s.Plots == nil || s.Plots.Timeline == "" {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "[![latency and throughput second by second](%s)](%s)\n\n", s.Plots.Timeline, s.Plots.Timeline)
	b.WriteString("The fixed-rate run second by second (`dhtkv-load --timeline`): p50, p99 and the maximum latency of each second on a log scale, and the requests per second below. ")
	b.WriteString("Latency is measured from each request's intended send time on the constant-rate schedule, not from when it was actually sent, and a request counts in the second it was due: ")
	b.WriteString("a stall shows at its time, as the latency of every request queued behind it. ")
	b.WriteString("The requests per second are counted the same way, by the second they were due, so at a constant rate they stay at the target unless requests were never sent or failed: a slow server shows above, as latency, not as a dip below. ")
	b.WriteString("A second's percentiles come from a coarse histogram (within 10%); the table above has the run's exact ones.\n\n")
	return b.String()
}

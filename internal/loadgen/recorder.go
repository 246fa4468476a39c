package loadgen

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/valyala/fasthttp"
)

// Histogram bounds: microsecond resolution from 1µs, 3 significant digits,
// as wrk2 does, up to the longest latency a run can measure: on a
// constant-rate schedule latency runs from the intended send time, so a
// request due at the start of the window and sent at the end of the drain
// has waited up to Duration + Drain before its Timeout began.
const (
	histMinUS  = 1
	histMaxUS  = int64((2*MaxDuration + MaxTimeout) / time.Microsecond)
	histDigits = 3
)

func newHistogram() *hdrhistogram.Histogram {
	return hdrhistogram.New(histMinUS, histMaxUS, histDigits)
}

// errKind classifies transport failures the way wrk reports socket errors,
// so that a dead or overloaded server is visible instead of being folded into
// the latency figures.
type errKind uint8

const (
	errConnect errKind = iota
	errTimeout
	errOther
	numErrKinds
)

// classifyErr maps a fasthttp client error to its kind. A dial that times out
// is a connect error (as in wrk): the request never reached the server.
func classifyErr(err error) errKind {
	var dialErr *fasthttp.ErrDialWithUpstream
	var netErr net.Error
	switch {
	case errors.As(err, &dialErr), errors.Is(err, fasthttp.ErrDialTimeout),
		errors.Is(err, syscall.ECONNREFUSED):
		return errConnect
	case errors.Is(err, fasthttp.ErrTimeout), errors.Is(err, os.ErrDeadlineExceeded),
		errors.As(err, &netErr) && netErr.Timeout():
		return errTimeout
	default:
		return errOther
	}
}

// maxStatus bounds the status array: any three-digit code fits.
const maxStatus = 1000

// recorder accumulates one worker's results. It is owned by a single
// goroutine, so the hot path takes no lock; recorders are merged once the
// workers have stopped.
type recorder struct {
	hist     *hdrhistogram.Histogram
	status   [maxStatus]int64
	errs     [numErrKinds]int64
	errText  [numErrKinds]string // the first error of each kind, for vegeta's error set
	requests int64
	// Body bytes of the answered requests, received and sent, as vegeta
	// counts them (headers excluded).
	bytesIn, bytesOut int64
	// first and last are the earliest and latest start (the time latency
	// is measured from) of a recorded request, end the latest end.
	first, last, end time.Time
	// timeline, when kept (Config.Timeline), is the run second by second.
	timeline *timeline
	// mark and marked, with Config.Mark: the requests of its window.
	mark   *Mark
	marked *marked
	// ops, for a mixed workload: the latency of each operation apart.
	ops *byOp
}

func newRecorder() *recorder {
	return &recorder{hist: newHistogram()}
}

// keepTimeline makes r keep a timeline from origin (the start of the
// measured window).
func (r *recorder) keepTimeline(origin time.Time) { r.timeline = &timeline{origin: origin} }

// keepMarked makes r sum up the requests of m's window apart.
func (r *recorder) keepMarked(m *Mark) { r.mark, r.marked = m, &marked{} }

// keepByOp makes r keep the latency of each operation apart, in the run
// and in a marked window.
func (r *recorder) keepByOp() { r.ops = &byOp{} }

// record accounts for one finished request of o, started at start (sent,
// or due on a constant-rate schedule) and ended at end. Responses of any
// status and transport errors enter the histogram, but a failed connect:
// its near-zero "latency" (an instant refusal) would flatter it, and the
// request reached no server. A request that waited and then lost its
// connection (a node killed, a proxy cutting it) waited as long as any
// answer, and leaving it out would hide the wait.
func (r *recorder) record(o op, status int, err error, start, end time.Time) {
	r.requests++
	if r.first.IsZero() || start.Before(r.first) {
		r.first = start
	}
	if start.After(r.last) {
		r.last = start
	}
	if end.After(r.end) {
		r.end = end
	}
	latency := end.Sub(start)
	var sec *second
	if r.timeline != nil {
		if sec = r.timeline.at(start); sec != nil {
			sec.requests++
		}
	}
	var in *marked
	if r.mark != nil && r.mark.Holds(start) {
		in = r.marked
		in.requests++
		if in.hist == nil {
			in.hist = newHistogram()
		}
	}
	// The latencies the run's histogram takes (see below).
	timed := err == nil && status >= 0 && status < maxStatus || err != nil && classifyErr(err) != errConnect
	if timed && r.ops != nil {
		r.ops.add(o, clampUS(latency))
		if in != nil {
			if in.ops == nil {
				in.ops = &byOp{}
			}
			in.ops.add(o, clampUS(latency))
		}
	}
	if sec != nil || in != nil {
		failed := err != nil || status < 200 || status > 299
		if sec != nil {
			if failed {
				sec.failures++
			}
			if timed {
				_ = sec.hist.RecordValue(clampUS(latency))
			}
		}
		if in != nil {
			if failed {
				in.failures++
			}
			if timed {
				_ = in.hist.RecordValue(clampUS(latency))
			}
		}
	}
	if err != nil {
		k := classifyErr(err)
		if r.errs[k] == 0 {
			r.errText[k] = err.Error()
		}
		r.errs[k]++
		if k != errConnect {
			r.recordLatency(latency)
		}
		return
	}
	if status < 0 || status >= maxStatus {
		if r.errs[errOther] == 0 {
			r.errText[errOther] = fmt.Sprintf("invalid HTTP status %d", status)
		}
		r.errs[errOther]++ // not an HTTP status: a protocol error
		return
	}
	r.status[status]++
	r.recordLatency(latency)
}

// recordUnsent accounts for a constant-rate slot due at intended that was
// never sent: the run gave it up at gaveUp (the drain's end, or the run's
// interruption). It waited at least gaveUp - intended, and that lower
// bound enters the run's histogram, its second's and the marked window's,
// so a stall that outlasts the drain shows in the percentiles instead of
// leaving them to the requests sent before it (coordinated omission). It
// is counted apart (Result.Unsent, TimelinePoint.Unsent,
// MarkedWindow.Unsent), not as a request.
func (r *recorder) recordUnsent(intended, gaveUp time.Time) {
	us := clampUS(max(gaveUp.Sub(intended), 0))
	_ = r.hist.RecordValue(us)
	if r.timeline != nil {
		if sec := r.timeline.at(intended); sec != nil {
			sec.unsent++
			_ = sec.hist.RecordValue(us)
		}
	}
	if r.mark != nil && r.mark.Holds(intended) {
		in := r.marked
		if in.hist == nil {
			in.hist = newHistogram()
		}
		in.unsent++
		_ = in.hist.RecordValue(us)
	}
}

// recordBytes adds an answered request's body bytes.
func (r *recorder) recordBytes(in, out int) {
	r.bytesIn += int64(in)
	r.bytesOut += int64(out)
}

func (r *recorder) recordLatency(d time.Duration) {
	_ = r.hist.RecordValue(clampUS(d)) // cannot fail: clamped to the tracked range
}

// clampUS is d in microseconds within the histograms' tracked range.
func clampUS(d time.Duration) int64 {
	return min(max(d.Microseconds(), histMinUS), histMaxUS)
}

// merge adds o's counts into r.
func (r *recorder) merge(o *recorder) {
	r.hist.Merge(o.hist)
	for i, n := range o.status {
		r.status[i] += n
	}
	for i, n := range o.errs {
		if r.errText[i] == "" {
			r.errText[i] = o.errText[i]
		}
		r.errs[i] += n
	}
	r.requests += o.requests
	if o.timeline != nil {
		if r.timeline == nil {
			r.timeline = &timeline{origin: o.timeline.origin}
		}
		r.timeline.merge(o.timeline)
	}
	if o.marked != nil {
		if r.marked == nil {
			r.keepMarked(o.mark)
		}
		r.marked.merge(o.marked)
	}
	if o.ops != nil {
		if r.ops == nil {
			r.keepByOp()
		}
		r.ops.merge(o.ops)
	}
	r.bytesIn += o.bytesIn
	r.bytesOut += o.bytesOut
	if !o.first.IsZero() && (r.first.IsZero() || o.first.Before(r.first)) {
		r.first = o.first
	}
	if o.last.After(r.last) {
		r.last = o.last
	}
	if o.end.After(r.end) {
		r.end = o.end
	}
}

// failures is the number of requests that got no 2xx answer: non-2xx
// responses and transport errors.
func (r *recorder) failures() int64 {
	n := r.errs[errConnect] + r.errs[errTimeout] + r.errs[errOther]
	for code, c := range r.status {
		if code < 200 || code > 299 {
			n += c
		}
	}
	return n
}

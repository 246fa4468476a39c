package loadgen

import "github.com/HdrHistogram/hdrhistogram-go"

// byOp is the latency of a mixed workload's GETs and PUTs apart
// (Result.LatencyByOp): a mix's p99 sits near its PUTs' p90, so its
// figure alone cannot say which of the two a change or a mechanism slowed.
// A histogram is made with its operation's first request.
type byOp [opDelete]*hdrhistogram.Histogram

// add records latency us of one request of o (a DELETE is not split out).
func (b *byOp) add(o op, us int64) {
	if o >= opDelete {
		return
	}
	if b[o] == nil {
		b[o] = newHistogram()
	}
	_ = b[o].RecordValue(us) // cannot fail: clamped by the caller
}

func (b *byOp) merge(o *byOp) {
	for i, h := range o {
		if h == nil {
			continue
		}
		if b[i] == nil {
			b[i] = newHistogram()
		}
		b[i].Merge(h)
	}
}

// summaries is each operation's summary, keyed "get" and "put"; nil when
// b is nil (a workload that is not a mix).
func (b *byOp) summaries() map[string]LatencySummary {
	if b == nil {
		return nil
	}
	out := map[string]LatencySummary{}
	for i, h := range b {
		if h != nil {
			out[opNames[i]] = summarize(h)
		}
	}
	return out
}

// opNames are byOp's operations' names in the JSON.
var opNames = [opDelete]string{opGet: "get", opPut: "put"}

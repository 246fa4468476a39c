package loadtest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// MaxFill bounds --fill so that a typo cannot start an hours-long preload.
const MaxFill = 100_000_000

// FillResult summarises a fill.
type FillResult struct {
	Keys    int64         // PUTs sent
	Elapsed time.Duration // wall time of the fill
	Non2xx  int64
	Errors  ErrorCounts
}

// Rate is the achieved fill rate in keys per second.
func (f FillResult) Rate() float64 {
	if f.Elapsed <= 0 {
		return 0
	}
	return float64(f.Keys) / f.Elapsed.Seconds()
}

// Fill PUTs keys k0..k(n-1) exactly once each, with cfg's value size,
// ack/from, targets and connections, so that a following GET run over the
// same keyspace hits. Keys are handed out from a shared counter, so workers
// never write the same key twice. It returns an error if any PUT did not get
// a 2xx answer: a partly filled store would make the next run misleading.
func Fill(ctx context.Context, cfg Config, n int64) (FillResult, error) {
	if n <= 0 || n > MaxFill {
		return FillResult{}, fmt.Errorf("fill %d: must be in [1, %d]", n, MaxFill)
	}
	if err := cfg.Validate(); err != nil {
		return FillResult{}, err
	}
	workers, err := newWorkers(&cfg, seedOf(&cfg))
	if err != nil {
		return FillResult{}, fmt.Errorf("fill: set up workers: %w", err)
	}
	defer func() {
		for _, w := range workers {
			w.release()
		}
	}()

	var next atomic.Int64
	done := ctx.Done()
	start := time.Now()
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				k := next.Add(1) - 1
				if k >= n {
					return
				}
				sent := time.Now()
				status, err := w.do(opPut, w.gen.uriFor(uint64(k)))
				w.rec.record(status, err, time.Since(sent))
			}
		})
	}
	wg.Wait()

	total := newRecorder()
	for _, w := range workers {
		total.merge(w.rec)
	}
	res := FillResult{
		Keys:    total.requests,
		Elapsed: time.Since(start),
		Errors: ErrorCounts{
			Connect: total.errs[errConnect],
			Timeout: total.errs[errTimeout],
			Other:   total.errs[errOther],
		},
	}
	for code, c := range total.status {
		if code < 200 || code > 299 {
			res.Non2xx += c
		}
	}
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("fill interrupted after %d of %d keys: %w", res.Keys, n, err)
	}
	if failed := total.failures(); failed > 0 {
		return res, fmt.Errorf("fill: %d of %d PUTs failed (non-2xx %d, connect %d, timeout %d, other %d)",
			failed, n, res.Non2xx, res.Errors.Connect, res.Errors.Timeout, res.Errors.Other)
	}
	return res, nil
}

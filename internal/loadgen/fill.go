package loadgen

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// MaxFill bounds --fill so that a typo cannot start an hours-long preload.
const MaxFill = 100_000_000

// FillResult summarises a fill.
type FillResult struct {
	Keys    int64         // keys written (or given up on)
	Elapsed time.Duration // wall time of the fill
	Retried int64         // PUTs sent again after a 503, 504 or timeout
	Non2xx  int64         // keys whose last attempt was not a 2xx
	Errors  ErrorCounts   // keys whose last attempt failed at the HTTP level
}

// fillAttempts is how many times Fill tries one key. A cluster at a fill's
// closed-loop saturation may answer a few PUTs 504 (fewer than ack
// replicas answered within its replica timeout), 503, or not in time; a
// PUT of the same key and value again is harmless, and a fill that gives
// up on the first one would leave the keyspace partly filled.
const fillAttempts = 3

// retryable reports a PUT outcome worth another attempt.
func retryable(status int, err error) bool {
	if err != nil {
		return classifyErr(err) == errTimeout
	}
	return status == fasthttp.StatusServiceUnavailable || status == fasthttp.StatusGatewayTimeout
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
// never write the same key twice, except that a PUT answered 503 or 504 or
// timed out is sent again (up to fillAttempts in all). It returns an error
// if any key did not get a 2xx answer in the end: a partly filled store
// would make the next run misleading.
func Fill(ctx context.Context, cfg Config, n int64) (FillResult, error) {
	return pass(ctx, cfg, n, opPut)
}

// ReadAll GETs keys k0..k(n-1) exactly once each, with cfg's ack/from,
// targets and connections, so that the read caches of the replicas it
// reaches hold them before a measured GET run: a random GET run warms a
// cache only slowly (after as many reads as keys it holds about 63% of
// them) and a cluster's misses, which read the store, would be charged
// to its quorum reads. With ack and from equal to the replication factor
// every replica reads every key. A 404 is an answer like a 200 (the key
// was never written); the retries and failures are Fill's.
func ReadAll(ctx context.Context, cfg Config, n int64) (FillResult, error) {
	return pass(ctx, cfg, n, opGet)
}

// pass sends o for keys k0..k(n-1) once each (see Fill).
func pass(ctx context.Context, cfg Config, n int64, o op) (FillResult, error) {
	name := "fill"
	if o == opGet {
		name = "read-all"
	}
	if n <= 0 || n > MaxFill {
		return FillResult{}, fmt.Errorf("%s %d: must be in [1, %d]", name, n, MaxFill)
	}
	if err := cfg.Validate(); err != nil {
		return FillResult{}, err
	}
	workers, err := newWorkers(&cfg, seedOf(&cfg))
	if err != nil {
		return FillResult{}, fmt.Errorf("%s: set up workers: %w", name, err)
	}
	defer func() {
		for _, w := range workers {
			w.release()
		}
	}()

	var next, retried atomic.Int64
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
				uri := w.gen.uriFor(uint64(k))
				for attempt := 1; ; attempt++ {
					sent := time.Now()
					status, err := w.do(o, uri)
					if attempt < fillAttempts && retryable(status, err) {
						retried.Add(1)
						continue
					}
					if o == opGet && status == fasthttp.StatusNotFound {
						status = fasthttp.StatusOK // absent is an answer
					}
					w.done(o, status, err, sent)
					break
				}
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
		Retried: retried.Load(),
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
		return res, fmt.Errorf("%s interrupted after %d of %d keys: %w", name, res.Keys, n, err)
	}
	if failed := total.failures(); failed > 0 {
		return res, fmt.Errorf("%s: %d of %d %ss failed (non-2xx %d, connect %d, timeout %d, other %d)",
			name, failed, n, o, res.Non2xx, res.Errors.Connect, res.Errors.Timeout, res.Errors.Other)
	}
	return res, nil
}

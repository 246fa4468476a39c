package loadgen

import (
	"fmt"
	"time"

	"github.com/valyala/fasthttp"
)

// worker is one connection's worth of load: it owns its request, response,
// URI buffer, random streams and recorder, so that the hot path shares
// nothing with other workers but the scheduler's counters.
type worker struct {
	client  *fasthttp.HostClient
	req     *fasthttp.Request
	resp    *fasthttp.Response
	gen     *requestGen
	value   []byte
	timeout time.Duration
	rec     *recorder
	sleep   *sleeper // constant-rate waits
	lastOp  op
	fresh   bool // lastOp not yet applied to req
}

// newWorkers creates cfg.Connections workers. Worker i talks to target
// i mod len(targets) through that target's single HostClient, whose MaxConns
// equals the number of workers using it: every worker always has a
// connection, and nothing is queued inside fasthttp.
func newWorkers(cfg *Config, seed uint64) ([]*worker, error) {
	perTarget := make([]int, len(cfg.Targets))
	for i := range cfg.Connections {
		perTarget[i%len(cfg.Targets)]++
	}
	tlsConf, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	clients := make([]*fasthttp.HostClient, len(cfg.Targets))
	for i, t := range cfg.Targets {
		addr, https, err := parseTarget(t)
		if err != nil {
			return nil, err
		}
		clients[i] = &fasthttp.HostClient{
			Addr:         addr,
			IsTLS:        https,
			TLSConfig:    tlsConf,
			Name:         "dhtkv-load",
			MaxConns:     perTarget[i],
			ReadTimeout:  cfg.Timeout,
			WriteTimeout: cfg.Timeout,
			// One attempt per request: a retried request would be counted
			// once with the latency of two, hiding the failure.
			MaxIdemponentCallAttempts: 1,
			RetryIfErr:                func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
			// Never expected to wait (MaxConns = workers), but waiting is
			// better than a spurious ErrNoFreeConns if it ever happens.
			MaxConnWaitTimeout: cfg.Timeout,
		}
	}
	// One value shared read-only by all workers: fasthttp only reads it.
	value := make([]byte, cfg.ValueSize)
	for i := range value {
		value[i] = 'v'
	}
	workers := make([]*worker, cfg.Connections)
	for i := range workers {
		t := i % len(cfg.Targets)
		gen, err := newRequestGen(cfg, cfg.Targets[t], seed, uint64(i)+1)
		if err != nil {
			return nil, fmt.Errorf("worker %d: %w", i, err)
		}
		w := &worker{
			client:  clients[t],
			req:     fasthttp.AcquireRequest(),
			resp:    fasthttp.AcquireResponse(),
			gen:     gen,
			value:   value,
			timeout: cfg.Timeout,
			rec:     newRecorder(),
			sleep:   newSleeper(),
			fresh:   true,
		}
		workers[i] = w
	}
	return workers, nil
}

// release returns the worker's fasthttp objects to their pools.
func (w *worker) release() {
	w.sleep.close()
	fasthttp.ReleaseRequest(w.req)
	fasthttp.ReleaseResponse(w.resp)
	w.req, w.resp = nil, nil
}

// done records the request w.do just sent: its outcome, and, when it was
// answered, the body bytes it sent and received. start is the time its
// latency runs from: when it was sent, or, on a constant-rate schedule,
// when it was due.
func (w *worker) done(o op, status int, err error, start time.Time) {
	w.rec.record(o, status, err, start, time.Now())
	if err == nil {
		out := 0
		if o == opPut {
			out = len(w.value)
		}
		w.rec.recordBytes(len(w.resp.Body()), out)
	}
}

// do sends one request and returns its status code. Method and body are only
// touched when the operation differs from the previous one.
func (w *worker) do(o op, uri []byte) (int, error) {
	if w.fresh || o != w.lastOp {
		switch o {
		case opPut:
			w.req.Header.SetMethod(fasthttp.MethodPut)
			w.req.Header.SetContentType("application/octet-stream")
			w.req.SetBodyRaw(w.value)
		default:
			if o == opGet {
				w.req.Header.SetMethod(fasthttp.MethodGet)
			} else {
				w.req.Header.SetMethod(fasthttp.MethodDelete)
			}
			w.req.ResetBody()
			// fasthttp does not rewrite Content-Length for a bodiless GET:
			// a PUT's length would linger and the server would wait for a
			// body that never comes.
			w.req.Header.Del(fasthttp.HeaderContentLength)
			w.req.Header.Del(fasthttp.HeaderContentType)
		}
		w.lastOp, w.fresh = o, false
	}
	w.req.SetRequestURIBytes(uri)
	if err := w.client.DoTimeout(w.req, w.resp, w.timeout); err != nil {
		return 0, err
	}
	return w.resp.StatusCode(), nil
}

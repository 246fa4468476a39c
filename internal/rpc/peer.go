package rpc

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/view"
)

// SecretHeader carries --cluster-secret on internal requests.
const SecretHeader = "X-Dhtkv-Secret"

// DefaultMaxBatchBytes is PeerOptions.MaxBatchBytes' default, 256 KiB:
// every node takes a batch body of this size from its peers whatever its
// own --max-value-bytes (node.Config).
const DefaultMaxBatchBytes = 256 << 10

// DefaultMaxPeerAnswerBytes is PeerOptions.MaxAnswerBytes' default: a
// batch answer's reads stop once past the peer's DefaultMaxAnswerBytes,
// the last of them a value of at most the peer's --max-value-bytes,
// which this node takes up to 1 GiB whatever its own (as it does a
// record of a peer's stream); plus the writes' results.
const DefaultMaxPeerAnswerBytes = 1<<30 + 2*DefaultMaxAnswerBytes

// PeerOptions configures the client for one peer. Zero fields take the
// defaults noted.
type PeerOptions struct {
	// Timeout bounds dialing, writing a batch and reading its answer (the
	// node passes --replica-timeout; default 300 ms). Each call's own
	// deadline bounds it further.
	Timeout time.Duration
	// Conns is how many batches of each lane (reads, writes) may be in
	// flight to the peer at once: the number of sender goroutines per
	// lane, each with one pooled connection in use (default 1). Fewer
	// means larger batches, so less CPU per replica call; more means less
	// waiting behind a slow batch. One per lane measured best where CPU
	// is scarce (docs/benchmarks.md).
	Conns int
	// MaxBatchBytes bounds one batch's body in bytes (default
	// DefaultMaxBatchBytes); a single larger operation goes alone. Keep it
	// within the peers' request body limit.
	MaxBatchBytes int
	// MaxAnswerBytes bounds the body of the peer's answer to a batch or
	// a ping (default DefaultMaxPeerAnswerBytes); a larger one fails the
	// batch's calls. fasthttp allocates an answer's announced length
	// before it reads a byte of it: without a bound, one header from a
	// misbehaving peer made this node allocate whatever it announced.
	MaxAnswerBytes int
	// Secret is sent in SecretHeader on every request when set
	// (--cluster-secret; default none).
	Secret string
	// Now is this node's clock, the one its versions are made from
	// (default time.Now): the peer's clock is measured against it.
	Now func() time.Time
	// SummaryTimeout bounds one anti-entropy summary exchange (SummaryPath)
	// with the peer, which may have to read a whole index partition by
	// partition (default 30 s).
	SummaryTimeout time.Duration
	// Dial connects to a peer's host:port within timeout (default: TCP).
	// Tests route node-to-node traffic through fault injectors with it.
	Dial func(addr string, timeout time.Duration) (net.Conn, error)
	// Maps is given the maps of peers that refuse a call as stale and
	// told of peers behind (see Maps.Stale and Maps.Behind). Default:
	// nil, nothing is told.
	Maps Maps
	// TLS, when set, makes every connection to the peer TLS with this
	// configuration, set up over what Dial returns (the node passes its
	// client configuration under --tls-cert: the peer's listener then
	// speaks only TLS). The peer keeps its http:// URL as its name in
	// errors and metrics; only the transport changes (see transportURL).
	// The default value is nil: plain HTTP.
	TLS *tls.Config
}

// transportURL is the URL requests to the node named baseURL
// (http://host:port, its identity in the cluster list) are sent to:
// https://host:port when TLS is on.
func transportURL(baseURL string, tlsConf *tls.Config) string {
	if tlsConf == nil {
		return baseURL
	}
	return "https://" + strings.TrimPrefix(baseURL, "http://")
}

// queueLen bounds the calls waiting for a sender. A full queue fails a call
// at once (overload) rather than letting it wait without bound.
const queueLen = 4096

// Peer is the client for one other node: a fasthttp HostClient created at
// start-up, with pooled connections, reused for the node's lifetime, and
// the sender goroutines that batch calls onto it (see BatchPath).
//
// Get and Apply enqueue a call and wait for it. A sender takes the oldest
// waiting call plus every other call waiting at that moment (up to a
// batch's bounds), sends them in one request with the earliest of their
// deadlines, and hands each call its result. Calls whose deadline passed
// while queued fail without being sent; a queue is first in, first out,
// so a call waits at most for batches whose deadlines come before its
// own. Every call therefore ends by its deadline, and the coordinator's
// goroutines never wait longer than they would on a direct request; nor
// does a call fail before its deadline because a batch-mate's came first:
// when the batch times out, the calls with time left are sent again.
// The exception is a peer that turned silent (silent.go: a batch went
// unanswered for half the timeout): its calls, queued or new, fail at
// once until it answers a ping.
//
// Reads and writes queue in separate lanes with their own senders: a
// write batch waits for the peer's fsync (about a millisecond here), and
// a read queued behind it would wait that long for nothing. While a
// lane's batch is in flight its next calls gather in the queue, so the
// batch grows with the load by itself, without any timer.
type Peer struct {
	url      string // the peer's name: its http:// URL in the cluster list
	base     string // where requests go: url, or its https:// form (transportURL)
	batchURL string
	client   *fasthttp.HostClient
	bulk     *fasthttp.HostClient // summary exchanges (summary.go), apart from the batches' deadlines
	secret   string
	maxBatch int
	batchOps prometheus.Observer
	now      func() time.Time
	maps     Maps
	timeout  time.Duration // PeerOptions.Timeout
	offset   clockOffset
	silence  *peerSilence // silent.go
	// peerTime is the peer's clock as last read off an answer, against
	// this process's monotonic clock: what DeadlineHeader is computed
	// from (late.go). Its zero value: no answer read yet. A value under
	// a mutex rather than a pointer swapped atomically: every batch's
	// answer sets it, and a new pointer would be an allocation per batch.
	peerTimeMu sync.Mutex
	peerTime   peerTime

	mu      sync.RWMutex // guards closed against enqueues racing Close
	closed  bool
	lanes   [nLanes]chan *call // queued calls, by laneOf their kind
	stop    chan struct{}
	start   sync.Once // startSenders
	conns   int       // senders per lane
	senders sync.WaitGroup

	// calls recycles this peer's calls (newCall). Per peer, not per
	// process: a call's done channel then never passes from one node's
	// goroutines to another's, which testing/synctest requires of the
	// in-process test clusters (a channel made in one bubble panics in
	// another).
	calls sync.Pool
}

// The lanes of a peer: reads never wait behind writes (see Peer), and
// requests' reads never behind background reads (view.Call.Background),
// whose batches carry BackgroundHeader.
const (
	laneRead = iota
	laneWrite
	laneBackground
	nLanes
)

// maxConns is the most connections a Peer with conns senders per
// request lane holds to its node: those senders', the background lane's
// one, one for Ping and one for a silent peer's prober (silent.go).
func maxConns(conns int) int { return 2*conns + 1 + 2 }

func laneOf(c *call) int {
	switch {
	case c.kind == OpWrite:
		return laneWrite
	case c.bg:
		return laneBackground
	}
	return laneRead
}

// NewPeer prepares the client for baseURL (http://host:port, whether or not
// o.TLS is set); its senders start at the first call, and Close stops
// them. m may be nil (nothing is counted).
func NewPeer(baseURL string, o PeerOptions, m *Metrics) *Peer {
	addr := strings.TrimPrefix(baseURL, "http://")
	if o.Timeout <= 0 {
		o.Timeout = 300 * time.Millisecond
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	timeout := o.Timeout
	dial := o.Dial
	if dial == nil {
		dial = fasthttp.DialTimeout
	}
	if o.Conns <= 0 {
		o.Conns = 1
	}
	if o.MaxBatchBytes <= 0 {
		o.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if o.MaxAnswerBytes <= 0 {
		o.MaxAnswerBytes = DefaultMaxPeerAnswerBytes
	}
	base := transportURL(baseURL, o.TLS)
	p := &Peer{
		url:      baseURL,
		base:     base,
		batchURL: base + BatchPath,
		secret:   o.Secret,
		maxBatch: o.MaxBatchBytes,
		batchOps: m.batchOpsFor(baseURL),
		now:      o.Now,
		maps:     o.Maps,
		timeout:  o.Timeout,
		stop:     make(chan struct{}),
		client: &fasthttp.HostClient{
			Addr: addr,
			Name: "dhtkv-replica",
			// A refused connection fails at once (ECONNREFUSED comes back
			// from connect immediately); a silent host fails when the
			// batch's deadline passes (fasthttp passes the time it has
			// left), never later than the timeout and not after the OS
			// default of minutes.
			DialTimeout: func(a string, left time.Duration) (net.Conn, error) {
				if left <= 0 || left > timeout {
					left = timeout
				}
				return dial(a, left)
			},
			MaxConns: maxConns(o.Conns),
			// Each sender uses one connection at a time, so none waits for
			// a free one; should that change, a wait is still bounded.
			MaxConnWaitTimeout: timeout,
			// fasthttp retries idempotent requests up to 5 times by
			// default, on any error. A blanket retry hides failures from
			// the coordinator and multiplies load on a struggling peer.
			// Retries are allowed only when a pooled keep-alive
			// connection turned out to be dead (the peer restarted), once
			// per pooled connection plus one: after a peer restart every
			// pooled connection is dead, and each retry discards one.
			// Without them the first requests after a peer restart fail.
			// A batch carries versions, so a repeat is harmless; timeouts
			// are never retried and the request deadline still bounds the
			// call.
			MaxIdemponentCallAttempts: maxConns(o.Conns) + 1,
			RetryIfErr: func(_ *fasthttp.Request, _ int, err error) (bool, bool) {
				return false, isDeadConn(err)
			},
			ReadTimeout:              timeout,
			WriteTimeout:             timeout,
			MaxIdleConnDuration:      30 * time.Second,
			MaxResponseBodySize:      o.MaxAnswerBytes,
			NoDefaultUserAgentHeader: true,
			// fasthttp handshakes within WriteTimeout after the dial,
			// and refuses a request whose scheme disagrees with IsTLS.
			IsTLS:     o.TLS != nil,
			TLSConfig: o.TLS,
		},
	}
	if o.SummaryTimeout <= 0 {
		o.SummaryTimeout = 30 * time.Second
	}
	p.bulk = &fasthttp.HostClient{
		Addr: addr, Name: "dhtkv-summary",
		DialTimeout: func(a string, left time.Duration) (net.Conn, error) {
			return dial(a, min(max(left, 0), timeout))
		},
		MaxConns:                 2,
		ReadTimeout:              o.SummaryTimeout,
		WriteTimeout:             o.SummaryTimeout,
		MaxIdleConnDuration:      30 * time.Second,
		MaxResponseBodySize:      2 * SummaryAnswerBytes,
		NoDefaultUserAgentHeader: true,
		IsTLS:                    o.TLS != nil,
		TLSConfig:                o.TLS,
	}
	for l := range p.lanes {
		p.lanes[l] = make(chan *call, queueLen)
	}
	p.conns = o.Conns
	p.silence = m.silenceFor(baseURL)
	return p
}

// startSenders starts every lane's senders, once, at the first call: a
// Peer made and never called (a member this node does not talk to yet)
// runs nothing. A closed Peer starts none.
func (p *Peer) startSenders() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	for l := range p.lanes {
		n := p.conns
		if l == laneBackground {
			n = 1 // background work is paced; it needs no parallel batches
		}
		p.senders.Add(n)
		for range n {
			go p.sender(p.lanes[l], l == laneBackground)
		}
	}
}

// isDeadConn reports errors that mean a pooled connection was closed by the
// other side before or while we used it.
func isDeadConn(err error) bool {
	return errors.Is(err, fasthttp.ErrConnectionClosed) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// Close stops the senders (calls still queued fail) and drops the pooled
// idle connections to the peer. The coordinator closes its peers only
// after its own calls have ended.
func (p *Peer) Close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.stop)
	}
	p.mu.Unlock()
	p.senders.Wait()
	p.client.CloseIdleConnections()
	p.bulk.CloseIdleConnections()
}

// errStatus is an unexpected status from a peer.
type errStatus struct{ code int }

func (e errStatus) Error() string { return fmt.Sprintf("status %d", e.code) }

// Refused reports whether the status is a refusal (4xx): the peer is up
// and will not take the request as sent. Callers outside the package
// read it through an interface of their own (probe).
func (e errStatus) Refused() bool { return e.code >= 400 && e.code < 500 }

// ErrRefused is a write the replica refused and always will as sent (see
// ResRefused).
var ErrRefused = errors.New("refused by the replica")

// ErrAhead is ErrRefused for a version too far ahead of the replica's
// clock (hlc.ErrTooFarAhead): refused for now, taken once its clock is
// within the bound of it, so worth a hint.
var ErrAhead = errors.New("version too far ahead of the replica's clock, for now")

// refusal is the error of a write's ResRefused answer, msg its reason.
func refusal(msg string) error {
	if strings.Contains(msg, hlc.ErrTooFarAhead.Error()) {
		return fmt.Errorf("%w: %w: %s", ErrRefused, ErrAhead, msg)
	}
	return fmt.Errorf("%w: %s", ErrRefused, msg)
}

// IsRefused reports whether err is the peer refusing a write or a whole
// batch (a 4xx: malformed or forbidden): sending the same again cannot
// succeed.
func IsRefused(err error) bool {
	var e errStatus
	return errors.Is(err, ErrRefused) || errors.As(err, &e) && e.Refused()
}

// ErrTimeout marks a replica call that ran out of time (or could not even
// be queued because the peer's queue was full, or failed at once because
// the peer is silent: silent.go).
var ErrTimeout = errors.New("replica timeout")

// ErrPeerClosed fails calls made or still queued when the peer client closes.
var ErrPeerClosed = errors.New("peer client closed")

// classify marks the errors of a call that ran out of time with ErrTimeout.
// A connect that times out is fasthttp.ErrDialTimeout or net's "i/o
// timeout" (a net.Error whose Timeout is true: fasthttp.DialTimeout passes
// it on when the connect's deadline fires before its context's, and a
// PeerOptions.Dial may return it). Both must count: sendOnce sends a
// batch's calls again only after a timeout, and a batch's connect is given
// what is left of its earliest deadline, so a later call would otherwise
// fail with its batch-mate, long before its own deadline.
func classify(err error) error {
	var ne net.Error
	if errors.Is(err, fasthttp.ErrTimeout) || errors.Is(err, fasthttp.ErrDialTimeout) ||
		errors.Is(err, fasthttp.ErrNoFreeConns) || errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("%w: %w", ErrTimeout, err)
	}
	return err
}

// call is one replica operation waiting for a sender. Calls are pooled:
// the waiter owns it again once done has fired. A call started by Go
// (ext set) has no waiter: finish completes ext and recycles the call.
type call struct {
	p        *Peer
	kind     byte
	key      []byte
	envelope []byte // writes
	epoch    uint64 // the cluster map's the call was routed by
	deadline time.Time
	bg       bool // a background read (laneBackground)
	// resent: sent again once already after a peer found its batch late
	// while this node still waited (its clock stepped; late.go).
	resent bool
	ext    *view.Call // Go's call, finished on its Done; nil for Get and Apply

	// Set by the sender before it signals done.
	res batchResult
	err error

	done chan struct{}
}

// newCall takes a call from the peer's pool; putCall returns it without
// keeping references to the request's memory.
func (p *Peer) newCall(kind byte, key, envelope []byte, epoch uint64, deadline time.Time) *call {
	c, ok := p.calls.Get().(*call)
	if !ok {
		c = &call{done: make(chan struct{}, 1)}
	}
	*c = call{p: p, kind: kind, key: key, envelope: envelope, epoch: epoch, deadline: deadline, done: c.done}
	return c
}

func (p *Peer) putCall(c *call) {
	*c = call{done: c.done}
	p.calls.Put(c)
}

// enqueue hands c to its lane's senders; an error means it was not
// queued, and c is still the caller's.
func (p *Peer) enqueue(c *call) error {
	p.start.Do(p.startSenders)
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return ErrPeerClosed
	}
	if err := p.silentErr(1); err != nil {
		return err
	}
	select {
	case p.lanes[laneOf(c)] <- c: // c belongs to the senders until it is finished
		return nil
	default:
		return fmt.Errorf("%w: %d calls already queued", ErrTimeout, queueLen)
	}
}

// do enqueues c and waits for its result.
func (p *Peer) do(c *call) {
	if err := p.enqueue(c); err != nil {
		c.err = err
		return
	}
	<-c.done
}

// finish ends c with err (nil: c.res holds the answer): it wakes c's
// waiter, or completes Go's call.
func (c *call) finish(err error) {
	c.err = err
	if c.ext == nil {
		c.done <- struct{}{}
		return
	}
	vc, p := c.ext, c.p
	if vc.Env == nil {
		vc.Rec, vc.Found, vc.Err = p.readResult(c)
	} else {
		vc.Newer, vc.Err = p.writeResult(c)
	}
	vc.Ended = time.Now()
	p.putCall(c)
	vc.Done <- vc // has room: see view.Call
}

// Go starts vc (view.Starter): it queues like Get's and Apply's calls,
// and the sender that finishes it sends it on vc.Done, so that a caller
// of several replicas needs no goroutine per call.
func (p *Peer) Go(vc *view.Call) {
	var kind byte = OpRead
	if vc.Env != nil {
		kind = OpWrite
	}
	c := p.newCall(kind, vc.Key, vc.Env, vc.Epoch, vc.Deadline)
	c.ext, c.bg = vc, vc.Background && kind == OpRead
	if err := p.enqueue(c); err != nil {
		c.finish(err)
	}
}

// Get fetches key's record from the peer. found is false when the peer has
// never seen the key. The record owns its memory. epoch is the cluster
// map's by which the read was routed: a peer with a newer map refuses it
// (ErrStaleEpoch).
func (p *Peer) Get(key []byte, epoch uint64, deadline time.Time) (rec record.Record, found bool, err error) {
	c := p.newCall(OpRead, key, nil, epoch, deadline)
	defer p.putCall(c)
	p.do(c)
	return p.readResult(c)
}

// readResult is a finished read call's outcome, as Get returns it.
func (p *Peer) readResult(c *call) (rec record.Record, found bool, err error) {
	switch {
	case c.err != nil:
		return record.Record{}, false, fmt.Errorf("get from %s: %w", p.url, c.err)
	case c.res.code == ResNotFound:
		return record.Record{}, false, nil
	}
	rec, err = record.Decode(c.res.envelope) // the sender cloned it
	if err != nil {
		return record.Record{}, false, fmt.Errorf("get from %s: %w", p.url, err)
	}
	return rec, true, nil
}

// Apply sends an encoded envelope for key to the peer. newer is non-zero
// when the peer already holds a newer version of key and wrote nothing.
// epoch is as for Get.
func (p *Peer) Apply(key, envelope []byte, epoch uint64, deadline time.Time) (newer uint64, err error) {
	c := p.newCall(OpWrite, key, envelope, epoch, deadline)
	defer p.putCall(c)
	p.do(c)
	return p.writeResult(c)
}

// writeResult is a finished write call's outcome, as Apply returns it.
func (p *Peer) writeResult(c *call) (newer uint64, err error) {
	switch {
	case c.err != nil:
		return 0, fmt.Errorf("apply to %s: %w", p.url, c.err)
	case c.res.code == ResNewer:
		if c.res.version == 0 {
			return 0, fmt.Errorf("apply to %s: refused without a version", p.url)
		}
		return c.res.version, nil
	}
	return 0, nil
}

// sender sends batches of queue's calls until Close, marked with
// BackgroundHeader if bg; see Peer.
func (p *Peer) sender(queue chan *call, bg bool) {
	defer p.senders.Done()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer func() {
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseResponse(resp)
	}()
	var (
		batch []*call
		body  []byte
		carry *call // taken from the queue but over the previous batch's bound
	)
	for {
		first := carry
		carry = nil
		select { // a closed peer stops first: nothing more is sent
		case <-p.stop:
			if first != nil {
				first.finish(ErrPeerClosed)
			}
			failQueued(queue)
			return
		default:
		}
		if first == nil {
			select {
			case first = <-queue:
			case <-p.stop:
				failQueued(queue)
				return
			}
		}
		batch = append(batch[:0], first)
		size := batchOpSize(first.key, first.envelope)
		batch, size, carry = p.take(queue, batch, size)
		if carry == nil && len(batch) < MaxBatchOps {
			// Let the goroutines that are ready to run go first: under
			// load they are request handlers about to queue their calls
			// here, and a batch that takes them costs one exchange and
			// its wake-ups instead of several. With nothing else ready
			// it returns at once.
			runtime.Gosched()
			batch, _, carry = p.take(queue, batch, size)
		}
		body = p.send(batch, req, resp, body, bg)
		// A batch with one very large value must not pin its buffers for
		// the sender's lifetime.
		if cap(body) > 2*p.maxBatch {
			body = nil
		}
		if cap(resp.Body()) > 2*p.maxBatch {
			fasthttp.ReleaseResponse(resp)
			resp = fasthttp.AcquireResponse()
		}
	}
}

// take adds the calls waiting in queue to batch, within its bounds; carry
// is one taken that did not fit.
func (p *Peer) take(queue chan *call, batch []*call, size int) (_ []*call, _ int, carry *call) {
	for len(batch) < MaxBatchOps {
		select {
		case c := <-queue:
			if n := batchOpSize(c.key, c.envelope); size+n <= p.maxBatch {
				batch, size = append(batch, c), size+n
				continue
			}
			return batch, size, c
		default:
		}
		break
	}
	return batch, size, nil
}

// failQueued fails the calls left in a queue of a closed peer. Close holds
// enqueues off (closed is set under mu), so the queue only shrinks.
func failQueued(queue chan *call) {
	for {
		select {
		case c := <-queue:
			c.finish(ErrPeerClosed)
		default:
			return
		}
	}
}

// batchRequest makes req a request for BatchPath with the cluster secret
// and epoch (setEpoch); the caller adds the rest.
func (p *Peer) batchRequest(req *fasthttp.Request, epoch uint64) {
	req.Reset()
	req.SetRequestURI(p.batchURL)
	req.Header.SetMethod(fasthttp.MethodPost)
	if p.secret != "" {
		req.Header.Set(SecretHeader, p.secret)
	}
	setEpoch(&req.Header, epoch)
}

// send sends one batch and finishes every call in it. It returns body, the
// request buffer, for reuse.
func (p *Peer) send(batch []*call, req *fasthttp.Request, resp *fasthttp.Response, body []byte, bg bool) []byte {
	for len(batch) > 0 {
		body, batch = p.sendOnce(batch, req, resp, body, bg)
	}
	return body
}

// sendOnce sends the calls of batch whose deadline has not passed, with the
// earliest of their deadlines, and finishes them. If that deadline passes
// first, the calls with a later deadline are not failed for a batch-mate's
// (a hint queued long before, say): they are returned, to be sent again,
// unless the timeout made the peer silent (silent.go), which fails them.
func (p *Peer) sendOnce(batch []*call, req *fasthttp.Request, resp *fasthttp.Response, body []byte, bg bool) ([]byte, []*call) {
	now := time.Now()
	live := batch[:0]
	var deadline time.Time
	var epoch uint64
	for _, c := range batch {
		if !now.Before(c.deadline) {
			c.finish(fmt.Errorf("%w: deadline passed while queued", ErrTimeout))
			continue
		}
		if len(live) == 0 || c.deadline.Before(deadline) {
			deadline = c.deadline
		}
		if len(live) == 0 || c.epoch < epoch {
			epoch = c.epoch // the batch is as stale as its stalest call
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return body, nil
	}
	if err := p.silentErr(len(live)); err != nil { // it turned silent while these queued
		for _, c := range live {
			c.finish(err)
		}
		return body, nil
	}
	p.batchOps.Observe(float64(len(live)))
	body = body[:0]
	for _, c := range live {
		body = AppendBatchOp(body, c.kind, c.key, c.envelope)
	}
	p.batchRequest(req, epoch)
	if bg {
		req.Header.Set(BackgroundHeader, "1")
	}
	p.setDeadline(req, deadline)
	req.SetBodyRaw(body)
	resp.Reset()
	start := time.Now()
	err := p.exchange(req, resp, deadline)
	unanswered := err != nil
	if err == nil && resp.StatusCode() == fasthttp.StatusConflict {
		return body, p.refusedStale(live, resp)
	}
	if err == nil && resp.StatusCode() == fasthttp.StatusGatewayTimeout {
		// The peer found the batch past its deadline (DeadlineHeader).
		// Still waited for, it was not late: the peer's clock stepped
		// ahead since this node read it, and the answer carried its
		// time, read anew. Each call goes again, once. Otherwise it is a
		// timeout, and the calls with time left go again.
		if time.Now().Before(deadline) {
			again := live[:0]
			for _, c := range live {
				if c.resent {
					c.finish(fmt.Errorf("%w: the peer found the batch late twice", ErrTimeout))
					continue
				}
				c.resent = true
				again = append(again, c)
			}
			return body, again
		}
		err = fmt.Errorf("%w: the peer received the batch after its deadline", ErrTimeout)
	}
	if err == nil && resp.StatusCode() != fasthttp.StatusOK {
		err = fmt.Errorf("%w: %s", errStatus{resp.StatusCode()}, firstLine(resp.Body()))
	}
	if err == nil {
		p.checkBehind(resp, epoch)
	}
	if err != nil && errors.Is(classify(err), ErrTimeout) {
		if unanswered && !bg {
			p.noteUnanswered(start, deadline, epoch, err)
		}
		again := live[:0]
		for _, c := range live {
			if c.deadline.After(deadline) {
				again = append(again, c)
			} else {
				c.finish(classify(err))
			}
		}
		return body, again
	}
	rest := resp.Body()
	var again []*call
	for _, c := range live {
		if err != nil {
			c.finish(classify(err))
			continue
		}
		var r batchResult
		if r, rest, err = nextResult(rest); err != nil {
			c.finish(err) // and every call after it
			continue
		}
		if r.code == ResError {
			c.finish(fmt.Errorf("replica error: %s", r.msg))
			continue
		}
		if r.code == ResRefused {
			c.finish(refusal(r.msg))
			continue
		}
		if r.code == ResNoSpace && c.kind == OpWrite {
			c.finish(storageError{r.msg})
			continue
		}
		if r.code == ResOverLimit && c.kind == OpRead {
			again = append(again, c) // the answer was full: in the next batch
			continue
		}
		if ok := (c.kind == OpRead) == (r.code == ResFound || r.code == ResNotFound); !ok {
			err = fmt.Errorf("%w: result %q for operation %q", errMalformed, r.code, c.kind)
			c.finish(err)
			continue
		}
		r.envelope = bytes.Clone(r.envelope) // resp's buffer is reused
		c.res = r
		c.finish(nil)
	}
	return body, again
}

package cluster

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/record"
)

// InternalPath is where nodes send each other replica reads and writes. It is
// separate from the public /v0/entity so that only node-to-node traffic can
// carry a version: the public API always gets a fresh version from the
// coordinator's clock, so clients cannot forge one.
//
//	GET /v0/internal/entity?id=K            → 200 + envelope, or 404 (never written)
//	PUT /v0/internal/entity?id=K + envelope → 201 applied, or
//	                                          409 + VersionHeader: the replica
//	                                          holds that newer version, nothing written
const InternalPath = "/v0/internal/entity"

// VersionHeader carries, on a 409 answer to an internal PUT, the newer
// version the replica already holds (decimal).
const VersionHeader = "X-Dhtkv-Version"

// SecretHeader carries --cluster-secret on internal requests.
const SecretHeader = "X-Dhtkv-Secret"

// PeerOptions configures the client for one peer.
type PeerOptions struct {
	// Timeout bounds dial, read and write of one replica call.
	Timeout time.Duration
	// MaxConns bounds the pooled connections to the peer.
	MaxConns int
	Secret   string
	// ReadHedgeDelay is how long a read waits for its first `ack`
	// replicas before asking the others too (0: ask all at once).
	ReadHedgeDelay time.Duration
}

// Peer is the client for one other node: a fasthttp HostClient created at
// start-up, with pooled connections, reused for the node's lifetime.
type Peer struct {
	url    string
	client *fasthttp.HostClient
	secret string
}

// NewPeer prepares the client for baseURL (http://host:port).
func NewPeer(baseURL string, o PeerOptions) *Peer {
	addr := strings.TrimPrefix(baseURL, "http://")
	timeout := o.Timeout
	return &Peer{
		url:    baseURL,
		secret: o.Secret,
		client: &fasthttp.HostClient{
			Addr: addr,
			Name: "dhtkv-replica",
			// A refused connection fails at once (ECONNREFUSED comes back
			// from connect immediately); a silent host fails after the
			// timeout, not the OS default of minutes.
			Dial:     func(a string) (net.Conn, error) { return fasthttp.DialTimeout(a, timeout) },
			MaxConns: o.MaxConns,
			// When all MaxConns are busy, wait for one up to the replica
			// timeout instead of failing at once with ErrNoFreeConns: a burst
			// is queued, a stuck peer is still bounded by the deadline.
			MaxConnWaitTimeout: timeout,
			// fasthttp retries idempotent requests (GET and, by its rules,
			// PUT) up to 5 times by default, on any error. A blanket retry
			// hides failures from the coordinator and multiplies load on a
			// struggling peer. One retry is allowed, and only when a pooled
			// keep-alive connection turned out to be dead (the peer
			// restarted): without it the first request per pooled
			// connection after a peer restart fails. Internal requests
			// carry their version, so a repeat is harmless; timeouts are
			// never retried and the request deadline still bounds the call.
			MaxIdemponentCallAttempts: 2,
			RetryIfErr: func(_ *fasthttp.Request, _ int, err error) (bool, bool) {
				return false, isDeadConn(err)
			},
			ReadTimeout:              timeout,
			WriteTimeout:             timeout,
			MaxIdleConnDuration:      30 * time.Second,
			NoDefaultUserAgentHeader: true,
		},
	}
}

// isDeadConn reports errors that mean a pooled connection was closed by the
// other side before or while we used it.
func isDeadConn(err error) bool {
	return errors.Is(err, fasthttp.ErrConnectionClosed) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// Close drops the pooled idle connections to the peer (on shutdown).
func (p *Peer) Close() { p.client.CloseIdleConnections() }

// URL is the peer's base URL.
func (p *Peer) URL() string { return p.url }

// errStatus is an unexpected status from a peer.
type errStatus struct{ code int }

func (e errStatus) Error() string { return fmt.Sprintf("status %d", e.code) }

// ErrTimeout marks a replica call that ran out of time.
var ErrTimeout = errors.New("replica timeout")

func (p *Peer) newRequest(method string, key []byte) *fasthttp.Request {
	req := fasthttp.AcquireRequest()
	uri := make([]byte, 0, len(p.url)+len(InternalPath)+4+len(key)*3)
	uri = append(uri, p.url...)
	uri = append(uri, InternalPath...)
	uri = append(uri, "?id="...)
	uri = fasthttp.AppendQuotedArg(uri, key)
	req.SetRequestURIBytes(uri)
	req.Header.SetMethod(method)
	if p.secret != "" {
		req.Header.Set(SecretHeader, p.secret)
	}
	return req
}

func classify(err error) error {
	if errors.Is(err, fasthttp.ErrTimeout) || errors.Is(err, fasthttp.ErrDialTimeout) ||
		errors.Is(err, fasthttp.ErrNoFreeConns) {
		return fmt.Errorf("%w: %w", ErrTimeout, err)
	}
	return err
}

// Get fetches key's record from the peer. found is false when the peer has
// never seen the key. The record owns its memory.
func (p *Peer) Get(key []byte, deadline time.Time) (rec record.Record, found bool, err error) {
	req := p.newRequest(fasthttp.MethodGet, key)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	if err := p.client.DoDeadline(req, resp, deadline); err != nil {
		return record.Record{}, false, fmt.Errorf("get from %s: %w", p.url, classify(err))
	}
	switch resp.StatusCode() {
	case fasthttp.StatusOK:
		rec, err := record.Decode(resp.Body())
		if err != nil {
			return record.Record{}, false, fmt.Errorf("get from %s: %w", p.url, err)
		}
		return rec.Clone(), true, nil // resp's buffer is reused
	case fasthttp.StatusNotFound:
		return record.Record{}, false, nil
	default:
		return record.Record{}, false, fmt.Errorf("get from %s: %w", p.url, errStatus{resp.StatusCode()})
	}
}

// Apply sends an encoded envelope for key to the peer. newer is non-zero
// when the peer already holds a newer version of key and wrote nothing.
func (p *Peer) Apply(key, envelope []byte, deadline time.Time) (newer uint64, err error) {
	req := p.newRequest(fasthttp.MethodPut, key)
	req.SetBodyRaw(envelope) // shared read-only by all fan-out goroutines
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	if err := p.client.DoDeadline(req, resp, deadline); err != nil {
		return 0, fmt.Errorf("apply to %s: %w", p.url, classify(err))
	}
	switch resp.StatusCode() {
	case fasthttp.StatusCreated:
		return 0, nil
	case fasthttp.StatusConflict:
		v, err := strconv.ParseUint(string(resp.Header.Peek(VersionHeader)), 10, 64)
		if err != nil || v == 0 {
			return 0, fmt.Errorf("apply to %s: 409 without a version", p.url)
		}
		return v, nil
	default:
		return 0, fmt.Errorf("apply to %s: %w", p.url, errStatus{resp.StatusCode()})
	}
}

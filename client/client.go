package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Config configures a Client. Zero fields take the defaults stated.
type Config struct {
	// Endpoints are the nodes' URLs, http://host:port, or https://host:port
	// for nodes that serve TLS (--tls-cert); host:port alone means http,
	// or https when TLSConfig is set. At least one is required; any node
	// of a cluster serves any request, so list several to survive the loss
	// of one.
	Endpoints []string
	// DialTimeout bounds connecting to one endpoint before the next one
	// is tried. The default value is 2 s. It is not used with Transport.
	DialTimeout time.Duration
	// MaxRecordBytes is the longest key and the largest value a Scan
	// accepts from a node, and the largest answer any other call reads
	// whole (a Get's value, a JSON answer, a node's refusal): a guard
	// against a corrupt length or a misbehaving endpoint, which would
	// otherwise make the client allocate whatever it sends. A larger
	// answer fails the call with ErrAnswerTooLarge, without trying another
	// endpoint (a value's size is the same on every replica). The default
	// value is 64 MiB, four times a node's default --max-value-bytes.
	MaxRecordBytes int
	// Transport, when set, carries the requests instead of the client's
	// own http.Transport (for a proxy, or instrumentation). The default is
	// a transport that uses no proxy and keeps up to 64 idle connections
	// per endpoint.
	Transport http.RoundTripper
	// TLSConfig is the TLS configuration of the connections to https
	// endpoints: the CAs the nodes' certificates chain to (RootCAs; nil:
	// the system's) and, where the nodes ask for one, the client's own
	// certificate (Certificates). With it, endpoints given as host:port
	// are https, and an http:// endpoint is an error: a cluster serves TLS
	// on every node or on none. The admin listeners that Repair and
	// Snapshot call serve plain HTTP, so host:port there stays http. It
	// cannot be combined with Transport (set the TLS configuration there).
	// The default value is nil: the system's roots for https endpoints.
	TLSConfig *tls.Config
	// Token is the bearer token sent with every request, to the public
	// ports and to the admin ports alike (Authorization: Bearer TOKEN),
	// for nodes started with --client-tokens: its role there (read, write
	// or admin) decides what the client may do, and a call it does not
	// allow fails with a *BadRequestError of status 401 or 403. It must
	// be a token as the node's file holds it (RFC 6750's b64token
	// characters). The admin ports serve plain HTTP: there the token
	// travels in clear. The default value is empty: no Authorization
	// header.
	Token string
}

// Client talks to a dhtkv cluster through its endpoints. It is safe for
// concurrent use; Close releases its idle connections.
type Client struct {
	endpoints []string // normalized: scheme://host:port, no slash
	scheme    string   // of an endpoint given as host:port
	http      *http.Client
	transport *http.Transport // ours, nil with Config.Transport
	maxRecord int
	// authorization is the Authorization header of every request ("":
	// none), made once.
	authorization string
	// preferred is the index of the endpoint tried first: the one that
	// served the last call.
	preferred atomic.Int32
}

// New returns a client of the nodes cfg lists. It contacts none of them.
func New(cfg Config) (*Client, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("dhtkv client: no endpoints")
	}
	c := &Client{maxRecord: cfg.MaxRecordBytes, scheme: "http"}
	if c.maxRecord <= 0 {
		c.maxRecord = 64 << 20
	}
	if cfg.Token != "" {
		if i := strings.IndexFunc(cfg.Token, func(r rune) bool { return r <= ' ' || r > '~' }); i >= 0 {
			return nil, fmt.Errorf("dhtkv client: Config.Token has %q at byte %d: a token is printable ASCII without spaces", cfg.Token[i], i)
		}
		c.authorization = "Bearer " + cfg.Token
	}
	if cfg.TLSConfig != nil {
		if cfg.Transport != nil {
			return nil, errors.New("dhtkv client: Config.TLSConfig with Config.Transport: set the TLS configuration on the Transport")
		}
		c.scheme = "https"
	}
	for _, e := range cfg.Endpoints {
		u, err := normalizeScheme(e, c.scheme)
		if err != nil {
			return nil, err
		}
		if cfg.TLSConfig != nil && strings.HasPrefix(u, "http://") {
			return nil, fmt.Errorf("dhtkv client: endpoint %q is http:// but a TLS configuration is given: write https://host:port or host:port", e)
		}
		c.endpoints = append(c.endpoints, u)
	}
	rt := cfg.Transport
	if rt == nil {
		dial := cfg.DialTimeout
		if dial <= 0 {
			dial = 2 * time.Second
		}
		c.transport = &http.Transport{
			DialContext:         (&net.Dialer{Timeout: dial, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
			TLSClientConfig:     cfg.TLSConfig.Clone(), // nil stays nil
			TLSHandshakeTimeout: dial,
			// A node answers 100 Continue, or its refusal, at once; a
			// proxy that answers neither delays a large value this long.
			ExpectContinueTimeout: time.Second,
		}
		rt = c.transport
	}
	c.http = &http.Client{
		Transport: rt,
		// The API never redirects; a redirect would come from something
		// else listening on the endpoint.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return c, nil
}

// normalize turns an endpoint into scheme://host:port, host:port alone
// meaning http: an admin listener's address.
func normalize(e string) (string, error) { return normalizeScheme(e, "http") }

// normalizeScheme is normalize with host:port alone meaning scheme.
func normalizeScheme(e, scheme string) (string, error) {
	s := strings.TrimSpace(e)
	if !strings.Contains(s, "://") {
		s = scheme + "://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("dhtkv client: endpoint %q: %w", e, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return "", fmt.Errorf("dhtkv client: endpoint %q: want http://host:port", e)
	}
	return u.Scheme + "://" + u.Host, nil
}

// Endpoints returns the client's endpoints, normalized, in their order.
func (c *Client) Endpoints() []string { return append([]string(nil), c.endpoints...) }

// Close closes the client's idle connections. Calls in flight finish; the
// client may still be used afterwards (it connects again).
func (c *Client) Close() {
	c.http.CloseIdleConnections()
}

// Option adjusts one call.
type Option func(*callOptions)

type callOptions struct {
	ack, from int
	limit     int
	local     bool
	ttl       time.Duration
}

// WithAck sets how many replicas must answer (the API's ack; 1 <= ack <=
// from). The default is the node's: a majority of from.
func WithAck(n int) Option { return func(o *callOptions) { o.ack = n } }

// WithFrom sets how many replicas the key has for this call (the API's
// from; at most the replication factor). The default is the node's: the
// replication factor.
func WithFrom(n int) Option { return func(o *callOptions) { o.from = n } }

// WithTTL makes a Put's value expire d after the write (the API's ttl):
// from then on it reads as absent, as if deleted. d is a whole number of
// seconds from 1 s (Put refuses another before sending anything); a node
// refuses more than ten years with a *BadRequestError. The other calls
// ignore it. Stat reports the time left.
func WithTTL(d time.Duration) Option { return func(o *callOptions) { o.ttl = d } }

func (o *callOptions) query(q url.Values) {
	if o.ack > 0 {
		q.Set("ack", strconv.Itoa(o.ack))
	}
	if o.from > 0 {
		q.Set("from", strconv.Itoa(o.from))
	}
}

func callOpts(opts []Option) callOptions {
	var o callOptions
	for _, f := range opts {
		f(&o)
	}
	return o
}

// Get returns key's value, ErrNotFound when the key is absent or deleted.
func (c *Client) Get(ctx context.Context, key string, opts ...Option) ([]byte, error) {
	o := callOpts(opts)
	q := url.Values{"id": {key}}
	o.query(q)
	a, err := c.roundTrip(ctx, http.MethodGet, "/v0/entity", q, nil, false)
	if err != nil {
		return nil, err
	}
	switch a.code {
	case http.StatusOK:
		return a.body, nil
	case http.StatusNotFound:
		return nil, ErrNotFound
	}
	return nil, a.err(http.MethodGet)
}

// Put stores value under key once ack replicas have stored it; WithTTL
// makes it expire.
func (c *Client) Put(ctx context.Context, key string, value []byte, opts ...Option) error {
	return c.write(ctx, http.MethodPut, key, value, http.StatusCreated, opts)
}

// Delete deletes key once ack replicas have stored the deletion; deleting
// an absent key succeeds.
func (c *Client) Delete(ctx context.Context, key string, opts ...Option) error {
	return c.write(ctx, http.MethodDelete, key, nil, http.StatusAccepted, opts)
}

func (c *Client) write(ctx context.Context, method, key string, value []byte, want int, opts []Option) error {
	o := callOpts(opts)
	q := url.Values{"id": {key}}
	o.query(q)
	if o.ttl != 0 && method == http.MethodPut {
		if o.ttl < time.Second || o.ttl%time.Second != 0 {
			return fmt.Errorf("dhtkv: ttl %v: want a whole number of seconds, 1s or more", o.ttl)
		}
		q.Set("ttl", strconv.FormatInt(int64(o.ttl/time.Second), 10))
	}
	a, err := c.roundTrip(ctx, method, "/v0/entity", q, value, false)
	if err != nil {
		return err
	}
	if a.code == want {
		return nil
	}
	return a.err(method)
}

// answer is what an endpoint answered.
type answer struct {
	endpoint string
	code     int
	header   http.Header
	body     []byte         // the whole body (not streamed)
	resp     *http.Response // streamed: the open response, the caller closes its body
}

// err turns an answer that is not the call's success into its error.
func (a answer) err(method string) error {
	switch {
	case a.code == http.StatusGatewayTimeout:
		// The node's reason (which replicas failed and why, or a clock
		// not verified by a majority) is the operator's only clue; the
		// error still matches ErrNotEnoughReplicas (errors.Is).
		// A bare "not enough replicas" adds nothing to the error's own.
		r := reason(a.body)
		if r == "not enough replicas" {
			return ErrNotEnoughReplicas
		}
		if r = strings.TrimPrefix(r, "not enough replicas: "); r != "" {
			return fmt.Errorf("%w: %s", ErrNotEnoughReplicas, r)
		}
		return ErrNotEnoughReplicas
	case a.code >= 400 && a.code < 500:
		return &BadRequestError{StatusCode: a.code, Reason: reason(a.body)}
	}
	return fmt.Errorf("dhtkv: %s via %s: unexpected answer %d %s", method, a.endpoint, a.code, reason(a.body))
}

// reason is the first line of a node's error body.
func reason(body []byte) string {
	line, _, _ := bytes.Cut(body, []byte("\n"))
	return string(bytes.TrimSpace(line))
}

// failsOver says whether a status is the endpoint's failure, which
// another endpoint may not have (see the package's Failover).
func failsOver(code int) bool {
	return code == http.StatusInternalServerError || code == http.StatusBadGateway || code == http.StatusServiceUnavailable ||
		code == http.StatusInsufficientStorage || code == http.StatusTooManyRequests
}

// roundTrip sends the request to the preferred endpoint, and to the next
// ones while they fail (failsOver, or no answer). A streamed answer keeps
// its body open for the caller; otherwise the body is read whole, and a
// body cut short counts as no answer.
func (c *Client) roundTrip(ctx context.Context, method, path string, q url.Values, body []byte, stream bool) (answer, error) {
	n := len(c.endpoints)
	first := int(c.preferred.Load())
	failures := make([]string, 0, n)
	full := 0 // endpoints that answered 507
	for i := range n {
		idx := (first + i) % n
		a, err := c.try(ctx, c.endpoints[idx], method, path, q, body, stream)
		if errors.Is(err, ErrAnswerTooLarge) {
			return answer{}, fmt.Errorf("dhtkv: %s %s via %s: %w", method, path, c.endpoints[idx], err)
		}
		if err == nil && !failsOver(a.code) {
			if idx != first {
				c.preferred.Store(int32(idx))
			}
			return a, nil
		}
		if ctx.Err() != nil {
			return answer{}, fmt.Errorf("dhtkv: %s %s: %w", method, path, ctx.Err())
		}
		if err == nil {
			err = fmt.Errorf("%d %s", a.code, reason(a.body))
			if a.code == http.StatusInsufficientStorage {
				full++
			}
		}
		failures = append(failures, c.endpoints[idx]+": "+err.Error())
	}
	if full == n {
		return answer{}, fmt.Errorf("%w: %w: %s %s: %s", ErrUnavailable, ErrInsufficientStorage, method, path, strings.Join(failures, "; "))
	}
	return answer{}, fmt.Errorf("%w: %s %s: %s", ErrUnavailable, method, path, strings.Join(failures, "; "))
}

// expectContinueBytes is the size from which a value is announced before
// it is sent (Expect: 100-continue): a node refuses a value over its
// --max-value-bytes from the announced length alone (413), and the value
// is then never sent. Without it, a large value the node refuses is still
// being sent when the answer comes, and a node that closes the connection
// meanwhile makes the client see a reset instead of the 413 (dhtkv
// lingers before closing, docs/http.md; a proxy in front may not), which
// would fail over to another endpoint. Below it the extra round trip
// costs more than sending the value does. curl's threshold is the same.
const expectContinueBytes = 1 << 20

// try sends the request to one endpoint. An answer that fails over has
// its body read and closed even when streamed.
func (c *Client) try(ctx context.Context, endpoint, method, path string, q url.Values, body []byte, stream bool) (answer, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, endpoint+path+"?"+q.Encode(), rd)
	if err != nil {
		return answer{}, err
	}
	if c.authorization != "" {
		req.Header["Authorization"] = []string{c.authorization}
	}
	if method == http.MethodPut {
		req.ContentLength = int64(len(body)) // an empty value is a 0-byte body, not none
		if len(body) >= expectContinueBytes {
			req.Header.Set("Expect", "100-continue")
		}
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return answer{}, unwrapURLError(err)
	}
	a := answer{endpoint: endpoint, code: resp.StatusCode, header: resp.Header}
	if stream && resp.StatusCode == http.StatusOK {
		a.resp = resp
		return a, nil
	}
	defer resp.Body.Close()
	if a.body, err = c.readAnswer(resp); err != nil {
		return answer{}, err
	}
	if method == http.MethodHead && len(a.body) == 0 {
		// An answer to HEAD has no body: a node puts its reason in a
		// header instead.
		a.body = []byte(resp.Header.Get(errorHeader))
	}
	return a, nil
}

// readAnswer reads resp's whole body, at most MaxRecordBytes of it: a
// longer one, announced or not, is ErrAnswerTooLarge, and the rest of it
// is not read (closing the body then closes the connection).
func (c *Client) readAnswer(resp *http.Response) ([]byte, error) {
	limit := int64(c.maxRecord)
	// An answer to HEAD has no body: its Content-Length is the length
	// of the value a GET would send (Stat's Size), not of anything read.
	head := resp.Request != nil && resp.Request.Method == http.MethodHead
	if !head && resp.ContentLength > limit {
		return nil, fmt.Errorf("%w: %d bytes announced, limit %d", ErrAnswerTooLarge, resp.ContentLength, limit)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("reading the answer: %w", err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%w: more than %d bytes", ErrAnswerTooLarge, limit)
	}
	return b, nil
}

// unwrapURLError drops net/http's *url.Error wrapper, whose message
// repeats the method and the whole URL, key included.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

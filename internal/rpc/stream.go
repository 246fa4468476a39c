package rpc

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/time/rate"

	"github.com/dhtkv/dhtkv/internal/pace"
	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/scan"
	"github.com/dhtkv/dhtkv/internal/store"
)

// StreamPath streams a node's own records, tombstones included, in the
// binary framing (package scan) with record envelopes as values, in key
// order, in the key range [start, end): what a coordinator merges for a
// cluster-wide range scan (docs/range-scans.md). With parts (partition.Set's
// text) it carries only the records of those partitions, and nothing of
// the others: what a node copies in bulk when a membership change gives it
// partitions or it rebuilds its share (package partcopy). A rebuilding
// node refuses its stream (ErrRebuilding): its records are not yet all
// its replica holds. With parts and partial, for another node's rebuild,
// it sends them all the same: the writes it took while rebuilding may be
// on it and on the asking node alone, which lost them (package rebuild).
//
//	GET /v0/internal/entities?start=S[&end=E][&parts=P[&partial=1]] → 200 + binary-framed envelopes
const StreamPath = "/v0/internal/entities"

// OpenStream opens the local store's records that a StreamPath query asks
// for: a key range, of some partitions only if it names them. The caller streams them in
// scan.FormatInternal and must close the iterator. A bad query is an
// *Error.
func (s *Server) OpenStream(query *fasthttp.Args) (scan.Iterator, error) {
	if s.Rebuilding != nil && s.Rebuilding() && !(query.Has("parts") && query.Has("partial")) {
		return nil, refuse(http.StatusServiceUnavailable, errRebuilding)
	}
	start, err := s.streamKey(query, "start")
	if err != nil {
		return nil, err
	}
	var end []byte
	if query.Has("end") {
		if end, err = s.streamKey(query, "end"); err != nil {
			return nil, err
		}
	}
	if query.Has("parts") {
		parts, err := partition.ParseSet(query.Peek("parts"))
		if err != nil {
			return nil, refuse(http.StatusBadRequest, "parts: %v", err)
		}
		it, err := s.Replica.Store.NewPartitionIter(start, end, parts)
		if err != nil || s.StreamPace == nil {
			return it, err
		}
		return &pacedIter{Iter: it, pace: s.StreamPace}, nil
	}
	return s.Replica.Store.NewIter(start, end)
}

// pacedIter is a store iterator whose Next waits for its record's bytes
// of pace. Release, Close and the rest are the store iterator's.
type pacedIter struct {
	*store.Iter
	pace *rate.Limiter
}

func (p *pacedIter) Next() bool {
	if !p.Iter.Next() {
		return false
	}
	// No context: a wait lasts one record's bytes at the rate, and the
	// stream ends at the next write once its client left. An error (a
	// burst below one byte) leaves the record unpaced.
	_ = pace.WaitBytes(context.Background(), p.pace, len(p.Key())+len(p.Envelope()))
	return true
}

func (s *Server) streamKey(query *fasthttp.Args, name string) ([]byte, error) {
	k := query.Peek(name)
	if len(k) == 0 || len(k) > s.MaxKeyBytes {
		return nil, refuse(http.StatusBadRequest, "%s of %d bytes (1 to %d allowed)", name, len(k), s.MaxKeyBytes)
	}
	return k, nil
}

// StreamOptions configures the client that opens other nodes' streams.
type StreamOptions struct {
	// OpenTimeout bounds connecting and receiving the response headers
	// (the replica timeout: a node that cannot start a stream within it
	// counts as not answering).
	OpenTimeout time.Duration
	// IdleTimeout bounds each read of the body: a node that sends nothing
	// for this long fails the scan. The whole stream has no deadline, a
	// range may take any time.
	IdleTimeout time.Duration
	// Secret is sent in SecretHeader when set.
	Secret string
	// Dial connects to a node's host:port (default: TCP); see
	// PeerOptions.Dial.
	Dial func(addr string, timeout time.Duration) (net.Conn, error)
	// MaxKey and MaxEnvelope bound the lengths the decoder accepts.
	MaxKey, MaxEnvelope int
	// TLS, when set, makes every connection TLS with this configuration,
	// handshaken within OpenTimeout (see PeerOptions.TLS). The default
	// value is nil: plain HTTP.
	TLS *tls.Config
}

// StreamClient opens internal streams on other nodes.
//
// It uses net/http rather than fasthttp's HostClient: a streamed body is a
// plain io.ReadCloser there, a chunked body cut before its last chunk reads
// as io.ErrUnexpectedEOF, Close on an unfinished body drops the connection
// (which tells the other node to stop), and no request deadline keeps
// running under a long stream. fasthttp's StreamResponseBody keeps
// ReadTimeout and the request deadline active while the body is read, and
// ties the body to a pooled Response whose release must be sequenced by
// hand; the per-record cost it would save is irrelevant next to the merge.
type StreamClient struct {
	o  StreamOptions
	hc *http.Client
	tr *http.Transport
}

// NewStreamClient prepares a client; Close releases its idle connections.
func NewStreamClient(o StreamOptions) *StreamClient {
	dialer := &net.Dialer{Timeout: o.OpenTimeout}
	dial := dialer.DialContext
	if o.Dial != nil {
		dial = func(ctx context.Context, _, addr string) (net.Conn, error) { return o.Dial(addr, o.OpenTimeout) }
	}
	idle := o.IdleTimeout
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &idleConn{Conn: c, idle: idle}, nil
		},
		ResponseHeaderTimeout: o.OpenTimeout,
		// Used for the https:// URLs Open makes when o.TLS is set; the
		// handshake runs over DialContext's connection, idle deadlines
		// included. HTTP/2 stays off (a custom dialer and TLS config
		// disable it unless forced): nodes speak HTTP/1.1.
		TLSClientConfig:     o.TLS,
		TLSHandshakeTimeout: o.OpenTimeout,
		// gzip would spend both nodes' CPU, the scarce resource, to save
		// bandwidth between nodes.
		DisableCompression:  true,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
	}
	// A stream is asked of one member: a redirect is not followed, which
	// would send SecretHeader to wherever the answer points (net/http
	// forwards every header but Authorization and cookies).
	hc := &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return &StreamClient{o: o, tr: tr, hc: hc}
}

// Close drops idle connections.
func (c *StreamClient) Close() { c.tr.CloseIdleConnections() }

// Open starts the internal stream of the node at baseURL (http://host:port,
// over TLS when StreamOptions.TLS is set) for [start, end) and returns it once the node answered 200. Cancelling
// ctx aborts the stream at any point.
//
// epoch is the cluster map's of the caller, sent in EpochHeader like every
// node-to-node request's; a stream is not refused for an old one: it reads
// only the other node's own records, whatever the placement, and the
// caller merges every node's.
func (c *StreamClient) Open(ctx context.Context, baseURL string, epoch uint64, start, end []byte) (scan.Iterator, error) {
	q := "start=" + url.QueryEscape(string(start))
	if end != nil {
		q += "&end=" + url.QueryEscape(string(end))
	}
	return c.open(ctx, baseURL, epoch, q)
}

// OpenParts starts the internal stream of every record of parts on the
// node at baseURL, as Open does a range (every non-empty key). The node
// leaves out the records of other partitions; one of a release without
// partition streams ignores parts and sends its whole store, which the
// caller must filter (partcopy does). partial asks a rebuilding node for
// its records all the same (StreamPath); without it, such a node refuses
// with ErrRebuilding.
func (c *StreamClient) OpenParts(ctx context.Context, baseURL string, epoch uint64, parts *partition.Set, partial bool) (scan.Iterator, error) {
	q := "start=%00&parts=" + parts.String()
	if partial {
		q += "&partial=1"
	}
	return c.open(ctx, baseURL, epoch, q)
}

func (c *StreamClient) open(ctx context.Context, baseURL string, epoch uint64, query string) (scan.Iterator, error) {
	u := transportURL(baseURL, c.o.TLS) + StreamPath + "?" + query
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("open scan on %s: %w", baseURL, err)
	}
	if c.o.Secret != "" {
		req.Header.Set(SecretHeader, c.o.Secret)
	}
	if epoch > 0 {
		req.Header.Set(EpochHeader, strconv.FormatUint(epoch, 10))
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("open scan on %s: %w", baseURL, err)
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable && bytes.HasPrefix(msg, []byte(errRebuilding)) {
			return nil, fmt.Errorf("open scan on %s: %w", baseURL, ErrRebuilding)
		}
		return nil, fmt.Errorf("open scan on %s: status %d: %q", baseURL, resp.StatusCode, msg)
	}
	d := scan.NewDecoder(bufio.NewReaderSize(resp.Body, 64<<10), c.o.MaxKey, c.o.MaxEnvelope)
	return scan.NewDecoderIterator(d, resp.Body, baseURL), nil
}

// idleConn sets a fresh read deadline before every read, so a stream may
// last as long as the other node keeps sending.
type idleConn struct {
	net.Conn
	idle time.Duration
}

func (c *idleConn) Read(p []byte) (int, error) {
	if c.idle > 0 {
		if err := c.Conn.SetReadDeadline(time.Now().Add(c.idle)); err != nil {
			return 0, err
		}
	}
	return c.Conn.Read(p)
}

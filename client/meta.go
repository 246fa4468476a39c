package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// The headers a node answers a GET or HEAD of a key with, besides ETag
// (the version) and Content-Length (the value's size).
const (
	expiresAtHeader = "X-Dhtkv-Expires-At" // RFC 3339, UTC, milliseconds
	ttlHeader       = "X-Dhtkv-TTL"        // whole seconds left, rounded up
	errorHeader     = "X-Dhtkv-Error"      // a HEAD's reason for a 4xx or 5xx
)

// Meta is what a node knows of a key's live value besides the value.
type Meta struct {
	// Version is the write's version, unique to it across the cluster and
	// higher for a later write of the key (last-write-wins orders by it).
	// It is the HTTP answer's ETag, "Version" in decimal.
	Version uint64
	// Size is the value's length in bytes.
	Size int64
	// ExpiresAt is when a value written with a ttl expires, to the
	// millisecond; the zero time for one that does not.
	ExpiresAt time.Time
	// TTL is the time left until ExpiresAt, in whole seconds rounded up,
	// as the node saw it when it answered; 0 for a value that does not
	// expire.
	TTL time.Duration
}

// Stat returns key's metadata without its value (a HEAD request: the
// node reads the key as a GET would, with the same ack and from, and
// answers only the headers). ErrNotFound when the key is absent, deleted
// or expired.
func (c *Client) Stat(ctx context.Context, key string, opts ...Option) (Meta, error) {
	o := callOpts(opts)
	q := url.Values{"id": {key}}
	o.query(q)
	a, err := c.roundTrip(ctx, http.MethodHead, "/v0/entity", q, nil, false)
	if err != nil {
		return Meta{}, err
	}
	switch a.code {
	case http.StatusOK:
		return parseMeta(a.header)
	case http.StatusNotFound:
		return Meta{}, ErrNotFound
	}
	return Meta{}, a.err(http.MethodHead)
}

// parseMeta reads a 200 answer's metadata headers.
func parseMeta(h http.Header) (Meta, error) {
	var m Meta
	etag := h.Get("ETag")
	v, err := strconv.ParseUint(strings.Trim(etag, `"`), 10, 64)
	if err != nil || len(etag) < 3 || etag[0] != '"' || etag[len(etag)-1] != '"' {
		return Meta{}, fmt.Errorf("dhtkv: the node's ETag %q is not a quoted version", etag)
	}
	m.Version = v
	if m.Size, err = strconv.ParseInt(h.Get("Content-Length"), 10, 64); err != nil {
		return Meta{}, fmt.Errorf("dhtkv: the node's Content-Length %q: %w", h.Get("Content-Length"), err)
	}
	if exp := h.Get(expiresAtHeader); exp != "" {
		if m.ExpiresAt, err = time.Parse(time.RFC3339Nano, exp); err != nil {
			return Meta{}, fmt.Errorf("dhtkv: the node's %s: %w", expiresAtHeader, err)
		}
		secs, err := strconv.ParseInt(h.Get(ttlHeader), 10, 64)
		if err != nil {
			return Meta{}, fmt.Errorf("dhtkv: the node's %s %q: %w", ttlHeader, h.Get(ttlHeader), err)
		}
		m.TTL = time.Duration(secs) * time.Second
	}
	return m, nil
}

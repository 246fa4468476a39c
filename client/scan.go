package client

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"net/url"
	"strconv"

	"github.com/dhtkv/dhtkv/internal/scan/framing"
)

// Record is one key and its value, as Scan yields them.
type Record struct {
	Key   []byte
	Value []byte
}

// ErrTruncated is in the error of a Scan whose stream ended early: the node
// serving it failed or stopped, or a node it merged from did. The records
// yielded before are correct, but others are missing.
var ErrTruncated = framing.ErrTruncated

// WithLimit makes a Scan yield at most n records (n > 0; a node refuses
// more than 1000000000 with a *BadRequestError). The node applies it (the
// API's limit) and ends the stream after n records, as a complete one;
// the client also stops after n, should a node ignore the parameter.
//
// To page through a range, scan again from the last key yielded with a
// zero byte appended: the smallest key after it.
func WithLimit(n int) Option { return func(o *callOptions) { o.limit = n } }

// WithLocal makes a Scan read one node's own replica (the API's
// scope=local) instead of the whole cluster's merged data: the records
// that node holds, which may be stale or, with from below the cluster
// size, a part of the keys. WithAck and WithFrom do not apply to it (the
// node refuses them, 400).
func WithLocal() Option { return func(o *callOptions) { o.local = true } }

// FirstKey is the smallest key there can be (keys are never empty): a
// range from it holds every key. The API requires a range's start, so a
// scan from the beginning names it (start=%00).
const FirstKey = "\x00"

// Scan returns an iterator over the live records with start <= key < end,
// in byte order of the keys: start "" is FirstKey, end "" is past the
// last one. By default the records are the cluster's, merged by key,
// newest version winning (the API's scope=cluster): complete when at most
// from-ack nodes fail to answer, else it yields ErrNotEnoughReplicas
// before any record. WithAck and WithFrom set those; WithLocal reads one
// node; WithLimit stops after so many records.
//
// The scan runs when the iterator is ranged over, once per range loop.
// It yields each record with a nil error, and at most one error, last:
// the request's error (as for Get, failover included, before the first
// record) or the stream's (ErrTruncated when it ended early; no failover
// then, as records were already yielded). Breaking out of the loop closes
// the stream. Each Record is the caller's to keep. ctx bounds the whole
// scan.
//
// Scan reads the API's binary framing (format=binary), whose end marker
// tells a complete stream from a truncated one.
func (c *Client) Scan(ctx context.Context, start, end string, opts ...Option) iter.Seq2[Record, error] {
	o := callOpts(opts)
	q := url.Values{"format": {"binary"}}
	if start == "" {
		start = FirstKey
	}
	q.Set("start", start)
	if end != "" {
		q.Set("end", end)
	}
	if o.limit > 0 {
		q.Set("limit", strconv.Itoa(o.limit))
	}
	if !o.local {
		q.Set("scope", "cluster")
	}
	o.query(q)
	return func(yield func(Record, error) bool) {
		a, err := c.roundTrip(ctx, http.MethodGet, "/v0/entities", q, nil, true)
		if err != nil {
			yield(Record{}, err)
			return
		}
		if a.resp == nil { // not a 200: no stream
			yield(Record{}, a.err(http.MethodGet))
			return
		}
		defer a.resp.Body.Close()
		d := framing.NewDecoder(a.resp.Body, c.maxRecord, c.maxRecord)
		// The loop reads past the limit-th record to the end marker, so
		// that a limited stream is checked complete like any other.
		for n := 0; ; n++ {
			if !d.Next() {
				if err := d.Err(); err != nil {
					if errors.Is(err, framing.ErrTooLarge) {
						err = fmt.Errorf("%w: %w", ErrAnswerTooLarge, err)
					}
					yield(Record{}, fmt.Errorf("dhtkv: scan via %s: %w", a.endpoint, err))
				}
				return
			}
			if o.limit > 0 && n >= o.limit {
				return // a node that does not know limit
			}
			k, v := d.Key(), d.Value()
			buf := make([]byte, len(k)+len(v)) // one allocation per record
			copy(buf, k)
			copy(buf[len(k):], v)
			if !yield(Record{Key: buf[:len(k):len(k)], Value: buf[len(k):]}, nil) {
				return
			}
		}
	}
}

package httpapi

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/record"
)

// apiError is a client error: a status and a one-line reason for the body.
type apiError struct {
	code   int
	reason string
}

func (e *apiError) Error() string { return e.reason }

func badRequest(format string, args ...any) *apiError {
	return &apiError{fasthttp.StatusBadRequest, fmt.Sprintf(format, args...)}
}

func tooLarge(limit int) *apiError {
	return &apiError{fasthttp.StatusRequestEntityTooLarge, fmt.Sprintf("value too large: limit is %d bytes", limit)}
}

// entityParams are the parsed query of /v0/entity.
type entityParams struct {
	key       []byte // aliases the request's buffer
	ack, from int
	// ackGiven: the request named ack; without it ack is the default as
	// of the map the parse was made by, which a read takes again from
	// the map it is routed by (cluster.Coordinator.Get's ack 0).
	ackGiven bool
}

// checkQuery refuses a raw query string that fasthttp would decode
// leniently, and parameters the endpoint does not know (known lists them).
//
// fasthttp v1.74.0 keeps a '%' that does not start an escape of two hex
// digits as it is, so "id=%G1" would name the key "%G1" where the client
// meant something else: 400. An unknown parameter is most likely a typo
// ("acks=3" for "ack=3") that would otherwise silently get the default:
// 400 naming it. A known parameter given twice with different values is
// refused too: nothing says which one the client meant. Parameters are
// compared decoded ("%61ck" is "ack").
func checkQuery(raw []byte, args *fasthttp.Args, known ...string) *apiError {
	for i := bytes.IndexByte(raw, '%'); i >= 0; i = nextPercent(raw, i+1) {
		if i+2 < len(raw) && isHex(raw[i+1]) && isHex(raw[i+2]) {
			continue
		}
		start := bytes.LastIndexByte(raw[:i], '&') + 1
		end := len(raw)
		if j := bytes.IndexAny(raw[i+1:], "&="); j >= 0 {
			end = i + 1 + j
		}
		name := raw[start:]
		if j := bytes.IndexAny(name, "&="); j >= 0 {
			name = name[:j]
		}
		return badRequest("bad percent-encoding in %q: %q", name, raw[i:min(i+3, end)])
	}
	n := 0
	for _, k := range known {
		if args.Has(k) {
			n++
		}
	}
	if args.Len() == n {
		return nil // the common case: no loop over the arguments
	}
	for k := range args.All() {
		if !isOneOf(k, known) {
			return badRequest("unknown parameter %q: the parameters are %s", k, strings.Join(known, ", "))
		}
	}
	// Known parameters given more than once: each must mean the same
	// every time, or nothing says which the client meant (?id=a&id=b).
	// ttl and verbose have rules of their own that say when two
	// spellings agree (parseTTL, queryparam.Bool).
	for _, k := range known {
		if k == "ttl" || k == "verbose" {
			continue
		}
		if vs := args.PeekMulti(k); len(vs) > 1 {
			for _, v := range vs[1:] {
				if !bytes.Equal(v, vs[0]) {
					return badRequest("%s given %d times with different values: give it once", k, len(vs))
				}
			}
		}
	}
	return nil
}

func nextPercent(b []byte, from int) int {
	if i := bytes.IndexByte(b[from:], '%'); i >= 0 {
		return from + i
	}
	return -1
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c|0x20 && c|0x20 <= 'f'
}

func isOneOf(k []byte, set []string) bool {
	for _, s := range set {
		if string(k) == s {
			return true
		}
	}
	return false
}

// parseKey reads the id parameter. fasthttp has already percent-decoded it,
// so keys are arbitrary bytes.
func parseKey(args *fasthttp.Args, name string, maxKey int) ([]byte, *apiError) {
	if !args.Has(name) {
		return nil, badRequest("missing %s parameter", name)
	}
	key := args.Peek(name)
	if len(key) == 0 {
		return nil, badRequest("empty %s parameter", name)
	}
	if len(key) > maxKey {
		return nil, badRequest("%s is %d bytes, limit is %d", name, len(key), maxKey)
	}
	return key, nil
}

// parseEntity reads id, ack and from from the query, raw as sent and
// parsed into args; any other parameter is an error (checkQuery) but ttl,
// which the handler reads (parseTTL).
func parseEntity(raw []byte, args *fasthttp.Args, replicas, maxAck, maxKey int) (entityParams, *apiError) {
	key, aerr := parseKey(args, "id", maxKey)
	if aerr != nil {
		return entityParams{}, aerr
	}
	if aerr := checkQuery(raw, args, "id", "ack", "from", "ttl"); aerr != nil {
		return entityParams{}, aerr
	}
	ack, from, aerr := parseReplication(args, replicas, maxAck)
	if aerr != nil {
		return entityParams{}, aerr
	}
	return entityParams{key: key, ack: ack, from: from, ackGiven: args.Has("ack")}, nil
}

// parseReplication reads ack and from: from defaults to the replication
// factor (the first --cluster's size or --replicas at the cluster's start,
// until dhtkvctl replicas changes it),
// ack to a majority of from (from/2+1); both must be numbers with
// 1 <= ack <= from <= replicas and ack <= maxAck.
//
// replicas is the coordinator's Factors' from, and maxAck the same for a
// write and, for a read, the factor of the set it reads: below replicas
// only while a replicas change is under way and reads still ask the
// smaller, old set (placement.Sets). A read's default ack is then cut to
// maxAck (docs/membership.md); an ack asked above it is refused, not cut.
func parseReplication(args *fasthttp.Args, replicas, maxAck int) (ack, from int, _ *apiError) {
	from = replicas
	if args.Has("from") {
		n, err := parsePositive(args.Peek("from"))
		if err != nil {
			return 0, 0, badRequest("from: %v", err)
		}
		if n > replicas {
			return 0, 0, badRequest("from=%d exceeds the cluster's replication factor %d (dhtkvctl cluster prints it)", n, replicas)
		}
		from = n
	}
	ack = min(from/2+1, maxAck)
	if args.Has("ack") {
		n, err := parsePositive(args.Peek("ack"))
		if err != nil {
			return 0, 0, badRequest("ack: %v", err)
		}
		if n > from {
			return 0, 0, badRequest("ack=%d exceeds from=%d", n, from)
		}
		if n > maxAck {
			return 0, 0, badRequest("ack=%d exceeds %d: the replication factor is changing between %d and %d, and at this stage of the change a read asks the set of %d", n, maxAck, maxAck, replicas, maxAck)
		}
		ack = n
	}
	return ack, from, nil
}

func parsePositive(b []byte) (int, error) {
	if len(b) == 0 || len(b) > 4 {
		return 0, fmt.Errorf("%q is not a number from 1 to 9999", b)
	}
	n, err := strconv.Atoi(string(b))
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%q is not a number from 1 to 9999", b)
	}
	return n, nil
}

// MaxTTL is the longest ttl a PUT may ask for: ten years, the longest a
// replica takes (record.MaxTTL).
const MaxTTL = record.MaxTTL

// TTLHeader carries a PUT's ttl for clients that cannot add a query
// parameter; the same rules as ?ttl apply.
const TTLHeader = "X-Dhtkv-TTL"

// parseTTL reads the ttl of a PUT, in whole seconds from 1 to MaxTTL, from
// the ttl parameter or TTLHeader (headers: every field of it, as
// RequestHeader.PeekAll gives them; 0: none given). Every value given, of
// a repeated parameter or header included, must be the same: sources that
// disagree are refused, so that none silently wins (the first of a
// repeated header or parameter would otherwise).
func parseTTL(args *fasthttp.Args, headers [][]byte) (time.Duration, *apiError) {
	var q []byte
	hasQuery := args.Has("ttl")
	if hasQuery {
		q = args.Peek("ttl")
		for k, v := range args.All() { // no allocation, unlike PeekMulti
			if string(k) == "ttl" && !bytes.Equal(v, q) {
				return 0, badRequest("ttl=%q and ttl=%q disagree", q, v)
			}
		}
	}
	if !hasQuery && len(headers) == 0 {
		return 0, nil
	}
	for _, h := range headers {
		switch {
		case hasQuery && !bytes.Equal(h, q):
			return 0, badRequest("ttl=%q and %s: %q disagree", q, TTLHeader, h)
		case !hasQuery && !bytes.Equal(h, headers[0]):
			return 0, badRequest("%s: %q and %s: %q disagree", TTLHeader, headers[0], TTLHeader, h)
		}
	}
	if !hasQuery {
		q = headers[0]
	}
	n, err := strconv.ParseInt(string(q), 10, 64)
	if err != nil || n < 1 || n > int64(MaxTTL/time.Second) {
		return 0, badRequest("ttl %q is not a whole number of seconds from 1 to %d", q, int64(MaxTTL/time.Second))
	}
	return time.Duration(n) * time.Second, nil
}

package httpapi

import (
	"fmt"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
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

// entityParams are the parsed query of /v0/entity.
type entityParams struct {
	key       []byte // aliases the request's buffer
	ack, from int
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

// parseEntity reads id, ack and from.
func parseEntity(args *fasthttp.Args, replicas, maxKey int) (entityParams, *apiError) {
	key, aerr := parseKey(args, "id", maxKey)
	if aerr != nil {
		return entityParams{}, aerr
	}
	ack, from, aerr := parseReplication(args, replicas)
	if aerr != nil {
		return entityParams{}, aerr
	}
	return entityParams{key: key, ack: ack, from: from}, nil
}

// parseReplication reads ack and from: from defaults to the replication
// factor (--replicas, the cluster size unless set),
// ack to a majority of from (from/2+1); both must be numbers with
// 1 <= ack <= from <= replicas.
func parseReplication(args *fasthttp.Args, replicas int) (ack, from int, _ *apiError) {
	from = replicas
	if args.Has("from") {
		n, err := parsePositive(args.Peek("from"))
		if err != nil {
			return 0, 0, badRequest("from: %v", err)
		}
		if n > replicas {
			return 0, 0, badRequest("from=%d exceeds the replication factor %d (the cluster size unless --replicas is set)", n, replicas)
		}
		from = n
	}
	ack = from/2 + 1
	if args.Has("ack") {
		n, err := parsePositive(args.Peek("ack"))
		if err != nil {
			return 0, 0, badRequest("ack: %v", err)
		}
		if n > from {
			return 0, 0, badRequest("ack=%d exceeds from=%d", n, from)
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

// MaxTTL is the longest ttl a PUT may ask for: ten years.
const MaxTTL = 10 * 365 * 24 * time.Hour

// TTLHeader carries a PUT's ttl for clients that cannot add a query
// parameter; the same rules as ?ttl apply.
const TTLHeader = "X-Dhtkv-TTL"

// parseTTL reads the ttl of a PUT, in whole seconds from 1 to MaxTTL, from
// the ttl parameter or TTLHeader (0: none given). Both given is refused
// unless they agree, so that neither silently wins.
func parseTTL(args *fasthttp.Args, header []byte) (time.Duration, *apiError) {
	var q []byte
	hasQuery := args.Has("ttl")
	if hasQuery {
		q = args.Peek("ttl")
	}
	if !hasQuery && header == nil {
		return 0, nil
	}
	if hasQuery && header != nil && string(q) != string(header) {
		return 0, badRequest("ttl=%q and %s: %q disagree", q, TTLHeader, header)
	}
	if !hasQuery {
		q = header
	}
	n, err := strconv.ParseInt(string(q), 10, 64)
	if err != nil || n < 1 || n > int64(MaxTTL/time.Second) {
		return 0, badRequest("ttl %q is not a whole number of seconds from 1 to %d", q, int64(MaxTTL/time.Second))
	}
	return time.Duration(n) * time.Second, nil
}

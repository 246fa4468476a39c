package httpapi

import (
	"fmt"
	"strconv"

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

func tooLarge(limit int) *apiError {
	return &apiError{fasthttp.StatusRequestEntityTooLarge, fmt.Sprintf("value too large: limit is %d bytes", limit)}
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
func parseEntity(args *fasthttp.Args, clusterSize, maxKey int) (entityParams, *apiError) {
	key, aerr := parseKey(args, "id", maxKey)
	if aerr != nil {
		return entityParams{}, aerr
	}
	ack, from, aerr := parseReplication(args, clusterSize)
	if aerr != nil {
		return entityParams{}, aerr
	}
	return entityParams{key: key, ack: ack, from: from}, nil
}

// parseReplication reads ack and from: from defaults to the cluster size,
// ack to a majority of from (from/2+1); both must be numbers with
// 1 <= ack <= from <= cluster size.
func parseReplication(args *fasthttp.Args, clusterSize int) (ack, from int, _ *apiError) {
	from = clusterSize
	if args.Has("from") {
		n, err := parsePositive(args.Peek("from"))
		if err != nil {
			return 0, 0, badRequest("from: %v", err)
		}
		if n > clusterSize {
			return 0, 0, badRequest("from=%d exceeds cluster size %d", n, clusterSize)
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

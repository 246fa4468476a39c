package httpapi

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"log/slog"
	"math"
	"math/rand/v2"
	"time"

	"github.com/valyala/fasthttp"
)

// AccessLogOptions configures the access log: one line per sampled
// request, through the node's logger (so in its --log-format: json gives
// one JSON object per line), at level info under the message "access".
type AccessLogOptions struct {
	// Sample is the fraction of requests logged, from 0 to 1
	// (--access-log-sample): each request is logged with this
	// probability, independently. The default value is 0: off, which
	// costs the request path one comparison.
	Sample float64
}

// DefaultAccessLogOptions returns the defaults AccessLogOptions documents.
func DefaultAccessLogOptions() AccessLogOptions { return AccessLogOptions{} }

// RegisterFlags defines --access-log-sample with o's value as its default.
func (o *AccessLogOptions) RegisterFlags(fs *flag.FlagSet) {
	fs.Float64Var(&o.Sample, "access-log-sample", o.Sample, "fraction of requests, 0 to 1, logged as one line each (method, path, op, status, latency, key if at most 64 bytes, ack/from, the reason of a failure; never a value) at level info (0: off)")
}

// Validate refuses a fraction outside [0, 1].
func (o *AccessLogOptions) Validate() error {
	if math.IsNaN(o.Sample) || o.Sample < 0 || o.Sample > 1 {
		return errors.New("--access-log-sample must be from 0 to 1")
	}
	return nil
}

// AccessLogKeyMaxBytes is the longest key the access log writes; a longer
// one is logged by its length alone (key_len), so that a log line stays
// short and large keys, which may embed data, stay out of the logs.
const AccessLogKeyMaxBytes = 64

// reqInfo is what the handlers learn of a request that its access-log
// line reports: the key and the replication of an entity request. The
// key aliases the request's buffer, valid until Handler returns.
type reqInfo struct {
	key       []byte
	ack, from int
}

// sampled reports whether this request is logged.
func (s *Server) sampled() bool {
	p := s.AccessLog.Sample
	return p > 0 && (p >= 1 || rand.Float64() < p)
}

// logAccess writes the access-log line of an answered request. Nothing
// here runs unless the request was sampled.
func (s *Server) logAccess(ctx *fasthttp.RequestCtx, op Op, info *reqInfo, elapsed time.Duration) {
	code := ctx.Response.StatusCode()
	attrs := make([]slog.Attr, 0, 12)
	attrs = append(attrs,
		slog.String("method", string(ctx.Method())),
		slog.String("path", string(ctx.Path())),
		slog.String("op", op.String()),
		slog.Int("status", code),
		slog.Duration("latency", elapsed),
		slog.String("remote", ctx.RemoteAddr().String()),
	)
	if n := ctx.Request.Header.ContentLength(); n > 0 {
		attrs = append(attrs, slog.Int("bytes_in", n))
	}
	if info.key != nil {
		if len(info.key) <= AccessLogKeyMaxBytes {
			attrs = append(attrs, slog.String("key", string(info.key)))
		}
		attrs = append(attrs, slog.Int("key_len", len(info.key)))
	}
	if info.ack > 0 {
		attrs = append(attrs, slog.Int("ack", info.ack), slog.Int("from", info.from))
	}
	if code >= 400 && !ctx.Response.IsBodyStream() {
		// The answer's one-line reason: for a 504, how many replicas
		// answered of how many asked and which failed, and why.
		line, _, _ := bytes.Cut(ctx.Response.Body(), []byte("\n"))
		attrs = append(attrs, slog.String("err", string(line)))
	}
	s.Log.LogAttrs(context.Background(), slog.LevelInfo, "access", attrs...)
}

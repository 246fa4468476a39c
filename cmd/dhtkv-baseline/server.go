package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/valyala/fasthttp"
)

// The fasthttp settings below are the defaults of dhtkv's flags (see
// internal/node): a comparison is only fair if both servers read, time out
// and bound requests alike. TestSettingsMatchDhtkv keeps them in step.
const (
	readTimeout    = 30 * time.Second
	writeTimeout   = 30 * time.Second
	idleTimeout    = 2 * time.Minute
	maxHeaderBytes = 8 << 10 // request line and headers must fit in the read buffer
	maxKeyBytes    = 1024
	// shutdownGrace bounds how long a stop waits for requests in flight.
	shutdownGrace = 10 * time.Second
)

// config is what the flags set.
type config struct {
	listen        string
	maxValueBytes int
}

func defaultConfig() config {
	return config{listen: "127.0.0.1:18080", maxValueBytes: 16 << 20}
}

// api answers dhtkv's public entity and status endpoints from a memStore,
// with dhtkv's status codes: GET 200 with the value or 404, PUT 201,
// DELETE 202, and 400, 405 or 413 for requests dhtkv would refuse.
type api struct {
	data *memStore
}

func (a *api) handle(ctx *fasthttp.RequestCtx) {
	switch string(ctx.Path()) {
	case "/v0/entity":
		a.entity(ctx)
	case "/v0/status":
		if ctx.IsGet() || ctx.IsHead() {
			ctx.SetBodyString("OK\n")
			return
		}
		refuseMethod(ctx, "GET, HEAD")
	default:
		ctx.Error("unknown path\n", fasthttp.StatusBadRequest)
	}
}

func (a *api) entity(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() && !ctx.IsPut() && !ctx.IsDelete() {
		refuseMethod(ctx, "GET, PUT, DELETE")
		return
	}
	// Replication parameters (ack, from) are accepted and ignored: there
	// is one copy.
	key := ctx.QueryArgs().Peek("id")
	if len(key) == 0 || len(key) > maxKeyBytes {
		ctx.Error("id parameter missing, empty or too long\n", fasthttp.StatusBadRequest)
		return
	}
	switch {
	case ctx.IsGet():
		v, ok := a.data.load(key)
		if !ok {
			ctx.Error("not found\n", fasthttp.StatusNotFound)
			return
		}
		ctx.SetBody(v) // copies into the response buffer
	case ctx.IsPut():
		a.data.store(key, ctx.PostBody())
		ctx.SetStatusCode(fasthttp.StatusCreated)
	default:
		a.data.remove(key)
		ctx.SetStatusCode(fasthttp.StatusAccepted)
	}
}

func refuseMethod(ctx *fasthttp.RequestCtx, allow string) {
	ctx.Error("method not allowed\n", fasthttp.StatusMethodNotAllowed)
	ctx.Response.Header.Set(fasthttp.HeaderAllow, allow)
}

// readError answers a request fasthttp could not read: a body over the
// limit is 413, as dhtkv answers it, and anything else a bad request.
func readError(ctx *fasthttp.RequestCtx, err error) {
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		ctx.Error("value too large\n", fasthttp.StatusRequestEntityTooLarge)
		return
	}
	ctx.Error("malformed request\n", fasthttp.StatusBadRequest)
}

// newServer configures fasthttp as dhtkv does, around a fresh, empty store.
func newServer(cfg config, log *slog.Logger) *fasthttp.Server {
	a := &api{data: newMemStore()}
	return &fasthttp.Server{
		Handler:                      a.handle,
		ErrorHandler:                 readError,
		Name:                         "dhtkv-baseline",
		MaxRequestBodySize:           cfg.maxValueBytes,
		ReadBufferSize:               maxHeaderBytes,
		ReadTimeout:                  readTimeout,
		WriteTimeout:                 writeTimeout,
		IdleTimeout:                  idleTimeout,
		NoDefaultContentType:         true,
		DisablePreParseMultipartForm: true,
		CloseOnShutdown:              true,
		Logger:                       fasthttpLog{log},
	}
}

// serve answers requests on ln until ctx ends, then stops accepting and
// waits up to shutdownGrace for the requests in flight.
func serve(ctx context.Context, ln net.Listener, cfg config, log *slog.Logger) error {
	srv := newServer(cfg, log)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		if err == nil {
			err = errors.New("server stopped by itself")
		}
		return fmt.Errorf("serve on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.ShutdownWithContext(stopCtx); err != nil {
		return fmt.Errorf("shut down: %w", err)
	}
	if err := <-served; err != nil {
		return fmt.Errorf("serve on %s: %w", ln.Addr(), err)
	}
	return nil
}

// fasthttpLog sends fasthttp's own messages (connection errors and the
// like) to slog at debug level, as dhtkv does.
type fasthttpLog struct{ log *slog.Logger }

func (f fasthttpLog) Printf(format string, args ...any) {
	f.log.Debug(fmt.Sprintf(format, args...), "component", "fasthttp")
}

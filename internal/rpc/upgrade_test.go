package rpc

import (
	"context"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
)

// serveUpgrades serves s's LogPath on an in-memory listener (whose peers
// are not loopback TCP addresses: a secret is what lets them in) and
// returns a dialer to it.
// serveUpgrades serves s's log upgrades on an in-memory listener, and
// returns its dialer and the status the handler left on the last request
// (what the request metrics see).
func serveUpgrades(t *testing.T, s *Server) (func(string, time.Duration) (net.Conn, error), *atomic.Int64) {
	ln := fasthttputil.NewInmemoryListener()
	status := new(atomic.Int64)
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if s.Accept(ctx, LogPath) {
			s.HandleLogUpgrade(ctx)
		}
		status.Store(int64(ctx.Response.StatusCode()))
	}, ReadTimeout: time.Second, WriteTimeout: time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = srv.Shutdown()
		<-done
	})
	return func(string, time.Duration) (net.Conn, error) { return ln.Dial() }, status
}

// The upgrade's rules: the internal endpoints' authentication, the
// upgrade headers, a node without a log; and an upgraded connection
// carries bytes both ways once the log's listener took it.
func TestLogUpgrade(t *testing.T) {
	logConns := NewLogListener("n1:1")
	t.Cleanup(func() { logConns.Close() })
	dial, status := serveUpgrades(t, &Server{Secret: "s3cret", LogConns: logConns})
	noLog, _ := serveUpgrades(t, &Server{Secret: "s3cret"})

	for _, tc := range []struct {
		name   string
		dial   func(string, time.Duration) (net.Conn, error)
		secret string
		raw    string // a request of its own instead of DialLog's
		want   string // in the error; "" for an upgrade
	}{
		{name: "no secret", dial: dial, want: "403"},
		{name: "wrong secret", dial: dial, secret: "nope", want: "403"},
		{name: "no log", dial: noLog, secret: "s3cret", want: "503"},
		{name: "GET", dial: dial, raw: "GET " + LogPath + " HTTP/1.1\r\nHost: n1\r\nX-Dhtkv-Secret: s3cret\r\n\r\n", want: "405"},
		{name: "no Upgrade header", dial: dial, raw: "POST " + LogPath + " HTTP/1.1\r\nHost: n1\r\nX-Dhtkv-Secret: s3cret\r\nContent-Length: 0\r\n\r\n", want: "400"},
		{name: "upgraded", dial: dial, secret: "s3cret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.raw != "" {
				c, err := tc.dial("n1:1", time.Second)
				require.NoError(t, err)
				defer c.Close()
				_, err = io.WriteString(c, tc.raw)
				require.NoError(t, err)
				require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
				b := make([]byte, 64)
				n, _ := c.Read(b)
				require.Contains(t, string(b[:n]), " "+tc.want+" ")
				return
			}
			c, err := DialLog(context.Background(), "n1:1", 5*time.Second, LogDialOptions{Dial: tc.dial, Secret: tc.secret})
			if tc.want != "" {
				require.Error(t, err)
				require.Contains(t, err.Error(), tc.want)
				return
			}
			require.NoError(t, err)
			defer c.Close()
			require.Equal(t, int64(fasthttp.StatusSwitchingProtocols), status.Load(), "counted as the 101 it is")
			srv, err := logConns.Accept()
			require.NoError(t, err)
			defer srv.Close()
			_, err = io.WriteString(c, "hello")
			require.NoError(t, err)
			got := make([]byte, 5)
			_, err = io.ReadFull(srv, got)
			require.NoError(t, err)
			require.Equal(t, "hello", string(got))
			_, err = io.WriteString(srv, "back")
			require.NoError(t, err)
			got = make([]byte, 4)
			_, err = io.ReadFull(c, got)
			require.NoError(t, err)
			require.Equal(t, "back", string(got))
		})
	}
	require.True(t, headerHasToken("keep-alive, Upgrade", "upgrade"))
	require.False(t, headerHasToken("keep-alive", "upgrade"))
	require.True(t, strings.EqualFold(LogProtocol, "DHTKV-MAPLOG/1"))
}

// A dial's upgrade ends when its context does: a node stopping does not
// wait out the timeout for a peer that accepts the connection and never
// answers (maplog.Network.Interrupt).
func TestDialLogEndsWithItsContext(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		// The upgrade's request read, then held open, never answered.
		_, _ = c.Read(make([]byte, 16))
		accepted <- c
	}()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := DialLog(ctx, ln.Addr().String(), time.Hour, LogDialOptions{})
		done <- err
	}()
	c := <-accepted
	defer c.Close()
	cancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
		require.ErrorContains(t, err, "upgrade "+ln.Addr().String()+" to the cluster map's log")
	case <-time.After(time.Minute): // the dial's own timeout is an hour
		t.Fatal("the dial did not end with its context")
	}
}

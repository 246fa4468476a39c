package rpc

import (
	"bufio"
	"net"
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/dhtkv/dhtkv/internal/record"
)

// One write of a batch that the replica refuses for its size (a value
// over the replica's --max-value-bytes, which may be lower than the
// coordinator's, say during a rolling change of the flag) must fail
// alone: its batch-mates, other clients' valid writes, must get their
// own results. (The whole batch used to be answered 413, so every mate
// was told "refused", rpc.IsRefused, the coordinator then keeping no
// hint, and none of them was stored.)
func TestOversizedWriteLeavesItsBatchMates(t *testing.T) {
	srv, st, _, _ := lateServer(t)
	srv.MaxValueBytes = 100 // this replica's limit; the coordinator's is larger
	ln := fasthttputil.NewInmemoryListener()
	served := make(chan error, 1)
	var handlers sync.WaitGroup
	go func() {
		served <- fasthttp.Serve(ln, func(ctx *fasthttp.RequestCtx) {
			handlers.Add(1)
			defer handlers.Done()
			srv.HandleBatch(ctx, ctx.PostBody())
		})
	}()
	defer func() { require.NoError(t, ln.Close()); <-served; handlers.Wait() }()
	p := NewPeer("http://127.0.0.1:1", PeerOptions{Timeout: 2 * time.Second,
		Dial: func(string, time.Duration) (net.Conn, error) { return ln.Dial() }}, nil)
	defer p.Close()

	v, err := srv.Replica.Clock.Next()
	require.NoError(t, err)
	deadline := time.Now().Add(2 * time.Second)
	big := p.newCall(OpWrite, []byte("big"), (&record.Record{Version: v, Value: make([]byte, 200)}).Encode(), 0, deadline)
	small := p.newCall(OpWrite, []byte("small"), (&record.Record{Version: v, Value: []byte("ok")}).Encode(), 0, deadline)
	// The sender's batch: both calls queued at the same moment.
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	p.send([]*call{big, small}, req, resp, nil, false)
	<-big.done
	<-small.done

	_, bigErr := p.writeResult(big)
	require.True(t, IsRefused(bigErr), "the oversized write is refused: %v", bigErr)
	_, smallErr := p.writeResult(small)
	require.NoError(t, smallErr, "a valid write batched with an oversized one gets its own result")
	_, found, err := st.Version([]byte("small"))
	require.NoError(t, err)
	require.True(t, found, "the valid batch-mate is stored")
}

// A peer's answer to a batch or a ping is bounded before this node
// allocates it: fasthttp's client allocates a response body's announced
// Content-Length (rounded up) before it reads a byte of it, so without
// a bound one answer from a misbehaving peer (or whatever listens at a
// dead peer's address) announcing 2 GiB made this node allocate 2 GiB
// per call, and one announcing more than the address space panicked the
// sender's goroutine (makeslice), ending the node.
func TestPeerAnswerOverLimitIsRefusedUnallocated(t *testing.T) {
	const announced = 2 << 30
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_ = req.Body.Close()
					// The header only: the body never comes.
					if _, err := c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2147483648\r\n\r\n")); err != nil {
						return
					}
				}
			}()
		}
	}()
	p := NewPeer("http://"+ln.Addr().String(), PeerOptions{Timeout: 200 * time.Millisecond}, nil)
	defer p.Close()

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, pingErr := p.Ping(0, time.Now().Add(200*time.Millisecond))
	_, _, getErr := p.Get([]byte("k"), 0, time.Now().Add(200*time.Millisecond))
	runtime.ReadMemStats(&after)

	require.Error(t, pingErr)
	require.Error(t, getErr)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(announced/8),
		"allocated for answers announced at %d bytes and never sent", announced)
}

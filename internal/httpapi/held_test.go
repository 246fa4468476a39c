package httpapi_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// TestHeldValuesBudget: clients that ask for a large value and never read
// the answer hold it in the node until --write-timeout, one per
// connection; --max-inflight-response-bytes bounds what they hold
// together. Two stalled answers of an 8 MiB value (more than loopback's
// socket buffers take, so neither write can end) fill a 16 MiB budget, a
// third GET is refused with 503 and the reason, and once a stalled client
// goes away its charge is returned and the value is served whole again.
func TestHeldValuesBudget(t *testing.T) {
	const size = 8 << 20
	c := testcluster.Start(t, 1, func(_ int, cfg *node.Config) {
		cfg.MaxValueBytes = size
		cfg.MaxInflightResponseBytes = 2 * size
	})
	value := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	cl := testcluster.NewClient(t)
	require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), "big", value, 1, 1))
	held := func() float64 { return c.Metric(t, 0, "dhtkv_response_held_bytes") }
	require.Zero(t, held())

	addr := c.Config(0).Listen
	stalled := make([]io.Closer, 2)
	for i := range stalled {
		conn := testcluster.Dial(t, addr, 4096)
		_, err := io.WriteString(conn, "GET /v0/entity?id=big HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
		stalled[i] = conn
		want := float64((i + 1) * size)
		require.Eventually(t, func() bool { return held() == want }, 10*time.Second, 10*time.Millisecond,
			"stalled answer %d is charged", i)
	}

	code, body := cl.Get(t, c.URL(0), "big", 1, 1)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, "values being sent exceed this node's budget (--max-inflight-response-bytes); retry later\n", string(body))
	require.Equal(t, float64(2*size), held(), "a refusal holds nothing")

	require.NoError(t, stalled[0].Close())
	require.Eventually(t, func() bool { return held() == size }, 10*time.Second, 10*time.Millisecond,
		"the charge of an answer whose client went away is returned")
	code, body = cl.Get(t, c.URL(0), "big", 1, 1)
	require.Equal(t, http.StatusOK, code)
	require.True(t, bytes.Equal(value, body), "the value, whole")
	require.Eventually(t, func() bool { return held() == size }, 10*time.Second, 10*time.Millisecond,
		"an answer read whole returns its charge")

	require.NoError(t, stalled[1].Close())
	require.Eventually(t, func() bool { return held() == 0 }, 10*time.Second, 10*time.Millisecond)
	// A value under RawValueMinBytes is copied, not charged.
	require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), "small", []byte("v"), 1, 1))
	code, body = cl.Get(t, c.URL(0), "small", 1, 1)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "v", string(body))
	require.Zero(t, held())
}

// TestBatchAnswersChargedToResponseBudget: an internal batch that reads a
// large value is answered with a copy of it, held until its client has
// read it. Clients of the internal endpoint (any process on the machine
// without --cluster-secret-file, or whoever holds the secret) that ask
// and never read made the node hold one answer per connection, uncounted
// by --max-inflight-response-bytes, which bounds the same thing for GETs
// (8 such clients of an 8 MiB value: 64 MiB of heap against a 16 MiB
// budget, dhtkv_response_held_bytes 0). The answers are charged to the
// budget now: two stalled answers fill it, a third batch and a public GET
// get 503 with the reason, and a client that goes away returns its charge.
func TestBatchAnswersChargedToResponseBudget(t *testing.T) {
	const size = 8 << 20
	c := testcluster.Start(t, 1, func(_ int, cfg *node.Config) {
		cfg.MaxValueBytes = size
		cfg.MaxInflightResponseBytes = 2*size + 1024 // two answers: a value and its framing each
	})
	value := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	cl := testcluster.NewClient(t)
	require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), "big", value, 1, 1))
	held := func() float64 { return c.Metric(t, 0, "dhtkv_response_held_bytes") }
	const batch = "g\x03big"
	req := fmt.Sprintf("POST /v0/internal/batch HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(batch), batch)

	addr := c.Config(0).Listen
	stalled := make([]io.Closer, 2)
	for i := range stalled {
		conn := testcluster.Dial(t, addr, 4096)
		_, err := io.WriteString(conn, req)
		require.NoError(t, err)
		stalled[i] = conn
		require.Eventually(t, func() bool { return held() > float64(i*size) }, 10*time.Second, 10*time.Millisecond,
			"stalled batch answer %d is charged", i)
	}
	conn := testcluster.Dial(t, addr, 0)
	_, err := io.WriteString(conn, req)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Equal(t, "answers being sent exceed this node's budget (--max-inflight-response-bytes); retry later\n", string(body))
	code, _ := cl.Get(t, c.URL(0), "big", 1, 1)
	require.Equal(t, http.StatusServiceUnavailable, code, "the budget is shared with GETs")

	require.NoError(t, stalled[0].Close())
	require.NoError(t, stalled[1].Close())
	require.Eventually(t, func() bool { return held() == 0 }, 10*time.Second, 10*time.Millisecond,
		"the charges of answers whose clients went away are returned")
	code, got := cl.Get(t, c.URL(0), "big", 1, 1)
	require.Equal(t, http.StatusOK, code)
	require.True(t, bytes.Equal(value, got))
}

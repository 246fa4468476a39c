package client_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// A value over the node's --max-value-bytes is a 413, *BadRequestError
// with the node's reason, and is not sent to another endpoint: the
// refusal is about the request, which every node refuses. Before, a value
// one byte over the default 16 MiB mostly came back as "connection reset
// by peer" (the node closed while the client was still sending), which
// failed over to the next endpoint, and ended as ErrUnavailable. The
// client now announces a large value (Expect: 100-continue) and the node
// refuses it from its length before any of it is sent, so this holds
// even against a node that closes at once (--linger-timeout 0).
func TestValueTooLargeNotRetried(t *testing.T) {
	const limit = 16 << 20
	value := make([]byte, limit+1)
	for _, linger := range []time.Duration{0, node.DefaultConfig().LingerTimeout} {
		c := testcluster.Start(t, 2, func(_ int, cfg *node.Config) {
			cfg.MaxValueBytes = limit
			cfg.LingerTimeout = linger
		})
		ctx := ctxFor(t)
		cl := testcluster.NewAPIClient(t, c.URL(0), c.URL(1))
		for i := range 3 {
			err := cl.Put(ctx, "big", value)
			var bad *client.BadRequestError
			require.ErrorAs(t, err, &bad, "linger %v, try %d", linger, i)
			assert.Equal(t, 413, bad.StatusCode)
			assert.Equal(t, "value too large: limit is 16777216 bytes", bad.Reason)
			assert.NotErrorIs(t, err, client.ErrUnavailable)
		}
		assert.Zero(t, c.Metric(t, 1, "dhtkv_requests_total", "op", "put"), "linger %v: the other endpoint was not asked", linger)
		// A large value within the limit is announced too, and stored
		// after the node's 100 Continue.
		require.NoError(t, cl.Put(ctx, "large", value[:2<<20], client.WithAck(1)))
		got, err := cl.Get(ctx, "large", client.WithAck(1))
		require.NoError(t, err)
		require.Len(t, got, 2<<20)
	}
}

// Stat sends HEAD: the node answers the value's length in Content-Length
// and no body. A value longer than Config.MaxRecordBytes is still Stat'ed
// (nothing of it is read); it was refused as ErrAnswerTooLarge from the
// announced length, so `dhtkvctl get --meta` failed on large values.
func TestStatOfAValueOverMaxRecordBytes(t *testing.T) {
	_, ep := testcluster.Single(t)
	ctx := ctxFor(t)
	const limit = 64 << 10
	big := make([]byte, limit+1)
	require.NoError(t, testcluster.NewAPIClient(t, ep).Put(ctx, "big", big))
	cl, err := client.New(client.Config{Endpoints: []string{ep}, MaxRecordBytes: limit})
	require.NoError(t, err)
	defer cl.Close()
	m, err := cl.Stat(ctx, "big")
	require.NoError(t, err, "HEAD of a large value transfers nothing")
	assert.Equal(t, int64(limit+1), m.Size)
	// Get of it is refused, as documented.
	_, err = cl.Get(ctx, "big")
	require.ErrorIs(t, err, client.ErrAnswerTooLarge)
}

// Config.MaxRecordBytes: "the longest key and the largest value a Scan
// accepts from a node ... A larger answer fails the call with
// ErrAnswerTooLarge". A scanned record over it says so (it was the
// decoder's plain error, and dhtkvctl's hint to raise --max-answer-bytes
// never showed on a scan).
func TestScanOfARecordOverMaxRecordBytes(t *testing.T) {
	_, ep := testcluster.Single(t)
	ctx := ctxFor(t)
	const limit = 64 << 10
	require.NoError(t, testcluster.NewAPIClient(t, ep).Put(ctx, "big", make([]byte, limit+1)))
	cl, err := client.New(client.Config{Endpoints: []string{ep}, MaxRecordBytes: limit})
	require.NoError(t, err)
	defer cl.Close()
	var last error
	for _, err := range cl.Scan(ctx, "", "") {
		if err != nil {
			last = err
		}
	}
	require.Error(t, last)
	assert.ErrorIs(t, last, client.ErrAnswerTooLarge)
}

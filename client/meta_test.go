package client_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// WithTTL and Stat against a real cluster: a value put with a ttl reports
// its expiry and the time left, one without none; a rewrite has a higher
// version; absent, deleted and expired keys are ErrNotFound; a refused
// Stat carries the node's reason (from a header: HEAD answers have no
// body); a ttl the API cannot express fails before anything is sent.
func TestTTLAndStat(t *testing.T) {
	c := testcluster.Start(t, 3)
	ctx := ctxFor(t)
	// The first endpoint is down: Stat fails over like Get.
	cl := testcluster.NewAPIClient(t, testcluster.DeadEndpoint(t), c.URL(0), c.URL(1))

	require.NoError(t, cl.Put(ctx, "plain", []byte("hello")))
	m1, err := cl.Stat(ctx, "plain", client.WithAck(3))
	require.NoError(t, err)
	assert.Positive(t, m1.Version)
	assert.Equal(t, int64(5), m1.Size)
	assert.True(t, m1.ExpiresAt.IsZero())
	assert.Zero(t, m1.TTL)

	before := time.Now()
	require.NoError(t, cl.Put(ctx, "plain", []byte("hello, again"), client.WithTTL(time.Hour)))
	m2, err := cl.Stat(ctx, "plain")
	require.NoError(t, err)
	assert.Greater(t, m2.Version, m1.Version, "a rewrite has a higher version")
	assert.Equal(t, int64(12), m2.Size)
	assert.WithinDuration(t, before.Add(time.Hour), m2.ExpiresAt, 2*time.Second)
	assert.True(t, m2.TTL > time.Hour-2*time.Second && m2.TTL <= time.Hour, "time left %v", m2.TTL)
	got, err := cl.Get(ctx, "plain")
	require.NoError(t, err)
	assert.Equal(t, "hello, again", string(got))

	require.NoError(t, cl.Put(ctx, "gone", []byte("v")))
	require.NoError(t, cl.Delete(ctx, "gone"))
	require.NoError(t, cl.Put(ctx, "brief", []byte("v"), client.WithTTL(time.Second)))
	for _, key := range []string{"absent", "gone", "brief"} {
		testcluster.Eventually(t, 5*time.Second, key+" not found", func() bool {
			_, err := cl.Stat(ctx, key)
			return errors.Is(err, client.ErrNotFound)
		})
	}
	_, err = cl.Get(ctx, "brief")
	assert.ErrorIs(t, err, client.ErrNotFound, "expired")

	_, err = cl.Stat(ctx, "plain", client.WithAck(4))
	var bad *client.BadRequestError
	require.ErrorAs(t, err, &bad)
	assert.Equal(t, 400, bad.StatusCode)
	assert.Equal(t, "ack=4 exceeds from=3", bad.Reason)
	_, err = cl.Stat(ctx, strings.Repeat("k", 1025))
	require.ErrorAs(t, err, &bad)
	assert.Contains(t, bad.Reason, "limit is 1024")

	for _, ttl := range []time.Duration{1500 * time.Millisecond, 500 * time.Millisecond, -time.Second} {
		err := cl.Put(ctx, "bad-ttl", []byte("v"), client.WithTTL(ttl))
		assert.ErrorContains(t, err, "want a whole number of seconds", "%v", ttl)
		assert.False(t, errors.As(err, &bad), "%v: refused before sending", ttl)
	}
	err = cl.Put(ctx, "bad-ttl", []byte("v"), client.WithTTL(11*365*24*time.Hour))
	require.ErrorAs(t, err, &bad, "over ten years: the node refuses")
	assert.Contains(t, bad.Reason, "is not a whole number of seconds from 1 to")
	_, err = cl.Stat(ctx, "bad-ttl")
	assert.ErrorIs(t, err, client.ErrNotFound, "nothing stored")

	// Other calls ignore WithTTL.
	_, err = cl.Stat(ctx, "plain", client.WithTTL(time.Minute))
	assert.NoError(t, err)
	assert.NoError(t, cl.Delete(ctx, "plain", client.WithTTL(time.Minute)))
}

// Stat through a node that cannot reach enough replicas is
// ErrNotEnoughReplicas, as Get.
func TestStatNotEnoughReplicas(t *testing.T) {
	c := testcluster.Start(t, 3)
	ctx := ctxFor(t)
	cl := testcluster.NewAPIClient(t, c.URL(0))
	require.NoError(t, cl.Put(ctx, "k", []byte("v")))
	c.StopNode(2)
	_, err := cl.Stat(ctx, "k", client.WithAck(3))
	assert.ErrorIs(t, err, client.ErrNotEnoughReplicas)
}

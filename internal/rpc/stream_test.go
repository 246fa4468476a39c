package rpc

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
	"golang.org/x/time/rate"

	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/scan"
)

// A partition stream takes its records' bytes from StreamPace; a range
// scan's stream takes nothing; both stream what the store holds.
func TestOpenStreamPace(t *testing.T) {
	s, want := summaryServer(t, 500)
	// A rate of a byte a second and a large burst: the tokens taken show what was
	// paced, and no wait happens.
	const burst = 1 << 20
	s.StreamPace = rate.NewLimiter(1, burst) // full at first; a byte a second
	s.MaxKeyBytes = 1024
	drain := func(it scan.Iterator) (keys, bytes int) {
		t.Helper()
		defer it.Close()
		for it.Next() {
			keys++
			bytes += len(it.Key()) + len(it.Envelope())
		}
		require.NoError(t, it.Err())
		return keys, bytes
	}
	open := func(query string) scan.Iterator {
		t.Helper()
		var args fasthttp.Args
		args.Parse(query)
		it, err := s.OpenStream(&args)
		require.NoError(t, err)
		return it
	}

	keys, _ := drain(open("start=%00"))
	require.Equal(t, len(want), keys)
	require.InDelta(t, burst, s.StreamPace.Tokens(), 1, "a range scan's stream is not paced")

	var all partition.Set
	for p := range partition.Count {
		all.Add(partition.ID(p))
	}
	it := open("start=%00&parts=" + all.String())
	_, ok := it.(scan.Releaser)
	require.True(t, ok, "a paced stream still releases its snapshot")
	keys, bytes := drain(it)
	require.Equal(t, len(want), keys)
	require.InDelta(t, burst-bytes, s.StreamPace.Tokens(), 1, "a partition stream takes its bytes")
}

// A node that refuses its stream because it rebuilds is told apart from
// one that fails (package rebuild does not wait for it); any other 503 is
// a failure like the rest.
func TestOpenPartsRefusedAsRebuilding(t *testing.T) {
	for _, tc := range []struct {
		body       string
		rebuilding bool
	}{
		{errRebuilding + "\n", true},
		{"node shutting down\n", false},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, tc.body, http.StatusServiceUnavailable)
		}))
		c := NewStreamClient(StreamOptions{OpenTimeout: 5 * time.Second, IdleTimeout: 5 * time.Second, MaxKey: 1024, MaxEnvelope: 1 << 20})
		_, err := c.OpenParts(context.Background(), srv.URL, 1, partition.SetOf(1), false)
		require.Error(t, err)
		require.Equal(t, tc.rebuilding, errors.Is(err, ErrRebuilding), "%q: %v", tc.body, err)
		c.Close()
		srv.Close()
	}
}

// TestOpenStreamOfRebuildingNode: a rebuilding node refuses its stream
// (503, ErrRebuilding's text): to a cluster scan, to a range, to a
// membership change's copy of partitions. Asked for partitions with
// partial, for another node's rebuild, it sends the records it holds.
func TestOpenStreamOfRebuildingNode(t *testing.T) {
	s, want := summaryServer(t, 50)
	s.MaxKeyBytes = 1024
	s.Rebuilding = func() bool { return true }
	all := partition.SetOf()
	for p := range partition.ID(partition.Count) {
		all.Add(p)
	}
	for _, q := range []string{"start=%00", "start=%00&partial=1", "start=%00&parts=" + all.String()} {
		var args fasthttp.Args
		args.Parse(q)
		_, err := s.OpenStream(&args)
		e, ok := IsRefusal(err)
		require.True(t, ok, "%s: %v", q, err)
		require.Equal(t, http.StatusServiceUnavailable, e.Status, q)
		require.Equal(t, errRebuilding, e.Msg, q)
	}
	var args fasthttp.Args
	args.Parse("start=%00&parts=" + all.String() + "&partial=1")
	it, err := s.OpenStream(&args)
	require.NoError(t, err)
	defer it.Close()
	got := 0
	for it.Next() {
		got++
	}
	require.NoError(t, it.Err())
	require.Equal(t, len(want), got, "what it holds, all of it")
}

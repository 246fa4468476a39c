package client_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// A node whose disk is full (or failed) refuses to coordinate a write
// with 507: the client writes through the next endpoint. When every
// endpoint refuses, the error says so: ErrUnavailable and
// ErrInsufficientStorage, with each node's reason.
func TestClientFailsOverOn507(t *testing.T) {
	var fullCalls, okCalls atomic.Int32
	full := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fullCalls.Add(1)
		http.Error(w, "insufficient storage: the data volume has 1 MiB free of 1 GiB", http.StatusInsufficientStorage)
	}))
	defer full.Close()
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		okCalls.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	defer ok.Close()
	ctx := ctxFor(t)

	require.NoError(t, testcluster.NewAPIClient(t, full.URL, ok.URL).Put(ctx, "k", []byte("v")))
	require.Equal(t, int32(1), fullCalls.Load())
	require.Equal(t, int32(1), okCalls.Load())

	err := testcluster.NewAPIClient(t, full.URL, full.URL).Put(ctx, "k", []byte("v"))
	require.ErrorIs(t, err, client.ErrUnavailable)
	require.ErrorIs(t, err, client.ErrInsufficientStorage)
	require.Contains(t, err.Error(), "507 insufficient storage: the data volume has 1 MiB free of 1 GiB")

	err = testcluster.NewAPIClient(t, full.URL, testcluster.DeadEndpoint(t)).Put(ctx, "k", []byte("v"))
	require.ErrorIs(t, err, client.ErrUnavailable)
	require.NotErrorIs(t, err, client.ErrInsufficientStorage, "one endpoint did not answer: it may have room")
}

// An answer longer than Config.MaxRecordBytes, announced by its length
// or sent chunked, fails the call with ErrAnswerTooLarge, and the client
// neither reads it whole nor asks the next endpoint. One within the
// limit is read.
func TestAnswerTooLarge(t *testing.T) {
	const limit = 4 << 10
	var calls atomic.Int32
	big := func(chunked bool) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			n := limit + 1
			if r.URL.Query().Get("id") == "fits" {
				n = limit
			}
			if !chunked {
				w.Header().Set("Content-Length", strconv.Itoa(n))
			}
			w.WriteHeader(http.StatusOK)
			for range n / 512 {
				_, _ = w.Write(make([]byte, 512))
				if f, ok := w.(http.Flusher); ok && chunked {
					f.Flush()
				}
			}
			_, _ = w.Write(make([]byte, n%512))
		}))
	}
	second := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("the second endpoint was asked: %s", r.URL)
	}))
	defer second.Close()
	ctx := ctxFor(t)
	for _, chunked := range []bool{false, true} {
		s := big(chunked)
		cl, err := client.New(client.Config{Endpoints: []string{s.URL, second.URL}, MaxRecordBytes: limit})
		require.NoError(t, err)
		calls.Store(0)
		_, err = cl.Get(ctx, "k")
		require.ErrorIs(t, err, client.ErrAnswerTooLarge, "chunked %v", chunked)
		require.NotErrorIs(t, err, client.ErrUnavailable)
		require.Equal(t, int32(1), calls.Load())
		got, err := cl.Get(ctx, "fits")
		require.NoError(t, err, "chunked %v", chunked)
		require.Len(t, got, limit)
		cl.Close()
		s.Close()
	}
}

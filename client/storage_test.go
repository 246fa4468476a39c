package client_test

import (
	"net/http"
	"net/http/httptest"
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

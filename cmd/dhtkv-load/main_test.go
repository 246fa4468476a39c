package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFillOnly checks that --fill N --fill-only writes exactly the keys
// k0..k<N-1> that the wrk scripts read, each once with --value-size bytes,
// and sends nothing else.
func TestFillOnly(t *testing.T) {
	var mu sync.Mutex
	puts := make(map[string]int)
	var others int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if r.Method != http.MethodPut || r.URL.Path != "/v0/entity" || len(body) != 100 {
			others++
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		puts[r.URL.Query().Get("id")]++
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	var stdout, stderr bytes.Buffer
	code := run([]string{"--targets", srv.URL, "--fill", "50", "--fill-only", "--value-size", "100", "--connections", "4"}, &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	assert.Empty(t, stdout.String(), "no run, so no report")

	mu.Lock()
	defer mu.Unlock()
	assert.Zero(t, others, "requests other than the fill's PUTs")
	require.Len(t, puts, 50)
	for i := range 50 {
		assert.Equal(t, 1, puts["k"+strconv.Itoa(i)], "PUTs of k%d", i)
	}
}

func TestFillOnlyNeedsFill(t *testing.T) {
	var stderr bytes.Buffer
	assert.Equal(t, 2, run([]string{"--fill-only"}, io.Discard, &stderr))
	assert.Contains(t, stderr.String(), "--fill-only needs --fill")
}

package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The command's doc: exit 0 "when some request succeeded (a 2xx, or a 404
// for a GET)", 1 when none did. A PUT run against something that answers
// 404 to everything (a wrong port such as the admin listener, a proxy
// without the route) got no 2xx and no GET, yet exited 0: a 404 of any
// method counted as served.
func TestPutsAnswered404Fail(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	var stderr bytes.Buffer
	code := run([]string{"--targets", srv.URL, "--workload", "put", "--connections", "1", "--max-requests", "5", "--duration", "1s"}, io.Discard, &stderr)
	assert.Equal(t, 1, code, "every PUT answered 404: %s", stderr.String())
}

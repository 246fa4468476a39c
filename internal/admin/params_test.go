package admin

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// /repair's query: wait is a boolean (alone true), GET takes none, and
// anything else, malformed or unknown, is a 400 with a one-line reason
// that starts nothing.
func TestRepairQuery(t *testing.T) {
	var runs atomic.Int32
	srv := httptest.NewServer(RepairHandler(func(context.Context) any {
		runs.Add(1)
		return []string{}
	}, func() any { return []string{} }))
	defer srv.Close()
	const usage = "wait=false answers 202 at once, wait=true (the default) when the exchanges ended"
	for _, tc := range []struct {
		method, query string
		code          int
		reason        string // the body's start; "" for a JSON answer
	}{
		{"POST", "", 200, ""},
		{"POST", "wait", 200, ""},
		{"POST", "wait=", 200, ""},
		{"POST", "wait=1", 200, ""},
		{"POST", "wait=true", 200, ""},
		{"POST", "wait=0", 202, ""},
		{"POST", "wait=false", 202, ""},
		{"POST", "wait=FALSE", 202, ""},
		{"POST", "%77ait=0", 202, ""}, // %77 is w
		{"POST", "x=1", 400, `unknown parameter "x": ` + usage},
		{"POST", "wait=0&x=1", 400, `unknown parameter "x"`},
		{"POST", "wait=maybe", 400, `wait="maybe": want true or false (1 or 0; the name alone is true)`},
		{"POST", "wait=no", 400, `wait="no": want true or false`},
		{"POST", "wait=%00", 400, `wait="\x00": want true or false`},
		{"POST", "wait=%zz", 400, `malformed query: invalid URL escape "%zz"`},
		{"POST", "wait=0&wait=false", 202, ""},
		{"POST", "wait=0&wait", 400, "wait given 2 times with different values: give it once"},
		{"POST", "wait=0;x=1", 400, "malformed query: invalid semicolon separator in query"},
		{"GET", "", 200, ""},
		{"GET", "wait=0", 400, `unknown parameter "wait": GET /repair takes none`},
	} {
		name := tc.method + " ?" + tc.query
		before := runs.Load()
		req, err := http.NewRequest(tc.method, srv.URL+"/repair?"+tc.query, nil)
		require.NoError(t, err)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		assert.Equal(t, tc.code, resp.StatusCode, "%s: %s", name, body)
		if tc.reason == "" {
			assert.Equal(t, "application/json", resp.Header.Get("Content-Type"), name)
			continue
		}
		assert.True(t, strings.HasPrefix(string(body), tc.reason), "%s: %q", name, body)
		assert.Equal(t, 1, strings.Count(string(body), "\n"), "%s: one line", name)
		assert.False(t, strings.ContainsFunc(strings.TrimSuffix(string(body), "\n"), unicode.IsControl), "%s: no control character", name)
		assert.Equal(t, before, runs.Load(), "%s: nothing started", name)
	}
}

package httpapi_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/httpapi"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// Every ttl a PUT gives, each ttl parameter and each X-Dhtkv-TTL field
// sent on the wire, must agree: sources that disagree are refused with 400
// and a one-line reason naming both values, and nothing is stored (the
// first of a repeated header or parameter used to win silently). Sources
// that agree are one ttl.
func TestTTLSourcesAgree(t *testing.T) {
	c := testcluster.Start(t, 1)
	cl := testcluster.NewClient(t)
	for _, tc := range []struct {
		name, key, query string
		headers          []string
		code             int
		want             string // in a refusal's reason
	}{
		{"two headers that disagree", "k1", "", []string{"5", "6"}, 400, `X-Dhtkv-TTL: "5" and X-Dhtkv-TTL: "6" disagree`},
		{"three headers, the last differs", "k2", "", []string{"5", "5", "6"}, 400, `X-Dhtkv-TTL: "5" and X-Dhtkv-TTL: "6" disagree`},
		{"two parameters that disagree", "k3", "&ttl=5&ttl=6", nil, 400, `ttl="5" and ttl="6" disagree`},
		{"a parameter and headers, one disagreeing", "k4", "&ttl=5", []string{"5", "6"}, 400, `ttl="5" and X-Dhtkv-TTL: "6" disagree`},
		{"two headers that agree", "k5", "", []string{"5", "5"}, 201, ""},
		{"two parameters and a header that agree", "k6", "&ttl=5&ttl=5", []string{"5"}, 201, ""},
	} {
		req, err := http.NewRequest(http.MethodPut, c.URL(0)+"/v0/entity?id="+tc.key+tc.query, strings.NewReader("x"))
		require.NoError(t, err)
		for _, v := range tc.headers {
			req.Header.Add(httpapi.TTLHeader, v) // one field each on the wire
		}
		resp, err := cl.HTTP.Do(req)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, tc.code, resp.StatusCode, "%s: %s", tc.name, body)
		get, err := cl.HTTP.Get(c.URL(0) + "/v0/entity?id=" + tc.key)
		require.NoError(t, err)
		get.Body.Close()
		if tc.code != 201 {
			require.Contains(t, string(body), tc.want, tc.name)
			require.Equal(t, strings.Count(string(body), "\n"), 1, "%s: one line: %q", tc.name, body)
			require.Equal(t, http.StatusNotFound, get.StatusCode, "%s: nothing stored", tc.name)
			continue
		}
		require.Equal(t, http.StatusOK, get.StatusCode, tc.name)
		require.Contains(t, []string{"4", "5"}, get.Header.Get(httpapi.TTLHeader), tc.name)
	}
}

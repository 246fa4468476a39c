package httpapi_test

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/scan"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

func TestEntitiesLocalContract(t *testing.T) {
	c := testcluster.Start(t, 1)
	cl := testcluster.NewClient(t)
	base := c.URL(0)
	data := map[string]string{
		"a1": "one", "a2": "two\nlines\n", "a3": "deleted", "b1": "", "b2": "old",
		"c\x00zero": "bin\x00\xff", "c\xffhigh": "x", "c&amp=;": "q", "c sp+ace%": "s",
	}
	for k, v := range data {
		require.Equal(t, http.StatusCreated, cl.Put(t, base, k, []byte(v), 0, 0))
	}
	require.Equal(t, http.StatusAccepted, cl.Delete(t, base, "a3", 0, 0))
	delete(data, "a3")
	require.Equal(t, http.StatusCreated, cl.Put(t, base, "b2", []byte("new"), 0, 0))
	data["b2"] = "new"

	q := url.QueryEscape
	cases := []struct {
		name, method, query string
		status              int
		allow               string
		start, end          string // expected range for 200
		limit               int    // expected limit for 200; 0: none
	}{
		{name: "empty start", query: "start=", status: 400},
		{name: "no start", query: "", status: 400},
		{name: "no start, an end", query: "end=b", status: 400},
		{name: "empty end", query: "start=a&end=", status: 400},
		{name: "bad format", query: "start=a&format=xml", status: 400},
		{name: "bad scope", query: "start=a&scope=world", status: 400},
		{name: "empty limit", query: "start=a&limit=", status: 400},
		{name: "zero limit", query: "start=a&limit=0", status: 400},
		{name: "limit above the maximum", query: "start=a&limit=1000000001", status: 400},
		{name: "ack without cluster scope", query: "start=a&ack=1", status: 400},
		{name: "ack above from", query: "start=a&scope=cluster&from=1&ack=2", status: 400},
		{name: "from above cluster size", query: "start=a&scope=cluster&from=2", status: 400},
		{name: "two starts", query: "start=a&start=b", status: 400},
		{name: "two ends", query: "start=a&end=c&end=d", status: 400},
		{name: "the same start twice", query: "start=a&start=a", status: 200, start: "a"},
		{name: "POST", method: http.MethodPost, query: "start=a", status: 405, allow: "GET"},
		{name: "PUT", method: http.MethodPut, query: "start=a", status: 405, allow: "GET"},
		{name: "DELETE", method: http.MethodDelete, query: "start=a", status: 405, allow: "GET"},
		{name: "HEAD", method: http.MethodHead, query: "start=a", status: 405, allow: "GET"},
		{name: "first key as start", query: "start=" + q("\x00"), status: 200, start: "\x00"},
		{name: "first key as start, an end", query: "start=%00&end=b", status: 200, start: "\x00", end: "b"},
		{name: "no end: to the last key", query: "start=b", status: 200, start: "b"},
		{name: "end is exclusive", query: "start=a1&end=b2", status: 200, start: "a1", end: "b2"},
		{name: "deleted key absent", query: "start=a3&end=a4", status: 200, start: "a3", end: "a4"},
		{name: "empty range", query: "start=zz", status: 200, start: "zz"},
		{name: "start after end", query: "start=b&end=a", status: 200, start: "b", end: "a"},
		{name: "start equals end", query: "start=a1&end=a1", status: 200, start: "a1", end: "a1"},
		{name: "binary keys", query: "start=" + q("c\x00") + "&end=" + q("c\xff\xff"), status: 200, start: "c\x00", end: "c\xff\xff"},
		{name: "limit", query: "start=%00&limit=3", status: 200, start: "\x00", limit: 3},
		{name: "limit counts live records", query: "start=a2&limit=2", status: 200, start: "a2", limit: 2},
		{name: "limit on binary keys", query: "start=c&limit=2", status: 200, start: "c", limit: 2},
		{name: "limit beyond the range", query: "start=b&end=c&limit=1000000000", status: 200, start: "b", end: "c"},
		{name: "limit equal to the range", query: "start=b&end=c&limit=2", status: 200, start: "b", end: "c"},
		{name: "cluster scope of one", query: "start=a&scope=cluster", status: 200, start: "a"},
		{name: "cluster scope of one, first key, limit", query: "start=%00&scope=cluster&limit=4", status: 200, start: "\x00", limit: 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			method := tc.method
			if method == "" {
				method = http.MethodGet
			}
			if tc.status != 200 {
				req, err := http.NewRequest(method, base+"/v0/entities?"+tc.query, nil)
				require.NoError(t, err)
				resp, err := cl.HTTP.Do(req)
				require.NoError(t, err)
				resp.Body.Close()
				require.Equal(t, tc.status, resp.StatusCode)
				if tc.allow != "" {
					require.Equal(t, tc.allow, resp.Header.Get("Allow"))
				}
				return
			}
			exp := testcluster.ScanOf(data, tc.start, tc.end)
			if tc.limit > 0 {
				require.Greater(t, len(exp), tc.limit, "the case must have more records than its limit")
				exp = exp[:tc.limit]
			}
			if len(exp) == 0 {
				exp = nil
			}
			// Course framing, checked chunk by chunk on the wire.
			rc := testcluster.RawGet(t, c.Config(0).Listen, "/v0/entities?"+tc.query, 0)
			require.Equal(t, 200, rc.Status)
			require.Equal(t, "chunked", rc.Header.Get("Transfer-Encoding"))
			require.Equal(t, exp, testcluster.ReadChunks(t, rc.ChunkedReader))
			// Binary framing, through net/http.
			resp := testcluster.HTTPGet(t, base+"/v0/entities?"+tc.query+"&format=binary")
			require.Equal(t, 200, resp.StatusCode)
			require.Equal(t, exp, testcluster.ReadBinary(t, resp.Body))
			// JSON lines.
			resp = testcluster.HTTPGet(t, base+"/v0/entities?"+tc.query+"&format=json")
			require.Equal(t, 200, resp.StatusCode)
			require.Equal(t, "application/x-ndjson", resp.Header.Get("Content-Type"))
			require.Equal(t, exp, testcluster.ReadJSON(t, resp.Body))
		})
	}
}

// TestEntitiesBinaryFramingIsUnambiguous stores keys and values that the
// chunks framing cannot carry through a re-chunking proxy (newlines in
// keys and values, every byte value) and reads them back exactly, in the
// binary framing and in JSON lines.
func TestEntitiesBinaryFramingIsUnambiguous(t *testing.T) {
	c := testcluster.Start(t, 1)
	cl := testcluster.NewClient(t)
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	data := map[string]string{
		"k\n1":      "v\n\n1",
		"k\n1\n":    "\n",
		"k\r\n2":    string(all),
		"k\x00\xff": "0\r\n\r\n",
		"k3":        strings.Repeat("\n", 1000),
	}
	for k, v := range data {
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), k, []byte(v), 0, 0))
	}
	for _, f := range []struct {
		format string
		read   func(testing.TB, io.Reader) [][2]string
	}{{"binary", testcluster.ReadBinary}, {"json", testcluster.ReadJSON}} {
		resp := testcluster.HTTPGet(t, c.URL(0)+"/v0/entities?start=k&format="+f.format)
		require.Equal(t, 200, resp.StatusCode)
		got := map[string]string{}
		for _, kv := range f.read(t, resp.Body) {
			got[kv[0]] = kv[1]
		}
		require.Equal(t, data, got, f.format)
	}
}

func TestInternalEntitiesSecret(t *testing.T) {
	c := testcluster.Start(t, 1, func(_ int, cfg *node.Config) { cfg.ClusterSecret = "s3cret" })
	u := c.URL(0) + rpc.StreamPath + "?start=a"
	resp := testcluster.HTTPGet(t, u)
	require.Equal(t, http.StatusForbidden, resp.StatusCode)

	req, err := http.NewRequest(http.MethodGet, u, nil)
	require.NoError(t, err)
	req.Header.Set("X-Dhtkv-Secret", "s3cret")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Empty(t, testcluster.ReadBinary(t, resp.Body))

	// A wrong method: 403 to a caller without the secret, who learns
	// nothing of the endpoint; 405 to a node.
	for secret, want := range map[string]int{"": http.StatusForbidden, "s3cret": http.StatusMethodNotAllowed} {
		req, err = http.NewRequest(http.MethodPost, u, nil)
		require.NoError(t, err)
		if secret != "" {
			req.Header.Set("X-Dhtkv-Secret", secret)
		}
		resp2, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp2.Body.Close()
		require.Equal(t, want, resp2.StatusCode, "POST with secret %q", secret)
	}
}

// HTTP/1.0 has no chunked coding: a range answer to an HTTP/1.0 client
// has neither Transfer-Encoding nor Content-Length, and ends when the
// node closes the connection.
func TestEntitiesHTTP10EndsByClose(t *testing.T) {
	c, base := testcluster.Single(t)
	cl := testcluster.NewClient(t)
	for _, k := range []string{"a", "b", "c"} {
		require.Equal(t, 201, cl.Put(t, base, k, []byte("value of "+k), 0, 0))
	}
	for _, req := range []string{
		"GET /v0/entities?start=a&format=binary HTTP/1.0\r\n\r\n",
		"GET /v0/entities?start=a&format=binary HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
	} {
		resp := exchange(t, base, req)
		head, body, ok := strings.Cut(resp, "\r\n\r\n")
		require.True(t, ok, "%q", resp)
		require.Regexp(t, `^HTTP/1.1 200 OK\r\n`, head)
		assert.NotContains(t, strings.ToLower(head), "transfer-encoding")
		assert.NotContains(t, strings.ToLower(head), "content-length")
		assert.Contains(t, head, "\r\nConnection: close")
		d := scan.NewDecoder(strings.NewReader(body), 1024, 1<<20)
		var keys []string
		for d.Next() {
			keys = append(keys, string(d.Key()))
		}
		require.NoError(t, d.Err(), "a complete binary stream: %q", body)
		require.Equal(t, []string{"a", "b", "c"}, keys)
	}
	// The chunks framing has nothing to frame it with: the records come
	// as they are, as through any client that removes the chunking.
	resp := exchange(t, base, "GET /v0/entities?start=a&end=c HTTP/1.0\r\n\r\n")
	_, body, _ := strings.Cut(resp, "\r\n\r\n")
	require.Equal(t, "a\nvalue of ab\nvalue of b", body)
	// Errors are ordinary answers.
	resp = exchange(t, base, "GET /v0/entities?format=xml HTTP/1.0\r\n\r\n")
	require.Regexp(t, `^HTTP/1.1 400 `, resp)
	// HTTP/1.1 stays chunked.
	rc := testcluster.RawGet(t, c.Config(0).Listen, "/v0/entities?start=a", 0)
	require.Equal(t, 200, rc.Status)
	require.Equal(t, "chunked", rc.Header.Get("Transfer-Encoding"))
}

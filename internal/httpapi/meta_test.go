package httpapi_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/httpapi"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// answer is one response, its body read.
type answer struct {
	code   int
	header http.Header
	body   string
}

func send(t *testing.T, cl *testcluster.Client, method, u string, body string, header ...string) answer {
	t.Helper()
	var r io.Reader
	if method == http.MethodPut {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, u, r)
	require.NoError(t, err)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := cl.HTTP.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{resp.StatusCode, resp.Header, string(b)}
}

// etagVersion is the version an ETag names: "N".
func etagVersion(t *testing.T, etag string) uint64 {
	t.Helper()
	require.True(t, len(etag) > 2 && etag[0] == '"' && etag[len(etag)-1] == '"', "a strong ETag: %q", etag)
	v, err := strconv.ParseUint(etag[1:len(etag)-1], 10, 64)
	require.NoError(t, err, etag)
	return v
}

// HEAD /v0/entity answers GET's status and headers without the body:
// the version as a strong ETag, Content-Length the value's length, the
// expiry of a value written with a ttl, 404 for an absent, deleted or
// expired key, and the same ack/from rules. GET carries the same
// metadata. Through three nodes of a cluster, so that the version comes
// from the replicas' answers.
func TestHeadAndETag(t *testing.T) {
	c := testcluster.Start(t, 3)
	cl := testcluster.NewClient(t)
	u := func(node int, key, q string) string { return c.URL(node) + "/v0/entity?id=" + key + q }

	require.Equal(t, 201, send(t, cl, "PUT", u(0, "k", ""), "hello").code)
	get := send(t, cl, "GET", u(1, "k", ""), "")
	require.Equal(t, 200, get.code)
	require.Equal(t, "hello", get.body)
	v1 := etagVersion(t, get.header.Get("ETag"))
	assert.Equal(t, "no-cache", get.header.Get("Cache-Control"))
	assert.Empty(t, get.header.Get(httpapi.ExpiresAtHeader), "no ttl, no expiry")
	assert.Empty(t, get.header.Get(httpapi.TTLHeader))

	for i := range 3 {
		head := send(t, cl, "HEAD", u(i, "k", "&ack=3"), "")
		require.Equal(t, 200, head.code, "node %d", i)
		assert.Empty(t, head.body)
		assert.Equal(t, "5", head.header.Get("Content-Length"), "the value's length")
		assert.Equal(t, get.header.Get("ETag"), head.header.Get("ETag"), "node %d: the same version", i)
		assert.Equal(t, "no-cache", head.header.Get("Cache-Control"))
	}

	require.Equal(t, 201, send(t, cl, "PUT", u(2, "k", "&ttl=60"), "hello, again").code)
	before := time.Now()
	head := send(t, cl, "HEAD", u(0, "k", ""), "")
	require.Equal(t, 200, head.code)
	v2 := etagVersion(t, head.header.Get("ETag"))
	assert.Greater(t, v2, v1, "a later write has a higher version")
	assert.Equal(t, "12", head.header.Get("Content-Length"))
	exp, err := time.Parse(time.RFC3339Nano, head.header.Get(httpapi.ExpiresAtHeader))
	require.NoError(t, err, "an RFC 3339 expiry")
	assert.WithinDuration(t, before.Add(60*time.Second), exp, 2*time.Second)
	assert.Contains(t, []string{"59", "60"}, head.header.Get(httpapi.TTLHeader), "the seconds left, rounded up")
	get = send(t, cl, "GET", u(1, "k", ""), "")
	assert.Equal(t, head.header.Get(httpapi.ExpiresAtHeader), get.header.Get(httpapi.ExpiresAtHeader), "GET says the same")

	// 404s: absent, deleted, expired; no body, the reason in a header.
	for _, tc := range []struct{ name, key string }{{"absent", "absent"}, {"deleted", "del"}, {"expired", "exp"}} {
		switch tc.key {
		case "del":
			require.Equal(t, 201, send(t, cl, "PUT", u(0, "del", ""), "v").code)
			require.Equal(t, 202, send(t, cl, "DELETE", u(0, "del", ""), "").code)
		case "exp":
			require.Equal(t, 201, send(t, cl, "PUT", u(0, "exp", "&ttl=1"), "v").code)
			testcluster.Eventually(t, 5*time.Second, "the value expired", func() bool {
				return send(t, cl, "GET", u(1, "exp", ""), "").code == 404
			})
		}
		head := send(t, cl, "HEAD", u(2, tc.key, ""), "")
		assert.Equal(t, 404, head.code, tc.name)
		assert.Empty(t, head.body, tc.name)
		assert.Empty(t, head.header.Get("ETag"), tc.name)
		assert.Equal(t, "not found", head.header.Get(httpapi.ErrorHeader), tc.name)
	}

	// Bad input: the GET's 400 and its reason, in the header.
	for _, tc := range []struct{ q, reason string }{
		{"&ack=3&from=2", "ack=3 exceeds from=2"},
		{"&from=4", "from=4 exceeds the cluster's replication factor 3"},
		{"&ttl=60", "ttl applies to PUT only"},
		{"&acks=1", `unknown parameter "acks"`},
	} {
		head := send(t, cl, "HEAD", u(0, "k", tc.q), "")
		assert.Equal(t, 400, head.code, tc.q)
		assert.Empty(t, head.body, tc.q)
		assert.Contains(t, head.header.Get(httpapi.ErrorHeader), tc.reason, tc.q)
		get := send(t, cl, "GET", u(0, "k", tc.q), "")
		assert.Equal(t, 400, get.code, tc.q)
		assert.Contains(t, get.body, tc.reason, tc.q)
	}
	head = send(t, cl, "HEAD", c.URL(0)+"/v0/entity", "")
	assert.Equal(t, 400, head.code)
	assert.Equal(t, "missing id parameter", head.header.Get(httpapi.ErrorHeader))

	// Too few replicas: 504, with the coordinator's account in the header.
	c.StopNode(2)
	head = send(t, cl, "HEAD", u(0, "k", "&ack=3"), "")
	assert.Equal(t, 504, head.code)
	assert.Regexp(t, `^not enough replicas: [12] of 3 answered, 3 needed; failed: `, head.header.Get(httpapi.ErrorHeader))
	assert.Contains(t, head.header.Get(httpapi.ErrorHeader), c.URL(2)+" (", "names the node down")
}

// A HEAD answer on a kept-alive connection is headers only: the next
// answer on the connection follows them directly (fasthttp drops the body
// and keeps the Content-Length the handler set), for a small value, a
// large one (answered by reference on GET) and an empty one.
func TestHeadOnTheWire(t *testing.T) {
	c, base := testcluster.Single(t)
	cl := testcluster.NewClient(t)
	sizes := []int{5, 0, httpapi.RawValueMinBytes + 1}
	for i, n := range sizes {
		require.Equal(t, 201, send(t, cl, "PUT", fmt.Sprintf("%s/v0/entity?id=w%d", base, i), strings.Repeat("x", n)).code)
	}
	conn := testcluster.Dial(t, c.Config(0).Listen, 0)
	var req strings.Builder
	for i := range sizes {
		fmt.Fprintf(&req, "HEAD /v0/entity?id=w%d HTTP/1.1\r\nHost: x\r\n\r\n", i)
	}
	fmt.Fprintf(&req, "HEAD /v0/entity?id=absent HTTP/1.1\r\nHost: x\r\n\r\n")
	fmt.Fprintf(&req, "GET /v0/entity?id=w0 HTTP/1.1\r\nHost: x\r\n\r\n")
	_, err := io.WriteString(conn, req.String())
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	br := bufio.NewReader(conn)
	headReq, err := http.NewRequest(http.MethodHead, base, nil)
	require.NoError(t, err)
	for i, n := range sizes {
		resp, err := http.ReadResponse(br, headReq)
		require.NoError(t, err)
		assert.Equal(t, 200, resp.StatusCode)
		assert.Equal(t, strconv.Itoa(n), resp.Header.Get("Content-Length"), "value %d", i)
		assert.NotEmpty(t, resp.Header.Get("ETag"))
	}
	resp, err := http.ReadResponse(br, headReq)
	require.NoError(t, err)
	assert.Equal(t, 404, resp.StatusCode)
	// Then the GET: had a HEAD's body been sent, this would read it.
	getReq, err := http.NewRequest(http.MethodGet, base, nil)
	require.NoError(t, err)
	resp, err = http.ReadResponse(br, getReq)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "xxxxx", string(body))
}

// If-None-Match on GET and HEAD: 304 without the body when it names the
// current version (weak comparison, lists, *), the value otherwise; a
// malformed one is 400. Writes refuse every precondition header, 400:
// the replicas cannot check a version and write in one step, and a
// conditional write carried out unconditionally would lose the update
// the client guarded against.
func TestConditionalRequests(t *testing.T) {
	_, base := testcluster.Single(t)
	cl := testcluster.NewClient(t)
	u := base + "/v0/entity?id=k"
	require.Equal(t, 201, send(t, cl, "PUT", u, "v1").code)
	etag := send(t, cl, "GET", u, "").header.Get("ETag")
	version := etag[1 : len(etag)-1]

	for _, tc := range []struct {
		name, inm string
		code      int
	}{
		{"current", etag, 304},
		{"weak", "W/" + etag, 304},
		{"in a list", `"1", ` + etag + ` ,"2"`, 304},
		{"star", "*", 304},
		{"other", `"1"`, 200},
		{"unquoted", version, 400},
		{"unterminated", `"` + version, 400},
		{"garbage after", etag + ` x`, 400},
	} {
		for _, method := range []string{"GET", "HEAD"} {
			a := send(t, cl, method, u, "", "If-None-Match", tc.inm)
			assert.Equal(t, tc.code, a.code, "%s %s: %s", method, tc.name, a.body)
			switch tc.code {
			case 304:
				assert.Empty(t, a.body)
				assert.Equal(t, etag, a.header.Get("ETag"), "a 304 names the version")
			case 200:
				if method == "GET" {
					assert.Equal(t, "v1", a.body)
				}
			case 400:
				reason := a.body
				if method == "HEAD" {
					reason = a.header.Get(httpapi.ErrorHeader)
				}
				assert.Contains(t, reason, "If-None-Match", "%s %s", method, tc.name)
			}
		}
	}
	require.Equal(t, 201, send(t, cl, "PUT", u, "v2").code)
	a := send(t, cl, "GET", u, "", "If-None-Match", etag)
	assert.Equal(t, 200, a.code, "the old version no longer matches")
	assert.Equal(t, "v2", a.body)
	assert.NotEqual(t, etag, a.header.Get("ETag"))
	assert.Equal(t, 404, send(t, cl, "GET", base+"/v0/entity?id=absent", "", "If-None-Match", "*").code, "* matches only a live value")

	for _, method := range []string{"PUT", "DELETE"} {
		for _, h := range []string{"If-Match", "If-None-Match", "If-Unmodified-Since"} {
			value := etag
			if h == "If-Unmodified-Since" {
				value = time.Now().UTC().Format(http.TimeFormat)
			}
			a := send(t, cl, method, u, "v3", h, value)
			assert.Equal(t, 400, a.code, "%s with %s", method, h)
			assert.Contains(t, a.body, h+": conditional writes are not supported", "%s with %s", method, h)
		}
	}
	assert.Equal(t, "v2", send(t, cl, "GET", u, "").body, "no refused write was stored")
}

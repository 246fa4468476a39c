package httpapi_test

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// TestContract walks the single-node API rules, each through a real HTTP
// listener. Steps run in order and share one store.
func TestContract(t *testing.T) {
	_, base := testcluster.Single(t, func(_ int, c *node.Config) {
		c.MaxKeyBytes = 16
		c.MaxValueBytes = 1000
	})
	cl := testcluster.NewClient(t)
	e := func(q string) string { return base + "/v0/entity" + q }
	steps := []struct {
		name     string
		method   string
		url      string
		body     []byte
		wantCode int
		wantBody string // exact for 200; substring for errors
	}{
		{"put", "PUT", e("?id=k1"), []byte("hello"), 201, ""},
		{"get exact bytes", "GET", e("?id=k1"), nil, 200, "hello"},
		{"overwrite", "PUT", e("?id=k1"), []byte("world"), 201, ""},
		{"get new value", "GET", e("?id=k1"), nil, 200, "world"},
		{"empty value", "PUT", e("?id=empty"), []byte{}, 201, ""},
		{"get empty value", "GET", e("?id=empty"), nil, 200, ""},
		{"get absent", "GET", e("?id=absent"), nil, 404, "not found"},
		{"delete", "DELETE", e("?id=k1"), nil, 202, ""},
		{"get deleted", "GET", e("?id=k1"), nil, 404, "not found"},
		{"get deleted again (cached tombstone)", "GET", e("?id=k1"), nil, 404, "not found"},
		{"delete absent", "DELETE", e("?id=never"), nil, 202, ""},
		{"recreate", "PUT", e("?id=k1"), []byte("again"), 201, ""},
		{"get recreated", "GET", e("?id=k1"), nil, 200, "again"},
		{"status", "GET", base + "/v0/status", nil, 200, "OK\n"},
		{"missing id", "GET", e(""), nil, 400, "missing id"},
		{"missing id put", "PUT", e("?key=x"), []byte("v"), 400, "missing id"},
		{"empty id", "GET", e("?id="), nil, 400, "empty id"},
		{"empty id delete", "DELETE", e("?id="), nil, 400, "empty id"},
		{"other path", "GET", base + "/v0/entityx?id=a", nil, 400, "unknown path"},
		{"root path", "GET", base + "/", nil, 400, "unknown path"},
		{"no pprof on public port", "GET", base + "/debug/pprof/", nil, 400, "unknown path"},
		{"no metrics on public port", "GET", base + "/metrics", nil, 400, "unknown path"},
		{"key at limit", "PUT", e("?id=" + strings.Repeat("a", 16)), []byte("v"), 201, ""},
		{"key over limit", "PUT", e("?id=" + strings.Repeat("a", 17)), []byte("v"), 400, "limit is 16"},
		{"key over limit get", "GET", e("?id=" + strings.Repeat("a", 17)), nil, 400, "limit is 16"},
		{"value at limit", "PUT", e("?id=big"), bytes.Repeat([]byte("v"), 1000), 201, ""},
		{"value over limit", "PUT", e("?id=big2"), bytes.Repeat([]byte("v"), 1001), 413, "too large"},
		{"big untouched", "GET", e("?id=big2"), nil, 404, ""},
		// Far over the limit, fasthttp rejects the body before the handler
		// runs: still 413 with a reason, not fasthttp's bare 400.
		{"value far over limit", "PUT", e("?id=big3"), bytes.Repeat([]byte("v"), 10000), 413, "value too large"},
		{"big3 untouched", "GET", e("?id=big3"), nil, 404, ""},
		{"ack not a number", "GET", e("?id=k1&ack=x"), nil, 400, "ack"},
		{"ack zero", "GET", e("?id=k1&ack=0"), nil, 400, "ack"},
		{"ack negative", "PUT", e("?id=k1&ack=-1"), []byte("v"), 400, "ack"},
		{"ack > from", "GET", e("?id=k1&ack=2&from=1"), nil, 400, "exceeds"},
		{"from > cluster", "DELETE", e("?id=k1&from=2"), nil, 400, "exceeds the cluster's replication factor 1"},
		{"from empty", "GET", e("?id=k1&from="), nil, 400, "from"},
		{"ack=1 from=1 ok", "GET", e("?id=k1&ack=1&from=1"), nil, 200, "again"},
		{"value kept after bad writes", "GET", e("?id=k1"), nil, 200, "again"},
	}
	for _, s := range steps {
		code, body := cl.Do(t, s.method, s.url, s.body)
		assert.Equal(t, s.wantCode, code, "%s: body %q", s.name, body)
		if s.wantCode == 200 {
			assert.Equal(t, s.wantBody, string(body), s.name)
		} else {
			assert.Contains(t, string(body), s.wantBody, s.name)
		}
		if code >= 400 {
			assert.NotEmpty(t, body, "%s: error responses carry a reason", s.name)
			assert.Equal(t, 1, strings.Count(strings.TrimSpace(string(body)), "\n")+1, "%s: one line", s.name)
		}
	}
}

func TestMethodNotAllowed(t *testing.T) {
	_, base := testcluster.Single(t)
	for _, m := range []string{"POST", "PATCH", "OPTIONS"} {
		req, err := http.NewRequest(m, base+"/v0/entity?id=a", nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, 405, resp.StatusCode, m)
		assert.Equal(t, "GET, HEAD, PUT, DELETE", resp.Header.Get("Allow"), m)
	}
	resp, err := http.Post(base+"/v0/status", "text/plain", nil)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 405, resp.StatusCode)
}

// Keys are arbitrary bytes: percent-encoded binary and UTF-8 keys are
// distinct keys and round-trip exactly.
func TestBinaryAndUTF8Keys(t *testing.T) {
	_, base := testcluster.Single(t)
	cl := testcluster.NewClient(t)
	keys := []string{"\x00", "\x00\x01", "\xff\xfe", "a b", "a+b", "ключ", "日本", "a&id=b", "%", "\n"}
	for i, k := range keys {
		require.Equal(t, 201, cl.Put(t, base, k, []byte{byte(i), '\n', 0}, 0, 0), "%q", k)
	}
	for i, k := range keys {
		code, body := cl.Get(t, base, k, 0, 0)
		require.Equal(t, 200, code, "%q", k)
		require.Equal(t, []byte{byte(i), '\n', 0}, body, "%q", k)
	}
	// '+' in a query means space; %2B is a plus: they are different keys.
	code, body := cl.Do(t, "GET", base+"/v0/entity?id=a+b", nil)
	require.Equal(t, 200, code)
	require.Equal(t, []byte{3, '\n', 0}, body, "a+b decodes to 'a b'")
}

func TestAdminListener(t *testing.T) {
	c, base := testcluster.Single(t, func(_ int, cfg *node.Config) { cfg.AdminListen = "127.0.0.1:0" })
	admin := "http://" + c.Node(0).AdminAddr()
	cl := testcluster.NewClient(t)
	require.Equal(t, 201, cl.Put(t, base, "m", []byte("v"), 0, 0))
	for i := 0; i < 3; i++ {
		code, _ := cl.Get(t, base, "m", 0, 0)
		require.Equal(t, 200, code)
	}
	code, _ := cl.Get(t, base, "missing", 0, 0)
	require.Equal(t, 404, code)
	for _, p := range []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/goroutine?debug=1", "/debug/pprof/allocs", "/debug/pprof/mutex", "/debug/pprof/block"} {
		code, _ := cl.Do(t, "GET", admin+p, nil)
		assert.Equal(t, 200, code, p)
	}
	code, body := cl.Do(t, "GET", admin+"/metrics", nil)
	require.Equal(t, 200, code)
	m := string(body)
	for _, want := range []string{
		`dhtkv_requests_total{code="201",op="put"} 1`,
		`dhtkv_requests_total{code="200",op="get"} 3`,
		`dhtkv_requests_total{code="404",op="get"} 1`,
		`dhtkv_request_duration_seconds_count{op="get"} 4`,
		"dhtkv_cache_hits_total 2", // first GET fills, the next two hit
		"dhtkv_pebble_wal_bytes_written_total",
		"dhtkv_pebble_disk_usage_bytes",
		"dhtkv_pebble_write_stalls_total 0",
		`dhtkv_pebble_wal_fsync_seconds_bucket{le="+Inf"}`,
		"go_goroutines",
	} {
		assert.Contains(t, m, want)
	}
	// --sync=true (the default): the PUT waited for a WAL fsync.
	fsyncs := regexp.MustCompile(`(?m)^dhtkv_pebble_wal_fsync_seconds_count (\d+)$`).FindStringSubmatch(m)
	require.Len(t, fsyncs, 2, "the WAL fsync histogram is exported")
	n, err := strconv.Atoi(fsyncs[1])
	require.NoError(t, err)
	assert.Positive(t, n)
}

// A request whose headers exceed the limit is refused with a 4xx, and the
// server keeps serving.
func TestHeaderLimit(t *testing.T) {
	_, base := testcluster.Single(t, func(_ int, c *node.Config) { c.MaxHeaderBytes = 2048 })
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	_, err = io.WriteString(conn, "GET /v0/entity?id=a HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 4096)+"\r\n\r\n")
	require.NoError(t, err)
	buf := make([]byte, 64)
	n, _ := conn.Read(buf)
	require.Regexp(t, `^HTTP/1.1 4\d\d`, string(buf[:n]))
	require.Regexp(t, `^HTTP/1.1 431`, string(buf[:n]))
	code, _ := testcluster.NewClient(t).Get(t, base, "a", 0, 0)
	require.Equal(t, 404, code)
}

// A client announcing a body over the limit with Expect: 100-continue (curl
// does so above 1 KiB) gets 413 at once, on the announced length, without
// an interim 100 Continue and without sending the body
// (TestOversizedContentLengthRefusedFromHeaders has the other cases).
func TestOversizedBodyWithExpectContinue(t *testing.T) {
	_, base := testcluster.Single(t, func(_ int, c *node.Config) { c.MaxValueBytes = 100 })
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	_, err = io.WriteString(conn, "PUT /v0/entity?id=a HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5000\r\n\r\n")
	require.NoError(t, err)
	resp, err := io.ReadAll(conn) // the server answers and closes
	require.NoError(t, err)
	t.Logf("%q", resp)
	require.Regexp(t, `^HTTP/1.1 413 `, string(resp))
	require.Contains(t, string(resp), "value too large: limit is 100 bytes")
}

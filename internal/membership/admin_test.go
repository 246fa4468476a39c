package membership_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every change that names a node answers 400 with the parse's one-line
// reason for a URL that does not parse, a parameter its path does not
// take, or one given twice with different values, before it asks
// anything of the map (which would answer 409: a refusal of a well-formed
// change), and 404 for an unknown path whatever its query. Nothing
// changes.
func TestAdminMalformedURL(t *testing.T) {
	urls := []string{"http://n1:1", "http://n2:1", "http://n3:1"}
	c, logs := loggedCluster(t, urls)
	before := c.settled(logs[urls[0]], 3)
	h := c.member(urls[0]).Handler(nil)
	q := url.QueryEscape
	for _, tc := range []struct {
		target string
		code   int
		want   string
	}{
		{"/cluster/join?node=n9", http.StatusBadRequest, "bad node URL"},
		{"/cluster/decommission?node=n3", http.StatusBadRequest, "bad node URL"},
		{"/cluster/decommission?node=" + q("https://n3:1"), http.StatusBadRequest, "want http://host:port"},
		{"/cluster/remove?node=n3", http.StatusBadRequest, "bad node URL"},
		{"/cluster/replace?node=n3&with=" + q("http://n9:1"), http.StatusBadRequest, "bad node URL"},
		{"/cluster/replace?node=" + q(urls[2]) + "&with=n9", http.StatusBadRequest, "with: bad node URL"},
		{"/cluster/replace?node=" + q(urls[2]), http.StatusBadRequest, "missing with=URL"},
		{"/cluster/nothing?node=n3", http.StatusNotFound, "unknown path /cluster/nothing"},
		{"/cluster/join?url=" + q("http://n9:1"), http.StatusBadRequest, `unknown parameter "url": node=URL`},
		{"/cluster/join?node=" + q("http://n9:1") + "&node=" + q("http://n8:1"), http.StatusBadRequest, "node given 2 times with different values: give it once"},
		{"/cluster/replace?node=" + q(urls[2]) + "&with=" + q("http://n9:1") + "&with=" + q("http://n8:1"), http.StatusBadRequest, "with given 2 times"},
		{"/cluster/replicas?n=2&n=3", http.StatusBadRequest, "n given 2 times"},
		{"/cluster/replicas?n=2&node=x", http.StatusBadRequest, `unknown parameter "node": n=N, the new replication factor`},
		{"/cluster/abort?now=1", http.StatusBadRequest, `unknown parameter "now": this endpoint takes none`},
		{"/cluster/join?node=%zz", http.StatusBadRequest, "malformed query"},
		{"/cluster/decommission?node=" + q("http://n9:1"), http.StatusConflict, "not a member"},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, tc.target, nil))
		body := strings.TrimSpace(rec.Body.String())
		require.Equal(t, tc.code, rec.Code, "%s: %s", tc.target, body)
		require.Contains(t, body, tc.want, tc.target)
		require.NotContains(t, body, "\n", "one line")
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/cluster?foo=1", nil))
	require.Equal(t, http.StatusBadRequest, rec.Code, "GET /cluster takes no parameter: %s", rec.Body)
	require.Contains(t, rec.Body.String(), `unknown parameter "foo"`)
	require.Equal(t, before.Epoch, c.member(urls[0]).View().Map.Epoch, "no change started")
}

// A decommission that would leave fewer nodes than the replication factor
// is refused with 409 and the reason, unless forced: two nodes at factor
// 2 would leave one. A force that is not a boolean is a 400. Forced, the
// change begins.
func TestAdminDecommissionBelowFactor(t *testing.T) {
	urls := []string{"http://n1:1", "http://n2:1"}
	c, logs := loggedCluster(t, urls)
	before := c.settled(logs[urls[0]], 2)
	require.Equal(t, 2, before.Replicas)
	h := c.member(urls[0]).Handler(nil)
	node := "node=" + url.QueryEscape(urls[1])
	post := func(query string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/cluster/decommission?"+query, nil))
		return rec.Code, strings.TrimSpace(rec.Body.String())
	}
	for _, q := range []string{node, node + "&force=false", node + "&force=0"} {
		code, body := post(q)
		require.Equal(t, http.StatusConflict, code, "%s: %s", q, body)
		require.Contains(t, body, "decommissioning node 1 would leave 1 nodes, fewer than the replication factor 2", q)
		require.Contains(t, body, "lower the factor first (dhtkvctl replicas 1), or force it", q)
		require.NotContains(t, body, "\n", "one line")
	}
	code, body := post(node + "&force=maybe")
	require.Equal(t, http.StatusBadRequest, code)
	require.Equal(t, `force="maybe": want true or false (1 or 0; the name alone is true)`, body)
	code, body = post(node + "&force&force=0")
	require.Equal(t, http.StatusBadRequest, code)
	require.Equal(t, "force given 2 times with different values: give it once", body)
	require.Equal(t, before.Epoch, c.member(urls[0]).View().Map.Epoch, "no change started")

	code, body = post(node + "&force=true")
	require.Equal(t, http.StatusAccepted, code, body)
	require.Contains(t, body, `"kind":"decommission"`)
}

// A join or a replace naming a member's URL with its host spelled in
// other letters (host names are case-insensitive: the same machine) is
// refused as a member's URL is, with 409 and the reason; nothing changes.
func TestAdminJoinMemberURLOtherCase(t *testing.T) {
	urls := []string{"http://n1:1", "http://n2:1", "http://n3:1"}
	c, logs := loggedCluster(t, urls)
	before := c.settled(logs[urls[0]], 3)
	h := c.member(urls[0]).Handler(nil)
	q := url.QueryEscape
	for _, target := range []string{
		"/cluster/join?node=" + q("http://N2:1"),
		"/cluster/join?node=" + q("HTTP://N3:1/"),
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, target, nil))
		body := strings.TrimSpace(rec.Body.String())
		require.Equal(t, http.StatusConflict, rec.Code, "%s: %s", target, body)
		require.Contains(t, body, "already a member", target)
	}
	require.Equal(t, before.Epoch, c.member(urls[0]).View().Map.Epoch, "no change started")
}

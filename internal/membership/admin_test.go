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
// reason for a URL that does not parse, before it asks anything of the
// map (which would answer 409: a refusal of a well-formed change), and
// 404 for an unknown path whatever its query. Nothing changes.
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
		{"/cluster/decommission?node=" + q("http://n9:1"), http.StatusConflict, "not a member"},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, tc.target, nil))
		body := strings.TrimSpace(rec.Body.String())
		require.Equal(t, tc.code, rec.Code, "%s: %s", tc.target, body)
		require.Contains(t, body, tc.want, tc.target)
		require.NotContains(t, body, "\n", "one line")
	}
	require.Equal(t, before.Epoch, c.member(urls[0]).View().Map.Epoch, "no change started")
}

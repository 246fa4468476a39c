package e2e_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// TestTTL: a value PUT with ttl (parameter or header) is stored on every
// replica with the same expiry, the version's time plus the ttl; it reads
// back until then, and from then on reads as 404 through every node and is
// left out of range scans, local and cluster-wide. A later PUT without ttl
// does not expire. Bad ttls are refused.
func TestTTL(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 3)
	cl := testcluster.NewClient(t)
	const ttl = 2 * time.Second
	put := func(key, query, header string) {
		req, err := http.NewRequest(http.MethodPut, testcluster.EntityURL(c.URL(0), key, 3, 3)+query, strings.NewReader("v-"+key))
		require.NoError(t, err)
		if header != "" {
			req.Header.Set("X-Dhtkv-TTL", header)
		}
		resp, err := cl.HTTP.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusCreated, resp.StatusCode, key)
	}
	put("p", "&ttl=2", "")
	put("h", "", "2")
	put("keep", "", "")
	for _, key := range []string{"p", "h"} {
		var exp uint64
		for i := range 3 {
			code, rec := internalGet(t, cl, c.URL(i), key, "")
			require.Equal(t, http.StatusOK, code)
			require.Equal(t, uint64(hlc.TimeOf(rec.Version).Add(ttl).UnixMilli()), rec.ExpiresAt, "%s on node %d", key, i)
			if i > 0 {
				require.Equal(t, exp, rec.ExpiresAt, "the same expiry everywhere")
			}
			exp = rec.ExpiresAt
		}
		if time.Now().Before(time.UnixMilli(int64(exp))) {
			code, body := cl.Get(t, c.URL(1), key, 2, 3)
			require.Equal(t, http.StatusOK, code)
			require.Equal(t, "v-"+key, string(body))
		}
	}
	testcluster.Eventually(t, 10*time.Second, "the ttl values expired", func() bool {
		code, _ := cl.Get(t, c.URL(2), "h", 2, 3)
		return code == http.StatusNotFound
	})
	for i := range 3 {
		for _, key := range []string{"p", "h"} {
			code, _ := cl.Get(t, c.URL(i), key, 1, 3)
			require.Equal(t, http.StatusNotFound, code, "%s through node %d", key, i)
		}
		code, body := cl.Get(t, c.URL(i), "keep", 2, 3)
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, "v-keep", string(body))
		for _, scope := range []string{"", "&scope=cluster"} {
			code, body := cl.Do(t, http.MethodGet, c.URL(i)+"/v0/entities?start=a"+scope, nil)
			require.Equal(t, http.StatusOK, code)
			require.Equal(t, "keep\nv-keep", string(body), "node %d%s", i, scope)
		}
	}
	put("p", "", "") // a rewrite without ttl lives
	code, _ := cl.Get(t, c.URL(1), "p", 2, 3)
	require.Equal(t, http.StatusOK, code)

	for _, q := range []string{"&ttl=0", "&ttl=-1", "&ttl=x", "&ttl=315360001"} {
		code, body := cl.Do(t, http.MethodPut, testcluster.EntityURL(c.URL(0), "bad", 0, 0)+q, []byte("v"))
		require.Equal(t, http.StatusBadRequest, code, q)
		require.Contains(t, string(body), "ttl", q)
	}
	code, body := cl.Do(t, http.MethodDelete, testcluster.EntityURL(c.URL(0), "keep", 0, 0)+"&ttl=5", nil)
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, string(body), "PUT only")
}

package httpapi_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// The query of /v0/entity is checked strictly: a percent sign must start
// a valid escape, and a parameter the API does not know is an error, not
// ignored (a typo such as acks=3 would silently get the default quorum).
func TestEntityQueryStrict(t *testing.T) {
	_, base := testcluster.Single(t)
	cl := testcluster.NewClient(t)
	e := func(q string) string { return base + "/v0/entity?" + q }
	for _, c := range []struct {
		name, method, query string
		code                int
		reason              string
	}{
		{"all three", "PUT", "id=a&ack=1&from=1", 201, ""},
		{"escaped name", "GET", "id=a&%61ck=1", 200, ""}, // %61ck is ack
		{"valid escapes", "PUT", "id=%25%41%e2%82%AC", 201, ""},
		{"plus is a space", "PUT", "id=a+b", 201, ""},
		{"empty pair", "PUT", "id=c&&ack=1", 201, ""},
		{"bad escape", "PUT", "id=%G1", 400, `bad percent-encoding in "id": "%G1"`},
		{"trailing percent", "PUT", "id=abc%", 400, `bad percent-encoding in "id": "%"`},
		{"percent and one digit", "GET", "id=ab%4", 400, `bad percent-encoding in "id": "%4"`},
		{"bad escape in ack", "GET", "id=a&ack=%zz", 400, `bad percent-encoding in "ack": "%zz"`},
		{"bad escape in a name", "GET", "id=a&a%g=1", 400, `bad percent-encoding in "a%g": "%g"`},
		{"typo", "GET", "id=a&acks=3", 400, `unknown parameter "acks"`},
		{"unknown on put", "PUT", "id=a&replicas=2", 400, `unknown parameter "replicas"`},
		{"unknown on delete", "DELETE", "id=a&ack=1&From=1", 400, `unknown parameter "From"`},
		{"bare word", "GET", "id=a&x", 400, `unknown parameter "x"`},
		{"the same id twice", "PUT", "id=d&id=d", 201, ""},
		{"the same ack, spelled twice", "GET", "id=d&ack=1&%61ck=1", 200, ""},
		{"two ids", "PUT", "id=e&id=f", 400, "id given 2 times with different values: give it once"},
		{"two acks", "GET", "id=d&ack=1&ack=2", 400, "ack given 2 times with different values"},
		{"two froms", "DELETE", "id=d&from=1&from=2", 400, "from given 2 times with different values"},
	} {
		var v []byte
		if c.method == "PUT" {
			v = []byte("v")
		}
		code, body := cl.Do(t, c.method, e(c.query), v)
		assert.Equal(t, c.code, code, "%s: %q", c.name, body)
		assert.Contains(t, string(body), c.reason, c.name)
	}
	for _, k := range []string{"%G1", "abc%", "G1", "abc", "e", "f"} {
		code, _ := cl.Get(t, base, k, 0, 0)
		assert.Equal(t, 404, code, "nothing stored under %q", k)
	}
	code, body := cl.Get(t, base, "%A€", 0, 0)
	require.Equal(t, 200, code, "%%25%%41%%e2%%82%%AC decodes to %%A€")
	require.Equal(t, "v", string(body))
}

// /v0/status is as strict as the entity endpoints: verbose alone or a
// boolean, no other parameter, each refusal a 400 with a one-line reason.
func TestStatusQueryStrict(t *testing.T) {
	_, base := testcluster.Single(t)
	cl := testcluster.NewClient(t)
	const plain, verbose = "OK\n", "{"
	for _, c := range []struct {
		name, method, query string
		code                int
		want                string // the body's start: plain, verbose, or the reason
	}{
		{"none", "GET", "", 200, plain},
		{"verbose alone", "GET", "verbose", 200, verbose},
		{"verbose empty", "GET", "verbose=", 200, verbose},
		{"verbose=1", "GET", "verbose=1", 200, verbose},
		{"verbose=true", "GET", "verbose=true", 200, verbose},
		{"verbose=TRUE", "GET", "verbose=TRUE", 200, verbose},
		{"verbose=0", "GET", "verbose=0", 200, plain},
		{"verbose=false", "GET", "verbose=false", 200, plain},
		{"escaped name", "GET", "%76erbose", 200, verbose}, // %76 is v
		{"unknown", "GET", "foo", 400, `unknown parameter "foo": the parameters are verbose`},
		{"unknown beside verbose", "GET", "verbose&foo=1", 400, `unknown parameter "foo"`},
		{"unknown on HEAD", "HEAD", "foo", 400, ""},
		{"not a boolean", "GET", "verbose=garbage", 400, `verbose="garbage": want true or false (1 or 0; the name alone is true)`},
		{"a control character", "GET", "verbose=%00", 400, `verbose="\x00": want true or false`},
		{"bad escape", "GET", "verbose=%zz", 400, `bad percent-encoding in "verbose": "%zz"`},
		{"repeated alike", "GET", "verbose&verbose=1", 200, verbose},
		{"repeated unlike", "GET", "verbose=1&verbose=0", 400, "verbose given 2 times with different values: give it once"},
	} {
		code, body := cl.Do(t, c.method, base+"/v0/status?"+c.query, nil)
		assert.Equal(t, c.code, code, "%s: %q", c.name, body)
		assert.True(t, strings.HasPrefix(string(body), c.want), "%s: %q", c.name, body)
		if code == 400 && c.method == "GET" {
			assert.Equal(t, 1, strings.Count(string(body), "\n"), "%s: one line: %q", c.name, body)
		}
	}
}

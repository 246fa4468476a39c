package admin

import (
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
)

// query parses r's query strictly, as the public API's endpoints do: a
// malformed one (a bad percent-escape, a semicolon), which r.URL.Query
// would drop silently, or a parameter not in known is an error whose
// one-line reason names it; usage says what the endpoint takes.
func query(r *http.Request, usage string, known ...string) (url.Values, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("malformed query: %w", err)
	}
	for _, name := range slices.Sorted(maps.Keys(q)) {
		if !slices.Contains(known, name) {
			return nil, fmt.Errorf("unknown parameter %q: %s", name, usage)
		}
	}
	return q, nil
}

// boolParam reads the boolean parameter name of q as a boolean command-line
// flag is read, and as the public /v0/status reads verbose: absent is
// def, the name alone ("?wait", "?wait=") true, and a value one of
// strconv.ParseBool's (1, t, true, 0, f, false, the words in lower, upper
// or title case). Another value is an error with a one-line reason.
func boolParam(q url.Values, name string, def bool) (bool, error) {
	if !q.Has(name) {
		return def, nil
	}
	v := q.Get(name)
	if v == "" {
		return true, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%s=%q: want true or false (1 or 0; the name alone is true)", name, v)
	}
	return b, nil
}

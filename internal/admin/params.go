package admin

import (
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
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

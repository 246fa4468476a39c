// Package queryparam holds the rules by which every endpoint, public or
// admin, reads a parameter of its query that is not a key or a number,
// so that one spelling means the same on every port.
package queryparam

import (
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
)

// Bool reads the boolean parameter name from the values it has in a
// query, in their order (none: it is absent), as a boolean command-line
// flag is read: absent is def; the name alone ("?wait", "?wait=") is
// true; a value is one of strconv.ParseBool's (1, t, true, 0, f, false,
// the words in lower, upper or title case). A parameter given more than
// once must mean the same each time: "?force&force=0" is refused, not
// read as its first value. An error's message is one line that names the
// parameter.
func Bool(name string, values []string, def bool) (bool, error) {
	if len(values) == 0 {
		return def, nil
	}
	var b bool
	for i, v := range values {
		x := true
		if v != "" {
			var err error
			if x, err = strconv.ParseBool(v); err != nil {
				return false, fmt.Errorf("%s=%q: want true or false (1 or 0; the name alone is true)", name, v)
			}
		}
		if i > 0 && x != b {
			return false, repeated(name, len(values))
		}
		b = x
	}
	return b, nil
}

// One reads a parameter that takes one value (a path, a URL, a number)
// from the values it has in a query, in their order: "" when absent, the
// value when every time it is given it is the same. A parameter given
// again with another value is refused, not read as its first value: a
// client that sent "?dir=a&dir=b" meant one of them, and nothing says
// which.
func One(name string, values []string) (string, error) {
	for _, v := range values[min(1, len(values)):] {
		if v != values[0] {
			return "", repeated(name, len(values))
		}
	}
	if len(values) == 0 {
		return "", nil
	}
	return values[0], nil
}

func repeated(name string, n int) error {
	return fmt.Errorf("%s given %d times with different values: give it once", name, n)
}

// Strict parses a raw query as every endpoint must: a malformed one (a
// bad percent-escape, a semicolon), which net/url's Query drops silently,
// or a parameter not in known is an error whose one-line reason names it;
// usage says what the endpoint takes.
func Strict(rawQuery, usage string, known ...string) (url.Values, error) {
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return nil, fmt.Errorf("malformed query: %w", err)
	}
	for _, name := range slices.Sorted(maps.Keys(q)) {
		if !slices.Contains(known, name) {
			if usage == "" {
				return nil, fmt.Errorf("unknown parameter %q: this endpoint takes none", name)
			}
			return nil, fmt.Errorf("unknown parameter %q: %s", name, usage)
		}
	}
	return q, nil
}

// Package queryparam holds the rules by which every endpoint, public or
// admin, reads a parameter of its query that is not a key or a number,
// so that one spelling means the same on every port.
package queryparam

import (
	"fmt"
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
			return false, fmt.Errorf("%s given %d times with different values: give it once", name, len(values))
		}
		b = x
	}
	return b, nil
}

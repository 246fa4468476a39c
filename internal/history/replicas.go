package history

import (
	"fmt"
	"hash/crc32"
	"maps"
	"slices"
	"strings"
)

// CheckReplicas checks that replicas converged to identical data. dumps maps
// a replica's name to its dump: key -> the raw bytes it stores for the key
// (what a dump holds, tombstones included or not, is the caller's choice,
// as long as every replica's dump is made the same way). Every key that
// some replica holds must be held by every replica with the same bytes;
// each key that is not is one RuleReplicaDivergence violation, whose
// message groups the replicas by what they hold.
func CheckReplicas(dumps map[string]map[string][]byte) []Violation {
	names := slices.Sorted(maps.Keys(dumps))
	keys := make(map[string]struct{})
	for _, d := range dumps {
		for k := range d {
			keys[k] = struct{}{}
		}
	}
	var vs []Violation
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		var groups []string              // distinct contents, in order of first holder
		holders := map[string][]string{} // content -> replicas holding it
		var missing []string
		for _, n := range names {
			b, ok := dumps[n][k]
			if !ok {
				missing = append(missing, n)
				continue
			}
			c := string(b)
			if _, seen := holders[c]; !seen {
				groups = append(groups, c)
			}
			holders[c] = append(holders[c], n)
		}
		if len(groups) == 1 && len(missing) == 0 {
			continue
		}
		var parts []string
		for _, c := range groups {
			parts = append(parts, fmt.Sprintf("%s %s", plural(holders[c], "holds", "hold"), describeBytes([]byte(c))))
		}
		if len(missing) > 0 {
			parts = append(parts, plural(missing, "lacks it", "lack it"))
		}
		vs = append(vs, Violation{Rule: RuleReplicaDivergence, Key: k, Msg: strings.Join(parts, "; ")})
	}
	return vs
}

// describeBytes shows a record short but distinct: its length, its first
// bytes in hex and a checksum of all of it.
func describeBytes(b []byte) string {
	const show = 12
	if len(b) == 0 {
		return "0 bytes"
	}
	if len(b) <= show {
		return fmt.Sprintf("%d bytes %x", len(b), b)
	}
	return fmt.Sprintf("%d bytes %x… crc32 %08x", len(b), b[:show], crc32.ChecksumIEEE(b))
}

// plural joins names and the verb that agrees with them.
func plural(names []string, one, many string) string {
	if len(names) == 1 {
		return names[0] + " " + one
	}
	return strings.Join(names, ", ") + " " + many
}

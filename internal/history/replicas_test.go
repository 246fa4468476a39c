package history

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCheckReplicas(t *testing.T) {
	long := []byte(strings.Repeat("x", 40))
	longer := []byte(strings.Repeat("x", 40) + "y")
	for _, tc := range []struct {
		name  string
		dumps map[string]map[string][]byte
		want  []string
	}{
		{name: "no replicas"},
		{
			name:  "one replica agrees with itself",
			dumps: map[string]map[string][]byte{"n1": {"a": []byte("1")}},
		},
		{
			name: "identical replicas",
			dumps: map[string]map[string][]byte{
				"n1": {"a": []byte("1"), "b": {}},
				"n2": {"a": []byte("1"), "b": {}},
			},
		},
		{
			name:  "all empty",
			dumps: map[string]map[string][]byte{"n1": {}, "n2": nil},
		},
		{
			name: "different bytes",
			dumps: map[string]map[string][]byte{
				"n1": {"a": []byte("old")},
				"n2": {"a": []byte("new")},
				"n3": {"a": []byte("new")},
			},
			want: []string{`replica-divergence "a": n1 holds 3 bytes 6f6c64; n2, n3 hold 3 bytes 6e6577`},
		},
		{
			name: "missing on some, empty is not missing",
			dumps: map[string]map[string][]byte{
				"n1": {"a": {}, "b": []byte("1")},
				"n2": {"b": []byte("1")},
				"n3": {"a": {}},
			},
			want: []string{
				`replica-divergence "a": n1, n3 hold 0 bytes; n2 lacks it`,
				`replica-divergence "b": n1, n2 hold 1 bytes 31; n3 lacks it`,
			},
		},
		{
			name: "long records that differ past the shown prefix",
			dumps: map[string]map[string][]byte{
				"n1": {"a": long},
				"n2": {"a": longer},
			},
			want: []string{`replica-divergence "a": n1 holds 40 bytes 787878787878787878787878… crc32 c41a71f0; n2 holds 41 bytes 787878787878787878787878… crc32 46a2ce78`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, v := range CheckReplicas(tc.dumps) {
				got = append(got, v.String())
			}
			require.Equal(t, tc.want, got)
		})
	}
}

package framing

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// jsonLine is a reader's view of one line: pointers tell an absent field
// from an empty one.
type jsonLine struct {
	Key         *string `json:"key"`
	KeyBase64   []byte  `json:"key_base64"`
	Value       *string `json:"value"`
	ValueBase64 []byte  `json:"value_base64"`
}

// TestAppendJSON: the rules of the JSON lines framing, one case each, with
// the exact bytes, and every line decodes back to exactly its key and value.
func TestAppendJSON(t *testing.T) {
	for _, tc := range []struct {
		name, key, value string
		keyOnly          bool
		want             string
	}{
		{name: "UTF-8 both", key: "a", value: "x", want: `{"key":"a","value":"x"}`},
		{name: "empty value", key: "a", value: "", want: `{"key":"a","value":""}`},
		{name: "non-ASCII UTF-8 stays as is", key: "clé", value: "日本", want: `{"key":"clé","value":"日本"}`},
		{name: "escapes", key: "q\"b\\", value: "\n\r\t\b\f", want: `{"key":"q\"b\\","value":"\n\r\t\b\f"}`},
		{name: "control bytes and NUL are UTF-8", key: "\x00\x01\x1f\x7f", value: "v", want: `{"key":"\u0000\u0001\u001f` + "\x7f" + `","value":"v"}`},
		{name: "HTML is not escaped", key: "<a&b>", value: "v", want: `{"key":"<a&b>","value":"v"}`},
		{name: "line separators", key: "\u2028\u2029", value: "v", want: `{"key":"\u2028\u2029","value":"v"}`},
		{name: "binary key", key: "\x00\xff", value: "v", want: `{"key_base64":"AP8=","value":"v"}`},
		{name: "binary value", key: "k", value: "\xfe\xff", want: `{"key":"k","value_base64":"/v8="}`},
		{name: "truncated rune is not UTF-8", key: "k", value: "\xe6\x97", want: `{"key":"k","value_base64":"5pc="}`},
		{name: "surrogate half is not UTF-8", key: "\xed\xa0\x80", value: "", want: `{"key_base64":"7aCA","value":""}`},
		{name: "key only", key: "k\n", keyOnly: true, want: `{"key":"k\n"}`},
		{name: "binary key only", key: "\xff", keyOnly: true, want: `{"key_base64":"/w=="}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var line []byte
			if tc.keyOnly {
				line = AppendJSONKey([]byte("prefix"), []byte(tc.key))
			} else {
				line = AppendJSON([]byte("prefix"), []byte(tc.key), []byte(tc.value))
			}
			require.Equal(t, "prefix"+tc.want+"\n", string(line))
			line = bytes.TrimPrefix(line, []byte("prefix"))
			require.Equal(t, 1, bytes.Count(line, []byte("\n")), "one line")
			var got jsonLine
			require.NoError(t, json.Unmarshal(line, &got))
			require.True(t, (got.Key == nil) != (got.KeyBase64 == nil), "exactly one key field")
			k := string(got.KeyBase64)
			if got.Key != nil {
				k = *got.Key
			}
			require.Equal(t, tc.key, k)
			if tc.keyOnly {
				require.True(t, got.Value == nil && got.ValueBase64 == nil, "no value field")
				return
			}
			require.True(t, (got.Value == nil) != (got.ValueBase64 == nil), "exactly one value field")
			v := string(got.ValueBase64)
			if got.Value != nil {
				v = *got.Value
			}
			require.Equal(t, tc.value, v)
		})
	}
}

// FuzzJSONString: appendJSONString writes what encoding/json writes (HTML
// escaping off) for every valid UTF-8 string.
func FuzzJSONString(f *testing.F) {
	for _, s := range []string{"", "a", "\x00\n\"\\", "<>&", "\u2028x\u2029", "é日本\U0001F600", "\x7f\x1f", strings.Repeat("\t", 40)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		var want bytes.Buffer
		enc := json.NewEncoder(&want)
		enc.SetEscapeHTML(false)
		require.NoError(t, enc.Encode(s))
		got := appendJSONString(nil, []byte(s))
		require.Equal(t, strings.TrimSuffix(want.String(), "\n"), string(got))
	})
}

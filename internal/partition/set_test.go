package partition

import (
	"slices"
	"strings"
	"testing"
)

// TestSetRoundTrip: a set survives its text, whatever partitions it holds.
func TestSetRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name  string
		parts []ID
	}{
		{"empty", nil},
		{"first", []ID{0}},
		{"last", []ID{Count - 1}},
		{"word edges", []ID{63, 64, 127, 128, 4032}},
		{"every third", func() []ID {
			var out []ID
			for p := 0; p < Count; p += 3 {
				out = append(out, ID(p))
			}
			return out
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := SetOf(tc.parts...)
			if s.Len() != len(tc.parts) {
				t.Fatalf("Len %d, want %d", s.Len(), len(tc.parts))
			}
			text := s.String()
			if len(text) != encodedLen || strings.ContainsAny(text, "+/=%&") {
				t.Fatalf("text %q: not %d URL-safe characters", text, encodedLen)
			}
			back, err := ParseSet([]byte(text))
			if err != nil {
				t.Fatal(err)
			}
			got := back.IDs()
			if !slices.Equal(got, tc.parts) && !(len(got) == 0 && len(tc.parts) == 0) {
				t.Fatalf("parts %v, want %v", got, tc.parts)
			}
			for _, p := range tc.parts {
				if !back.Has(p) {
					t.Fatalf("partition %d lost", p)
				}
			}
		})
	}
}

// TestParseSetRefuses: text that is not a set's is an error, never a
// wrong set.
func TestParseSetRefuses(t *testing.T) {
	good := SetOf(1, 2, 3).String()
	for name, text := range map[string]string{
		"empty":           "",
		"short":           good[:len(good)-1],
		"long":            good + "A",
		"not base64url":   "+" + good[1:],
		"padded":          good[:len(good)-1] + "=",
		"stray last bits": good[:len(good)-1] + "B", // 683 chars carry 4 bits beyond the 512 bytes
	} {
		if _, err := ParseSet([]byte(text)); err == nil {
			t.Errorf("%s: %q parsed", name, text)
		}
	}
}

// TestSetKey: a key is in the set of its partition only.
func TestSetKey(t *testing.T) {
	p, _ := Of([]byte("k"))
	if !SetOf(p).HasKey([]byte("k")) || SetOf((p+1)%Count).HasKey([]byte("k")) {
		t.Fatal("HasKey disagrees with Of")
	}
	var none *Set
	if none.Has(p) || none.Len() != 0 {
		t.Fatal("a nil set is not empty")
	}
}

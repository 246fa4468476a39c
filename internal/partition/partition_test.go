package partition

import (
	"strconv"
	"testing"
)

// TestOfSpread: keys spread over every partition and segment, within a
// few standard deviations of uniform.
func TestOfSpread(t *testing.T) {
	const keys = 1 << 20
	var parts [Count]int
	var segs [Segments]int
	for i := range keys {
		p, s := Of([]byte("key" + strconv.Itoa(i)))
		if int(p) >= Count || int(s) >= Segments {
			t.Fatalf("key%d: partition %d segment %d out of range", i, p, s)
		}
		parts[p]++
		segs[s]++
	}
	mean := keys / Count // 256; binomial sd 16
	for p, n := range parts {
		if n < mean-6*16 || n > mean+6*16 {
			t.Errorf("partition %d holds %d keys, mean %d", p, n, mean)
		}
	}
	for s, n := range segs {
		if n < keys/Segments*95/100 || n > keys/Segments*105/100 {
			t.Errorf("segment %d holds %d keys, mean %d", s, n, keys/Segments)
		}
	}
}

// TestEntryHash: the version and the key both change the hash.
func TestEntryHash(t *testing.T) {
	seen := map[uint64]string{}
	for _, k := range []string{"a", "b", "ab"} {
		for _, v := range []uint64{0, 1, 2, 1 << 40} {
			h := EntryHash([]byte(k), v)
			name := k + "@" + strconv.FormatUint(v, 10)
			if prev, dup := seen[h]; dup {
				t.Fatalf("%s and %s hash alike", prev, name)
			}
			seen[h] = name
		}
	}
}

func BenchmarkOf(b *testing.B) {
	key := []byte("user:0000012345")
	b.ReportAllocs()
	for b.Loop() {
		Of(key)
	}
}

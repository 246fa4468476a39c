package httpapi

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/internal/scan"
)

// FuzzParseEntity feeds arbitrary query strings to the /v0/entity parser:
// it must never panic, and whatever it accepts must satisfy the rules. The
// seed corpus is below and in testdata/fuzz/FuzzParseEntity. `make fuzz`
// runs it for FUZZTIME; `make test` runs only the seeds.
func FuzzParseEntity(f *testing.F) {
	for _, s := range []string{
		"id=a", "id=", "", "id=a&ack=1&from=1", "id=a&ack=0&from=2", "id=a&ack=3&from=2",
		"id=%00%ff", "id=a&ack=x", "id=a&from=-1", "id=a&ack=99999999999999999999",
		"id=a&id=b", "ack=1", "id=%zz", "id=a&acks=3", "id=a%", "id=%41&%61ck=1", "id=a&from=3&ack=2", "id=" + string(make([]byte, 2000)),
	} {
		f.Add(s, 3)
	}
	f.Fuzz(func(t *testing.T, query string, size int) {
		if size < 1 || size > 256 {
			return
		}
		var args fasthttp.Args
		args.Parse(query)
		p, aerr := parseEntity([]byte(query), &args, size, size, 1024)
		if aerr != nil {
			if aerr.code != 400 || aerr.reason == "" {
				t.Fatalf("bad error %d %q", aerr.code, aerr.reason)
			}
			return
		}
		if len(p.key) == 0 || len(p.key) > 1024 {
			t.Fatalf("accepted key of %d bytes", len(p.key))
		}
		if p.ack < 1 || p.ack > p.from || p.from > size {
			t.Fatalf("accepted ack=%d from=%d size=%d", p.ack, p.from, size)
		}
		for k := range args.All() {
			if s := string(k); s != "id" && s != "ack" && s != "from" {
				t.Fatalf("accepted parameter %q", k)
			}
		}
		for i := range len(query) {
			if query[i] == '%' && (i+2 >= len(query) || !isHex(query[i+1]) || !isHex(query[i+2])) {
				t.Fatalf("accepted a bad escape at %d", i)
			}
		}
	})
}

// TestParseTTL: whole seconds from 1 to MaxTTL, from the parameter or the
// header, and every value given, of a repeated parameter or header too,
// only when they agree.
func TestParseTTL(t *testing.T) {
	for _, tc := range []struct {
		query   string
		headers []string // TTLHeader's fields; none: absent
		want    time.Duration
		err     string
	}{
		{"", nil, 0, ""},
		{"ttl=60", nil, time.Minute, ""},
		{"", []string{"60"}, time.Minute, ""},
		{"ttl=60", []string{"60"}, time.Minute, ""},
		{"ttl=60", []string{"61"}, 0, `ttl="60" and X-Dhtkv-TTL: "61" disagree`},
		{"", []string{"5", "5"}, 5 * time.Second, ""},
		{"", []string{"5", "6"}, 0, `X-Dhtkv-TTL: "5" and X-Dhtkv-TTL: "6" disagree`},
		{"", []string{"5", "5", "6"}, 0, `X-Dhtkv-TTL: "5" and X-Dhtkv-TTL: "6" disagree`},
		{"", []string{"5", ""}, 0, `X-Dhtkv-TTL: "5" and X-Dhtkv-TTL: "" disagree`},
		{"ttl=5", []string{"5", "5"}, 5 * time.Second, ""},
		{"ttl=5", []string{"5", "6"}, 0, `ttl="5" and X-Dhtkv-TTL: "6" disagree`},
		{"ttl=5&ttl=5", nil, 5 * time.Second, ""},
		{"ttl=5&ttl=6", nil, 0, `ttl="5" and ttl="6" disagree`},
		{"ttl=5&id=k&ttl=", nil, 0, `ttl="5" and ttl="" disagree`},
		{"ttl=5&ttl=5", []string{"6"}, 0, `ttl="5" and X-Dhtkv-TTL: "6" disagree`},
		{"", []string{"5, 6"}, 0, "whole number"}, // two values in one field
		{"ttl=315360000", nil, MaxTTL, ""},
		{"ttl=315360001", nil, 0, "from 1 to 315360000"},
		{"ttl=0", nil, 0, "from 1"},
		{"ttl=-5", nil, 0, "from 1"},
		{"ttl=1.5", nil, 0, "whole number"},
		{"ttl=abc", nil, 0, "whole number"},
		{"ttl=", nil, 0, "whole number"},
		{"", []string{""}, 0, "whole number"},
		{"", []string{"abc", "abc"}, 0, "whole number"},
		{"ttl=99999999999999999999999", nil, 0, "whole number"},
	} {
		name := fmt.Sprintf("%s / %q", tc.query, tc.headers)
		var args fasthttp.Args
		args.Parse(tc.query)
		var h [][]byte
		for _, v := range tc.headers {
			h = append(h, []byte(v))
		}
		got, aerr := parseTTL(&args, h)
		if tc.err != "" {
			require.NotNil(t, aerr, name)
			require.Equal(t, 400, aerr.code, name)
			require.Contains(t, aerr.reason, tc.err, name)
			require.NotContains(t, aerr.reason, "\n", name)
			continue
		}
		require.Nil(t, aerr, name)
		require.Equal(t, tc.want, got, name)
	}
}

// TestParseRange: the rules of /v0/entities' query (docs/range-scans.md),
// one case each, with a cluster of 3 and keys of at most 8 bytes.
func TestParseRange(t *testing.T) {
	type want struct {
		start, end string // end "-": none
		format     scan.Format
		limit      uint64
		cluster    bool
		ack, from  int
	}
	open := want{start: "\x00", end: "-"}
	with := func(f func(*want)) want { w := open; f(&w); return w }
	for _, tc := range []struct {
		query string
		want  want
		err   string
	}{
		{query: "", err: "missing start"},
		{query: "start=%00", want: open},
		{query: "start=a", want: with(func(w *want) { w.start = "a" })},
		{query: "start=%00%ff&end=b%0A", want: with(func(w *want) { w.start, w.end = "\x00\xff", "b\n" })},
		{query: "start=%00&end=m", want: with(func(w *want) { w.end = "m" })},
		{query: "start=", err: "empty start"},
		{query: "start=%00&end=", err: "empty end"},
		{query: "start=123456789", err: "start is 9 bytes, limit is 8"},
		{query: "start=%00&end=123456789", err: "end is 9 bytes, limit is 8"},
		{query: "start=%00&limit=1", want: with(func(w *want) { w.limit = 1 })},
		{query: "start=%00&limit=1000000000", want: with(func(w *want) { w.limit = MaxScanLimit })},
		{query: "start=%00&limit=1000000001", err: "from 1 to 1000000000"},
		{query: "start=%00&limit=0", err: "from 1 to"},
		{query: "start=%00&limit=-1", err: "whole number"},
		{query: "start=%00&limit=", err: "whole number"},
		{query: "start=%00&limit=1e3", err: "whole number"},
		{query: "start=%00&limit=99999999999999999999999", err: "whole number"},
		{query: "start=%00&format=chunks", want: open},
		{query: "start=%00&format=binary", want: with(func(w *want) { w.format = scan.FormatBinary })},
		{query: "start=%00&format=json&limit=5", want: with(func(w *want) { w.format, w.limit = scan.FormatJSON, 5 })},
		{query: "start=%00&format=JSON", err: "want chunks, binary or json"},
		{query: "start=%00&format=internal", err: "want chunks, binary or json"},
		{query: "start=%00&scope=local", want: open},
		{query: "start=%00&scope=cluster", want: with(func(w *want) { w.cluster, w.ack, w.from = true, 2, 3 })},
		{query: "start=%00&scope=cluster&limit=7&ack=1&from=2", want: with(func(w *want) { w.cluster, w.limit, w.ack, w.from = true, 7, 1, 2 })},
		{query: "start=%00&scope=world", err: "want local or cluster"},
		{query: "start=%00&ack=1", err: "scope=cluster only"},
		{query: "start=%00&scope=local&from=1", err: "scope=cluster only"},
		{query: "start=%00&scope=cluster&ack=3&from=2", err: "ack=3 exceeds from=2"},
		{query: "start=%00&scope=cluster&from=4", err: "from=4 exceeds"},
	} {
		var args fasthttp.Args
		args.Parse(tc.query)
		p, aerr := parseRange([]byte(tc.query), &args, 3, 3, 8)
		if tc.err != "" {
			require.NotNil(t, aerr, tc.query)
			require.Equal(t, 400, aerr.code, tc.query)
			require.Contains(t, aerr.reason, tc.err, tc.query)
			continue
		}
		require.Nil(t, aerr, "%s: %v", tc.query, aerr)
		got := want{start: string(p.start), end: "-", format: p.format, limit: p.limit, cluster: p.cluster, ack: p.ack, from: p.from}
		if p.end != nil {
			got.end = string(p.end)
		}
		require.Equal(t, tc.want, got, tc.query)
	}
}

// TestParseReplicationDuringReplicasChange: while the replication factor
// changes, from may reach the larger factor (replicas), and so may a
// write's ack; a read's ack only the factor of the set it reads (maxAck),
// and a read's default ack is a majority of from cut to it. Outside a
// change both bounds are the factor.
func TestParseReplicationDuringReplicasChange(t *testing.T) {
	for _, tc := range []struct {
		query            string
		replicas, maxAck int
		ack, from        int
		err              string
	}{
		{"", 3, 3, 2, 3, ""},
		{"", 3, 2, 2, 3, ""},       // a read of the set of 2 from 3: the majority of 3 fits it
		{"from=2", 3, 2, 2, 2, ""}, // the set's first 2
		{"ack=2&from=3", 3, 2, 2, 3, ""},
		{"ack=3", 3, 2, 0, 0, "ack=3 exceeds 2: the replication factor is changing between 2 and 3"},
		{"ack=3&from=3", 3, 2, 0, 0, "at this stage of the change a read asks the set of 2"},
		{"", 2, 1, 1, 2, ""}, // a read of the set of 1 from 2: the majority of 2 is cut to 1
		{"ack=2", 2, 1, 0, 0, "ack=2 exceeds 1"},
		{"from=4", 3, 2, 0, 0, "from=4 exceeds the cluster's replication factor 3"},
		{"ack=3", 3, 3, 3, 3, ""},
	} {
		var args fasthttp.Args
		args.Parse(tc.query)
		ack, from, aerr := parseReplication(&args, tc.replicas, tc.maxAck)
		if tc.err != "" {
			require.NotNil(t, aerr, tc.query)
			require.Equal(t, 400, aerr.code)
			require.Contains(t, aerr.reason, tc.err)
			require.NotContains(t, aerr.reason, "\n")
			continue
		}
		require.Nil(t, aerr, "%s: %v", tc.query, aerr)
		require.Equal(t, tc.ack, ack, tc.query)
		require.Equal(t, tc.from, from, tc.query)
	}
}

package httpapi

import (
	"testing"

	"github.com/valyala/fasthttp"
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
		p, aerr := parseEntity([]byte(query), &args, size, 1024)
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

package loadgen

import (
	"fmt"
	"math/rand/v2"
	"strconv"
)

// op is the HTTP method of one request.
type op uint8

const (
	opGet op = iota
	opPut
	opDelete
)

func (o op) String() string {
	switch o {
	case opGet:
		return "GET"
	case opPut:
		return "PUT"
	}
	return "DELETE"
}

// keyGen draws key numbers in [0, keyspace). Each worker owns one: neither
// rand.Rand nor rand.Zipf is safe for concurrent use, and sharing one behind a
// lock would serialise the hot path.
type keyGen interface {
	next() uint64
}

type uniformKeys struct {
	r *rand.Rand
	n uint64
}

func (u uniformKeys) next() uint64 { return u.r.Uint64N(u.n) }

type zipfKeys struct{ z *rand.Zipf }

func (z zipfKeys) next() uint64 { return z.z.Uint64() }

func newKeyGen(c *Config, r *rand.Rand) (keyGen, error) {
	switch c.Dist {
	case DistUniform:
		return uniformKeys{r: r, n: c.Keyspace}, nil
	case DistZipf:
		z := rand.NewZipf(r, c.ZipfS, c.ZipfV, c.Keyspace-1)
		if z == nil {
			return nil, fmt.Errorf("zipf s=%v v=%v: invalid parameters", c.ZipfS, c.ZipfV)
		}
		return zipfKeys{z: z}, nil
	default:
		return nil, fmt.Errorf("dist %q: unknown", c.Dist)
	}
}

// requestGen picks the next operation and builds its absolute URI into a
// buffer it reuses, so that steady-state request generation does not allocate.
type requestGen struct {
	r         *rand.Rand
	keys      keyGen
	workload  Workload
	readRatio float64
	prefix    []byte // http[s]://host:port/v0/entity?id=k
	suffix    []byte // &ack=A&from=F, or empty
	uri       []byte
}

// newRequestGen builds the generator of one worker. seq distinguishes the
// random streams of workers that share a seed.
func newRequestGen(c *Config, target string, seed, seq uint64) (*requestGen, error) {
	addr, https, err := parseTarget(target)
	if err != nil {
		return nil, err
	}
	scheme := "http://"
	if https {
		scheme = "https://"
	}
	r := rand.New(rand.NewPCG(seed, seq))
	keys, err := newKeyGen(c, r)
	if err != nil {
		return nil, err
	}
	g := &requestGen{
		r:         r,
		keys:      keys,
		workload:  c.Workload,
		readRatio: c.ReadRatio,
		prefix:    []byte(scheme + addr + "/v0/entity?id=k"),
		suffix:    ackFromSuffix(c.Ack, c.From),
	}
	g.uri = make([]byte, 0, len(g.prefix)+20+len(g.suffix))
	return g, nil
}

// ackFromSuffix renders the replication parameters; a zero value is left out
// so that the server applies its own default.
func ackFromSuffix(ack, from int) []byte {
	var b []byte
	if ack > 0 {
		b = append(b, "&ack="...)
		b = strconv.AppendInt(b, int64(ack), 10)
	}
	if from > 0 {
		b = append(b, "&from="...)
		b = strconv.AppendInt(b, int64(from), 10)
	}
	return b
}

// next returns the next operation and its URI. The URI is only valid until
// the following call.
func (g *requestGen) next() (op, []byte) {
	var o op
	switch g.workload {
	case WorkloadPut:
		o = opPut
	case WorkloadDelete:
		o = opDelete
	case WorkloadMixed:
		if g.r.Float64() < g.readRatio {
			o = opGet
		} else {
			o = opPut
		}
	default:
		o = opGet
	}
	return o, g.uriFor(g.keys.next())
}

// uriFor builds the URI of key k<n>.
func (g *requestGen) uriFor(n uint64) []byte {
	g.uri = append(g.uri[:0], g.prefix...)
	g.uri = strconv.AppendUint(g.uri, n, 10)
	g.uri = append(g.uri, g.suffix...)
	return g.uri
}

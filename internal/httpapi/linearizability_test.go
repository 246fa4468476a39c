package httpapi_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

type kvInput struct {
	op    string // get, put, delete
	key   string
	value string
}

type kvOutput struct {
	code  int
	value string
}

type kvState struct {
	exists bool
	value  string
}

// kvModel is a single-register-per-key model; histories are partitioned by
// key, so each partition is checked as one register.
var kvModel = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range h {
			k := op.Input.(kvInput).key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		var out [][]porcupine.Operation
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return kvState{} },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(kvState), input.(kvInput), output.(kvOutput)
		switch in.op {
		case "get":
			if s.exists {
				return out.code == 200 && out.value == s.value, s
			}
			return out.code == 404, s
		case "put":
			return out.code == 201, kvState{exists: true, value: in.value}
		default:
			return out.code == 202, kvState{}
		}
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(kvInput), output.(kvOutput)
		return fmt.Sprintf("%s(%s,%q) -> %d %q", in.op, in.key, in.value, out.code, out.value)
	},
}

// TestLinearizableWithCache drives a single node's HTTP API from many
// clients over a few hot keys, with the read cache on and small enough to
// evict, records every operation's invocation and response times, and checks
// the history with porcupine.
//
// How we know the test has teeth: with the cache.Invalidate call removed
// from replica.Apply (so writes leave stale entries behind), every run
// fails with an Illegal history within the first few hundred operations: a
// GET returns a value overwritten by an acknowledged PUT. Checked by hand on
// 2026-11-22 (5 of 5 runs failed); restore the call and all pass. Dropping
// only the Wait() in the cache's fill (race 2 in the cache package's comment)
// opens a window too narrow for this test (0 of 5 runs failed);
// TestNoEntrySurfacesAfterInvalidate in internal/cache catches that one.
func TestLinearizableWithCache(t *testing.T) {
	_, base := testcluster.Single(t, func(_ int, c *node.Config) { c.CacheBytes = 1 << 20 })
	const (
		clients = 8
		opsEach = 250
	)
	keys := []string{"hot0", "hot1", "hot2"}
	start := time.Now()
	var mu sync.Mutex
	var history []porcupine.Operation
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := testcluster.NewClient(t)
			rng := rand.New(rand.NewPCG(uint64(c), 42))
			local := make([]porcupine.Operation, 0, opsEach)
			for i := 0; i < opsEach; i++ {
				in := kvInput{key: keys[rng.IntN(len(keys))]}
				switch r := rng.IntN(10); {
				case r < 6:
					in.op = "get"
				case r < 9:
					in.op, in.value = "put", fmt.Sprintf("c%d-%d", c, i)
				default:
					in.op = "delete"
				}
				call := time.Since(start).Nanoseconds()
				var out kvOutput
				switch in.op {
				case "get":
					code, body := cl.Get(t, base, in.key, 0, 0)
					out = kvOutput{code: code, value: string(body)}
					if code != 200 {
						out.value = ""
					}
				case "put":
					out.code = cl.Put(t, base, in.key, []byte(in.value), 0, 0)
				default:
					out.code = cl.Delete(t, base, in.key, 0, 0)
				}
				ret := time.Since(start).Nanoseconds()
				local = append(local, porcupine.Operation{ClientId: c, Input: in, Output: out, Call: call, Return: ret})
			}
			mu.Lock()
			history = append(history, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	res, info := porcupine.CheckOperationsVerbose(kvModel, history, 60*time.Second)
	if res != porcupine.Ok {
		path := t.TempDir() + "/history.html"
		_ = porcupine.VisualizePath(kvModel, info, path)
		t.Fatalf("history of %d operations is %s; visualization: %s", len(history), res, path)
	}
}

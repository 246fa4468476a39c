package main

import "testing"

// Judge's doc: "fail at most MaxFailFrac of requests. 404s do not count
// as failures; they are answers" (and loadgen.Result.Succeeded: any 4xx
// but 404 is a failure). Judge counted only transport errors and 5xx: a
// step whose requests were half refused with 429 (dhtkv's
// --max-connections-per-ip, 1024 by default, against bench --connections
// above it) or all with 413/400 passed, and its cheap refusals inflated
// the saturation point.
func TestJudgeCountsRefusals(t *testing.T) {
	r := &LoadResult{Mode: "rate", Rate: 1000, Requests: 1000, ThroughputRPS: 1000,
		Status: map[string]int64{"200": 500, "429": 500}, Non2xx: 500, Latency: Latency{P99: 1000}}
	if pass, why := Judge(r, 1000, testSearchConfig()); pass {
		t.Errorf("half the requests answered 429, yet the step passes: %s", why)
	}
}

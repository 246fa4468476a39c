package main

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// metaLines parses get --meta's output: one "name value" line per field.
func metaLines(t *testing.T, out string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		name, value, ok := strings.Cut(l, " ")
		require.True(t, ok, "%q", out)
		m[name] = value
	}
	return m
}

// put --ttl and get --meta against a real cluster, and their exit codes:
// a ttl as a duration or seconds, the expiry and time left, a version that
// rises with each write, 3 for an absent key, 2 for a ttl the API cannot
// take, 5 for one the node refuses.
func TestTTLAndMeta(t *testing.T) {
	c := testcluster.Start(t, 3)
	eps := "--endpoints=" + strings.Join([]string{c.URL(0), c.URL(1), c.URL(2)}, ",")
	var version uint64
	for _, s := range []step{
		{name: "put", args: []string{eps, "put", "k", "hello"}, out: "OK\n"},
		{name: "meta without ttl", args: []string{eps, "get", "--meta", "k"}, check: func(t *testing.T, out string) {
			m := metaLines(t, out)
			assert.Len(t, m, 3, out)
			v, err := strconv.ParseUint(m["version"], 10, 64)
			require.NoError(t, err, out)
			version = v
			assert.Equal(t, "5", m["size"])
			assert.Equal(t, "never", m["expires_at"])
		}},
		{name: "put --ttl duration", args: []string{eps, "put", "--ttl", "1h", "k", "hello, again"}, out: "OK\n"},
		{name: "meta with ttl", args: []string{eps, "--ack", "3", "get", "--meta", "k"}, check: func(t *testing.T, out string) {
			m := metaLines(t, out)
			v, err := strconv.ParseUint(m["version"], 10, 64)
			require.NoError(t, err, out)
			assert.Greater(t, v, version, "a later write")
			assert.Equal(t, "12", m["size"])
			exp, err := time.Parse(time.RFC3339Nano, m["expires_at"])
			require.NoError(t, err, out)
			assert.WithinDuration(t, time.Now().Add(time.Hour), exp, 5*time.Second)
			assert.Regexp(t, regexp.MustCompile(`^(3600|359\d)$`), m["ttl"], "whole seconds, as the help says")
		}},
		{name: "the value", args: []string{eps, "get", "k"}, out: "hello, again"},
		{name: "put --ttl seconds", args: []string{eps, "put", "--ttl", "90", "s", "v"}, out: "OK\n"},
		{name: "meta of seconds", args: []string{eps, "get", "--meta", "s"}, check: func(t *testing.T, out string) {
			assert.Regexp(t, `^(90|89|88)$`, metaLines(t, out)["ttl"])
		}},
		{name: "put --ttl 1", args: []string{eps, "put", "--ttl", "1", "brief", "v"}, out: "OK\n"},

		{name: "meta absent", args: []string{eps, "get", "--meta", "absent"}, code: exitNotFound, errHas: "not found"},
		{name: "meta bad ack", args: []string{eps, "--ack", "4", "get", "--meta", "k"}, code: exitBadRequest, errHas: "bad request (400): ack=4 exceeds from=3"},
		{name: "ttl fraction", args: []string{eps, "put", "--ttl", "1.5s", "k", "v"}, code: exitUsage, errHas: "want whole seconds"},
		{name: "ttl zero", args: []string{eps, "put", "--ttl", "0", "k", "v"}, code: exitUsage, errHas: "want whole seconds, 1s or more"},
		{name: "ttl negative", args: []string{eps, "put", "--ttl", "-5", "k", "v"}, code: exitUsage, errHas: "want whole seconds, 1s or more"},
		{name: "ttl word", args: []string{eps, "put", "--ttl", "soon", "k", "v"}, code: exitUsage, errHas: "want a duration (60s, 1h30m) or a number of seconds"},
		{name: "ttl over ten years", args: []string{eps, "put", "--ttl", "87601h", "k", "v"}, code: exitBadRequest, errHas: "is not a whole number of seconds from 1 to 315360000"},
		{name: "meta takes one key", args: []string{eps, "get", "--meta"}, code: exitUsage, errHas: "get takes one KEY"},
		{name: "help", args: []string{"get", "-h"}, outHas: []string{"expires_at", "--meta", "HEAD"}},
	} {
		s.run(t)
	}
	testcluster.Eventually(t, 5*time.Second, "the 1 s value expired", func() bool {
		return run([]string{eps, "get", "--meta", "brief"}, nil, &strings.Builder{}, &strings.Builder{}) == exitNotFound
	})
}

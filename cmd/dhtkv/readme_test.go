package main

import (
	"bytes"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReadmeFlagTable keeps README.md's flag table true to `dhtkv -h`: the
// same flags, and where -h states a default, the table states the same
// one (durations compared as durations, so 2m and 2m0s agree). A flag
// added, removed or given a new default fails here until the README says
// so.
func TestReadmeFlagTable(t *testing.T) {
	var out bytes.Buffer
	require.Equal(t, 0, run([]string{"-h"}, &out, &out))
	help := map[string]string{} // flag → default ("" when -h states none)
	name := regexp.MustCompile(`^  -([a-z0-9-]+)`)
	def := regexp.MustCompile(`\(default (.*)\)$`)
	var last string
	for _, line := range strings.Split(out.String(), "\n") {
		if m := name.FindStringSubmatch(line); m != nil {
			last = m[1]
			help[last] = ""
		} else if m := def.FindStringSubmatch(line); m != nil && last != "" {
			help[last] = strings.Trim(m[1], `"`)
		}
	}
	require.NotEmpty(t, help)

	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	section := string(readme)
	start := strings.Index(section, "## Flags")
	require.GreaterOrEqual(t, start, 0, "README.md has a Flags section")
	section = section[start:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	table := map[string]string{} // flag → default as the table writes it
	flagRef := regexp.MustCompile("`--([a-z0-9-]+)`")
	value := regexp.MustCompile("^`([^`]*)`")
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`--") {
			continue
		}
		d := ""
		if m := value.FindStringSubmatch(strings.TrimSpace(cells[2])); m != nil {
			d = m[1]
		}
		for _, m := range flagRef.FindAllStringSubmatch(cells[1], -1) {
			table[m[1]] = d
		}
	}
	for f, d := range help {
		td, ok := table[f]
		if !ok {
			t.Errorf("--%s is in dhtkv -h but not in README.md's flag table", f)
			continue
		}
		if d != "" && !sameDefault(d, td) {
			t.Errorf("--%s: dhtkv -h says default %q, README.md says %q", f, d, td)
		}
	}
	for f := range table {
		if _, ok := help[f]; !ok {
			t.Errorf("README.md's flag table lists --%s, which dhtkv -h does not know", f)
		}
	}
}

func sameDefault(help, readme string) bool {
	if help == readme {
		return true
	}
	h, err1 := time.ParseDuration(help)
	r, err2 := time.ParseDuration(readme)
	return err1 == nil && err2 == nil && h == r
}

// TestReadmeReplaceExample keeps README.md's `dhtkvctl replace` example
// one that works as written: replace refuses a node that answers, so the
// example stops it first (make stop-node), and the node it replaces is
// one the example started with make run-node; the new machine is then
// started with make run-node, on the port its number gives (8080+N-1).
func TestReadmeReplaceExample(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	lines := strings.Split(string(readme), "\n")
	at := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "bin/dhtkvctl replace ") })
	require.GreaterOrEqual(t, at, 0, "README.md has a dhtkvctl replace example")
	m := regexp.MustCompile(`^bin/dhtkvctl replace --admin \S+ http://127\.0\.0\.1:(\d+) http://127\.0\.0\.1:(\d+)$`).FindStringSubmatch(lines[at])
	require.NotNil(t, m, "%q", lines[at])
	node := func(port string) string {
		p, err := strconv.Atoi(port)
		require.NoError(t, err)
		return strconv.Itoa(p - 8080 + 1)
	}
	dead, repl := node(m[1]), node(m[2])
	block := strings.Join(lines[:at], "\n") + "\n"
	block = block[strings.LastIndex(block, "```"):]
	assert.Contains(t, block, "make run-node N="+dead+"\n", "the replaced node is one the example started")
	stopAt := strings.LastIndex(block, "make stop-node N="+dead+"\n")
	require.GreaterOrEqual(t, stopAt, 0, "the example stops the node before it replaces it")
	assert.Greater(t, stopAt, strings.LastIndex(block, "make run-node N="+dead+"\n"), "after it started it")
	assert.Equal(t, "make run-node N="+repl, lines[at+1], "the new machine is started right after the replace")
}

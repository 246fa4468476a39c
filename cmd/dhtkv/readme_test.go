package main

import (
	"bytes"
	"os"
	"regexp"
	"slices"
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
// example says to stop it first, and the node it replaces is one the
// example started by hand (a node of make run-cluster cannot be stopped
// alone: scripts/cluster.sh stops all three when one exits); the new
// machine is then started with --join.
func TestReadmeReplaceExample(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	lines := strings.Split(string(readme), "\n")
	at := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "bin/dhtkvctl replace ") })
	require.GreaterOrEqual(t, at, 0, "README.md has a dhtkvctl replace example")
	m := regexp.MustCompile(`^bin/dhtkvctl replace --admin \S+ (http://(\S+)) (http://(\S+))$`).FindStringSubmatch(lines[at])
	require.NotNil(t, m, "%q", lines[at])
	dead, deadAddr, newAddr := m[1], m[2], m[4]
	start := at
	for start > 0 && strings.HasPrefix(lines[start-1], "#") {
		start--
	}
	comment := strings.Join(lines[start:at], " ")
	assert.Regexp(t, `(?i)must be down|stop`, comment, "the comment above the replace says the node must be down first")
	for _, port := range []string{"8080", "8081", "8082"} {
		assert.NotEqual(t, "http://127.0.0.1:"+port, dead, "a node of make run-cluster cannot be stopped alone")
	}
	block := strings.Join(lines[:at], "\n")
	block = block[strings.LastIndex(block, "```"):]
	assert.Contains(t, block, "bin/dhtkv --listen "+deadAddr+" ", "the replaced node is one the example started")
	assert.Regexp(t, `(?m)^bin/dhtkv --listen `+regexp.QuoteMeta(newAddr)+` .*--join http://`, strings.Join(lines[at:], "\n"),
		"the new machine is started with --join after the replace")
}

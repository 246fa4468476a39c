package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Each flag comes from the first of: the command line, its DHTKV_*
// environment variable, the --config file. A source sets only what the
// ones before it left unset, so the others still apply flag by flag.
func TestConfigPrecedence(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		file string // written to a temporary file named by --config when not empty
		// want: listen, admin-listen, read-repair, sync, cache-bytes (0:
		// the default)
		listen, admin, repair string
		sync                  bool
		cache                 int64
	}{
		{name: "defaults",
			listen: "127.0.0.1:8080", admin: "", repair: "blocking", sync: true},
		{name: "file",
			file:   "listen 127.0.0.1:1\nadmin-listen 127.0.0.1:2\n# a comment\n\nread-repair async\nsync false\ncache-bytes 1GB\n",
			listen: "127.0.0.1:1", admin: "127.0.0.1:2", repair: "async", sync: false, cache: 1_000_000_000},
		{name: "file, a comment after a value",
			file:   "listen 127.0.0.1:1 # the public port\n",
			listen: "127.0.0.1:1", repair: "blocking", sync: true},
		{name: "environment",
			env:    map[string]string{"DHTKV_LISTEN": "127.0.0.1:3", "DHTKV_READ_REPAIR": "off", "DHTKV_SYNC": "false", "DHTKV_CACHE_BYTES": "2MiB"},
			listen: "127.0.0.1:3", repair: "off", sync: false, cache: 2 << 20},
		{name: "environment over file, file for the rest",
			env:    map[string]string{"DHTKV_LISTEN": "127.0.0.1:3"},
			file:   "listen 127.0.0.1:1\nadmin-listen 127.0.0.1:2\n",
			listen: "127.0.0.1:3", admin: "127.0.0.1:2", repair: "blocking", sync: true},
		{name: "flag over environment and file",
			args:   []string{"--listen", "127.0.0.1:4", "--sync=true", "--cache-bytes", "3072"},
			env:    map[string]string{"DHTKV_LISTEN": "127.0.0.1:3", "DHTKV_SYNC": "false", "DHTKV_CACHE_BYTES": "2MiB"},
			file:   "listen 127.0.0.1:1\nread-repair async\nsync false\ncache-bytes 1GB\n",
			listen: "127.0.0.1:4", repair: "async", sync: true, cache: 3072},
		{name: "an empty variable is unset",
			env:    map[string]string{"DHTKV_LISTEN": ""},
			file:   "listen 127.0.0.1:1\n",
			listen: "127.0.0.1:1", repair: "blocking", sync: true},
		{name: "DHTKV_CONFIG names the file",
			env:    map[string]string{"DHTKV_CONFIG": "FILE"},
			file:   "listen 127.0.0.1:5\n",
			listen: "127.0.0.1:5", repair: "blocking", sync: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if tc.file != "" {
				path := filepath.Join(t.TempDir(), "dhtkv.conf")
				require.NoError(t, os.WriteFile(path, []byte(tc.file), 0o600))
				if tc.env["DHTKV_CONFIG"] == "FILE" {
					tc.env["DHTKV_CONFIG"] = path
				} else {
					args = append([]string{"--config", path}, args...)
				}
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			s, err := parseFlags(args, io.Discard)
			require.NoError(t, err)
			assert.Equal(t, tc.listen, s.cfg.Listen, "listen")
			assert.Equal(t, tc.admin, s.cfg.AdminListen, "admin-listen")
			assert.Equal(t, tc.repair, s.cfg.Coordinator.ReadRepair.String(), "read-repair")
			assert.Equal(t, tc.sync, s.cfg.Store.Sync, "sync")
			if tc.cache == 0 {
				tc.cache = 64 << 20
			}
			assert.Equal(t, tc.cache, s.cfg.CacheBytes, "cache-bytes")
		})
	}
}

// A value no flag would take is refused wherever it comes from, and the
// message names where it came from.
func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(text), 0o600))
		return path
	}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		msg  string
	}{
		{"bad value in the environment", nil, map[string]string{"DHTKV_PEER_CONNS": "many"}, `environment variable "DHTKV_PEER_CONNS"`},
		{"bad value in the file", []string{"--config", write("bad.conf", "peer-conns many\n")}, nil, `flag "peer-conns" from config file`},
		{"unknown name in the file", []string{"--config", write("unknown.conf", "cache-size 1\n")}, nil, `"cache-size" not defined`},
		{"missing file", []string{"--config", filepath.Join(dir, "absent.conf")}, nil, "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			_, err := parseFlags(tc.args, io.Discard)
			require.Error(t, err)
			assert.NotErrorIs(t, err, flag.ErrHelp)
			assert.ErrorContains(t, err, tc.msg)
		})
	}
}

// --log-format: text is slog's key=value, json one object per line; both
// drop records below the level.
func TestLogFormat(t *testing.T) {
	for _, tc := range []struct {
		format string
		check  func(t *testing.T, line string)
	}{
		{"text", func(t *testing.T, line string) {
			assert.Contains(t, line, `level=WARN msg="peer not answering" peer=http://127.0.0.1:1`)
		}},
		{"json", func(t *testing.T, line string) {
			var rec map[string]any
			require.NoError(t, json.Unmarshal([]byte(line), &rec), line)
			assert.Equal(t, "WARN", rec["level"])
			assert.Equal(t, "peer not answering", rec["msg"])
			assert.Equal(t, "http://127.0.0.1:1", rec["peer"])
		}},
	} {
		t.Run(tc.format, func(t *testing.T) {
			s, err := parseFlags([]string{"--log-format", tc.format, "--log-level", "warn"}, io.Discard)
			require.NoError(t, err)
			var buf bytes.Buffer
			log, err := newLogger(&buf, s.logFormat, s.logLevel)
			require.NoError(t, err)
			log.Info("dropped below the level")
			log.Warn("peer not answering", "peer", "http://127.0.0.1:1")
			lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
			require.Len(t, lines, 1, buf.String())
			tc.check(t, lines[0])
		})
	}
}

// A size flag's bad value, wherever it comes from, gets one line that
// names the flag, the value, and what a size looks like.
func TestSizeFlagErrors(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "dhtkv.conf")
	require.NoError(t, os.WriteFile(conf, []byte("cache-bytes lots\n"), 0o600))
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
	}{
		{"command line", []string{"--cache-bytes", "lots"}, nil},
		{"environment", nil, map[string]string{"DHTKV_CACHE_BYTES": "lots"}},
		{"config file", []string{"--config", conf}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			_, err := parseFlags(tc.args, io.Discard)
			require.Error(t, err)
			msg := err.Error()
			assert.Contains(t, msg, "cache-bytes", "the flag")
			assert.Contains(t, msg, `"lots" is not a size`)
			assert.Contains(t, msg, "64MiB", "what a size looks like")
			assert.NotContains(t, msg, "strconv")
			assert.NotContains(t, msg, "\n")
		})
	}
}

// An error in the --config file names the file and the line, whichever
// way the file was named.
func TestConfigFileErrorsNameFileAndLine(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name   string
		text   string
		viaEnv bool // DHTKV_CONFIG names the file, not --config
		line   int
		msg    string
	}{
		{"bad value", "# node 1\n\nlisten 127.0.0.1:1\ncache-bytes lots\n", false, 4, `"lots" is not a size`},
		{"bad value, file from DHTKV_CONFIG", "listen 127.0.0.1:1\npeer-conns many\n", true, 2, `flag "peer-conns"`},
		{"unknown name", "listen 127.0.0.1:1\n\ncache-size 1\n", false, 3, `"cache-size" not defined`},
		{"a name without a value", "listen\n", false, 1, `"listen" has no value`},
		{"a size without a value", "sync false\ncache-bytes\n", false, 2, `"cache-bytes" has no value`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".conf")
			require.NoError(t, os.WriteFile(path, []byte(tc.text), 0o600))
			var args []string
			if tc.viaEnv {
				t.Setenv("DHTKV_CONFIG", path)
			} else {
				args = []string{"--config", path}
			}
			_, err := parseFlags(args, io.Discard)
			require.Error(t, err)
			assert.Contains(t, err.Error(), fmt.Sprintf("%s:%d: ", path, tc.line))
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
	// A boolean flag alone on its line is true.
	path := filepath.Join(dir, "bool.conf")
	require.NoError(t, os.WriteFile(path, []byte("sync\n"), 0o600))
	s, err := parseFlags([]string{"--config", path, "--sync=false"}, io.Discard)
	require.NoError(t, err)
	assert.False(t, s.cfg.Store.Sync, "the command line wins")
	require.NoError(t, os.WriteFile(path, []byte("read-repair async\nsync\n"), 0o600))
	s, err = parseFlags([]string{"--config", path}, io.Discard)
	require.NoError(t, err)
	assert.True(t, s.cfg.Store.Sync)
}

// A DHTKV_* variable no flag has (a misspelt one, which ff ignores) is
// found, once, unless it is one of dhtkvctl's; the ones a flag has are
// not.
func TestUnknownEnvironmentVariables(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"none", map[string]string{"DHTKV_CACHE_BYTES": "1MiB", "DHTKV_LOG_LEVEL": "warn", "DHTKV_CONFIG": ""}, nil},
		{"misspelt", map[string]string{"DHTKV_CACHE_BYTE": "1MiB", "DHTKV_LISTN": "127.0.0.1:1"}, []string{"DHTKV_CACHE_BYTE", "DHTKV_LISTN"}},
		{"empty still counts", map[string]string{"DHTKV_DATADIR": ""}, []string{"DHTKV_DATADIR"}},
		{"dhtkvctl's", map[string]string{"DHTKV_ENDPOINTS": "127.0.0.1:8080", "DHTKV_CACERT": "ca.pem", "DHTKV_ACK": "2"}, nil},
		{"lower case is not ff's", map[string]string{"dhtkv_listen": "x"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			s, err := parseFlags(nil, io.Discard)
			require.NoError(t, err)
			assert.Equal(t, tc.want, s.unknownEnv)
		})
	}
}

// dhtkvctl's variables, which a node does not warn about, are the ones
// the README lists for it.
func TestCtlEnvIsDhtkvctls(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	i := strings.Index(string(readme), "Global flags (also after the command's name, and from")
	require.GreaterOrEqual(t, i, 0)
	para, _, _ := strings.Cut(string(readme[i:]), "):")
	assert.ElementsMatch(t, regexp.MustCompile("`(DHTKV_[A-Z_]+)`").FindAllString(para, -1), func() []string {
		var q []string
		for _, v := range ctlEnv {
			q = append(q, "`"+v+"`")
		}
		return q
	}())
}

// DHTKV_VERSION, the variable ff offers --version, is what builds and
// deployments commonly name the version they deploy (packaging/
// compose.yaml's build argument): a version there is not the flag's, and
// used to make every start a usage error ("parse error" for the boolean
// flag) while it was exported.
func TestVersionVariableIsNotTheFlag(t *testing.T) {
	for _, tc := range []struct {
		name, env string
		args      []string
		asked     bool
		err       string
	}{
		{name: "a version exported", env: "v0.4.0-3-gdeadbee"},
		{name: "a version exported, --version given", env: "v0.4.0-3-gdeadbee", args: []string{"--version"}, asked: true},
		{name: "a build number that parses as a boolean", env: "1"},
		{name: "a build number, --version given", env: "1", args: []string{"--version"}, asked: true},
		{name: "--version=maybe", args: []string{"--version=maybe"}, err: "version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("DHTKV_VERSION", tc.env)
			s, err := parseFlags(tc.args, io.Discard)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.asked, s.version.Asked())
		})
	}
}

// TestOutOfRangeTimeoutsAndMaxScansRefused: a timeout or a stream cap the
// node would silently turn into "none" (fasthttp ignores a zero or
// negative ReadTimeout/WriteTimeout/IdleTimeout; rpc.StreamClient reads
// other nodes' streams without any idle deadline when --write-timeout is
// 0; httpapi replaces a --max-scans below 1 with 64) is refused at start,
// as --replica-timeout 0 is.
func TestOutOfRangeTimeoutsAndMaxScansRefused(t *testing.T) {
	for _, args := range [][]string{
		{"--write-timeout", "0"},
		{"--write-timeout", "-1s"},
		{"--read-timeout", "0"},
		{"--idle-timeout", "-1s"},
		{"--max-scans", "0"},
		{"--max-scans", "-3"},
	} {
		_, err := parseFlags(append([]string{"--data-dir", t.TempDir()}, args...), io.Discard)
		assert.Error(t, err, "%v accepted", args)
		if err != nil {
			assert.Contains(t, err.Error(), args[0], "%v: the error names the flag", args)
		}
	}
}

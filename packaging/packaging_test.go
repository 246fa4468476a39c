// Package packaging holds the files that deploy dhtkv (a Dockerfile, a
// compose file for a 3-node cluster, a systemd unit and its configuration,
// a Grafana dashboard) and the tests that keep them true to the code:
// paths that exist, flags the binary has, configuration it accepts, metric
// names a node exports. The tools themselves run where they are installed
// (docker build with a reachable daemon, systemd-analyze); without them
// the checks that need them are skipped and the rest still run.
package packaging

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// root is the repository root, the Docker build context.
const root = ".."

// dhtkvBinary builds cmd/dhtkv once for the package's tests.
func dhtkvBinary(t *testing.T) string {
	t.Helper()
	return testcluster.BuildBinary(t, root)
}

// dhtkvFlags are the flags of the built dhtkv, from its -h.
func dhtkvFlags(t *testing.T) map[string]bool {
	t.Helper()
	out, err := exec.Command(dhtkvBinary(t), "-h").Output()
	require.NoError(t, err, "dhtkv -h")
	names := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllSubmatch(out, -1) {
		names[string(m[1])] = true
	}
	require.Greater(t, len(names), 10, "flags in dhtkv -h:\n%s", out)
	return names
}

// assertEnvIsFlag checks that a DHTKV_ variable names one of flags: ff
// silently ignores variables no flag has, so a misspelt one would be lost.
func assertEnvIsFlag(t *testing.T, flags map[string]bool, name string) {
	t.Helper()
	flag, ok := strings.CutPrefix(name, "DHTKV_")
	require.True(t, ok, "%s: not a DHTKV_ variable", name)
	flag = strings.ReplaceAll(strings.ToLower(flag), "_", "-")
	assert.True(t, flags[flag], "%s: dhtkv has no flag --%s", name, flag)
}

// startProcess starts dhtkv with env and args, on free loopback ports and a
// temporary data directory (flags that win over env and args' own), and
// waits until it answers: the configuration is one a node starts with,
// not only one that parses. The node is stopped when the test ends.
func startProcess(t *testing.T, env []string, args ...string) {
	t.Helper()
	ports := testcluster.FreePorts(t, 2)
	listen, admin := fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])
	args = append(args, "--listen", listen, "--admin-listen", admin, "--data-dir", t.TempDir())
	cmd := exec.Command(dhtkvBinary(t), args...)
	cmd.Env = env
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	require.Eventually(t, func() bool {
		select {
		case <-exited:
			return true // reported below
		default:
		}
		resp, err := http.Get("http://" + admin + "/livez")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 15*time.Second, 20*time.Millisecond)
	select {
	case <-exited:
		t.Fatalf("dhtkv %v with %v exited at start: %s", args, env, log.String())
	default:
	}
}

// dockerfileLine is one instruction of a Dockerfile, continuation lines
// joined.
type dockerfileLine struct {
	instr string // upper case
	args  string
	stage int // index of the FROM it belongs to
}

func parseDockerfile(t *testing.T, path string) []dockerfileLine {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var out []dockerfileLine
	stage := -1
	var cur strings.Builder
	for _, l := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(l)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if s, ok := strings.CutSuffix(trimmed, `\`); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(trimmed)
		instr, args, _ := strings.Cut(cur.String(), " ")
		cur.Reset()
		instr = strings.ToUpper(instr)
		if instr == "FROM" {
			stage++
		}
		out = append(out, dockerfileLine{instr, strings.TrimSpace(args), stage})
	}
	return out
}

// goRelease is go.mod's go line's major.minor, e.g. "1.26".
func goRelease(t *testing.T) string {
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(b)
	require.NotNil(t, m, "go.mod has no go line")
	return string(m[1])
}

// TestDockerfile lints packaging/Dockerfile without Docker: a multi-stage
// build of a static binary (CGO_ENABLED=0) with go.mod's Go release, every
// path it copies exists in the build context and is let through by its
// .dockerignore, every package it builds exists, the final stage runs as
// a non-root user the binary it starts was copied to, and its DHTKV_
// variables are flags a node starts with. Where a Docker daemon answers,
// it also builds the image.
func TestDockerfile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary: a process test; runs without -short")
	}
	flags := dhtkvFlags(t)
	lines := parseDockerfile(t, "Dockerfile")
	ignore, err := os.ReadFile("Dockerfile.dockerignore")
	require.NoError(t, err)
	var froms, env []string
	last := 0
	for _, l := range lines {
		last = l.stage
	}
	require.GreaterOrEqual(t, last, 1, "multi-stage: a build stage and the image")
	var user, entrypoint string
	copied := map[string]bool{} // files of the final stage, by path
	for _, l := range lines {
		fields := strings.Fields(l.args)
		switch l.instr {
		case "FROM":
			froms = append(froms, l.args)
		case "COPY":
			var from string
			var srcs []string
			for _, f := range fields[:len(fields)-1] {
				if v, ok := strings.CutPrefix(f, "--from="); ok {
					from = v
				} else if !strings.HasPrefix(f, "--") {
					srcs = append(srcs, f)
				}
			}
			dst := fields[len(fields)-1]
			for _, s := range srcs {
				if from != "" {
					if l.stage == last {
						copied[filepath.Join(dst, filepath.Base(s))] = true
					}
					continue
				}
				_, err := os.Stat(filepath.Join(root, s))
				assert.NoError(t, err, "COPY %s: not in the build context", s)
				top, _, _ := strings.Cut(strings.TrimSuffix(s, "/"), "/")
				assert.Regexp(t, `(?m)^!`+regexp.QuoteMeta(top)+`/?$`, string(ignore), "COPY %s: Dockerfile.dockerignore excludes it", s)
			}
		case "RUN":
			if strings.Contains(l.args, "go build") {
				assert.Contains(t, l.args, "CGO_ENABLED=0", "a static binary")
				for _, m := range regexp.MustCompile(`\./cmd/[a-z0-9-]+`).FindAllString(l.args, -1) {
					assert.DirExists(t, filepath.Join(root, m))
				}
			}
		case "USER":
			if l.stage == last {
				user = l.args
			}
		case "ENTRYPOINT":
			entrypoint = l.args
		case "ENV":
			for _, m := range regexp.MustCompile(`(DHTKV_[A-Z_]+)=(\S+)`).FindAllStringSubmatch(l.args, -1) {
				assertEnvIsFlag(t, flags, m[1])
				env = append(env, m[1]+"="+m[2])
			}
		}
	}
	assert.Regexp(t, `^golang:`+regexp.QuoteMeta(goRelease(t))+`\b.* AS build$`, froms[0], "the build stage uses go.mod's Go release")
	require.NotEmpty(t, user, "the image sets a USER")
	uid, _, _ := strings.Cut(user, ":")
	assert.NotContains(t, []string{"root", "0"}, uid, "a non-root user")
	m := regexp.MustCompile(`^\["([^"]+)"`).FindStringSubmatch(entrypoint)
	require.NotNil(t, m, "ENTRYPOINT in exec form: %s", entrypoint)
	assert.True(t, copied[m[1]], "ENTRYPOINT %s is a file the image copied from the build: %v", m[1], copied)
	startProcess(t, env)

	if _, err := exec.LookPath("docker"); err != nil {
		t.Skip("docker not installed: the image is not built")
	}
	if err := exec.Command("docker", "info").Run(); err != nil {
		t.Skip("no Docker daemon answers: the image is not built")
	}
	build := exec.Command("docker", "build", "-f", "packaging/Dockerfile", "-t", "dhtkv:packaging-test", ".")
	build.Dir = root
	out, err := build.CombinedOutput()
	require.NoError(t, err, "docker build: %s", out)
}

// TestCompose checks packaging/compose.yaml: three nodes from the
// Dockerfile that form one cluster (the same --cluster everywhere, each
// --self a member, reachable by its hostname), their own volumes at the
// data directory and their own host ports, and environment variables that
// are dhtkv flags a node starts with.
func TestCompose(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary: a process test; runs without -short")
	}
	b, err := os.ReadFile("compose.yaml")
	require.NoError(t, err)
	var compose struct {
		Services map[string]struct {
			Build struct {
				Context    string `yaml:"context"`
				Dockerfile string `yaml:"dockerfile"`
			} `yaml:"build"`
			Hostname    string            `yaml:"hostname"`
			Restart     string            `yaml:"restart"`
			Environment map[string]string `yaml:"environment"`
			Ports       []string          `yaml:"ports"`
			Volumes     []string          `yaml:"volumes"`
		} `yaml:"services"`
		Volumes map[string]any `yaml:"volumes"`
	}
	require.NoError(t, yaml.Unmarshal(b, &compose))
	flags := dhtkvFlags(t)
	require.Len(t, compose.Services, 3)
	var cluster string
	selves, ports, volumes := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for name, s := range compose.Services {
		assert.FileExists(t, filepath.Join(s.Build.Context, s.Build.Dockerfile), name)
		assert.Equal(t, "..", s.Build.Context, "%s: the repository root is the build context", name)
		// unless-stopped would restart a decommissioned node, which exits
		// 0, in a loop.
		assert.Equal(t, "on-failure", s.Restart, name)
		env := []string{}
		for k, v := range s.Environment {
			assertEnvIsFlag(t, flags, k)
			// ${VAR:-default} is compose's; the node sees the default.
			v = regexp.MustCompile(`\$\{[A-Z_]+:-([^}]*)\}`).ReplaceAllString(v, "$1")
			switch k {
			case "DHTKV_CLUSTER_SECRET_FILE":
				// compose mounts the secret there; here a file of our own.
				assert.Equal(t, "/run/secrets/cluster_secret", v, name)
				v = filepath.Join(t.TempDir(), "secret")
				require.NoError(t, os.WriteFile(v, []byte("s3cret\n"), 0o600))
			case "DHTKV_CLIENT_TOKENS":
				// Likewise: the nodes listen on 0.0.0.0, which needs tokens.
				assert.Equal(t, "/run/secrets/client_tokens", v, name)
				v = testcluster.NewTokens(t).File
			}
			env = append(env, k+"="+v)
		}
		startProcess(t, env)
		if cluster == "" {
			cluster = s.Environment["DHTKV_CLUSTER"]
		}
		assert.Equal(t, cluster, s.Environment["DHTKV_CLUSTER"], "%s: the same cluster list on every node", name)
		self := s.Environment["DHTKV_SELF"]
		assert.Contains(t, strings.Split(cluster, ","), self, "%s: --self is a member", name)
		assert.Equal(t, "http://"+s.Hostname+":8080", self, "%s: its hostname and port are its URL", name)
		assert.Equal(t, "0.0.0.0:8080", s.Environment["DHTKV_LISTEN"], name)
		assert.Contains(t, s.Environment, "DHTKV_CLIENT_TOKENS", "%s listens on 0.0.0.0: it needs client tokens", name)
		assert.False(t, selves[self], "%s: --self %s twice", name, self)
		selves[self] = true
		for _, p := range s.Ports {
			host := p[:strings.LastIndex(p, ":")]
			assert.True(t, strings.HasPrefix(host, "127.0.0.1:"), "%s: %s published on loopback only", name, p)
			assert.False(t, ports[host], "%s: host port %s twice", name, host)
			ports[host] = true
		}
		require.Len(t, s.Volumes, 1, name)
		vol, dir, _ := strings.Cut(s.Volumes[0], ":")
		assert.Equal(t, s.Environment["DHTKV_DATA_DIR"], dir, "%s: the volume is the data directory", name)
		assert.Contains(t, compose.Volumes, vol, name)
		assert.False(t, volumes[vol], "%s: volume %s twice", name, vol)
		volumes[vol] = true
	}
	assert.Len(t, strings.Split(cluster, ","), 3)
	assert.Len(t, ports, 6, "a public and an admin port per node")
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	assert.Contains(t, string(readme), "(umask 077; head -c 32 /dev/urandom \\| base64 > packaging/cluster-secret)",
		"the README says how to make the secret compose needs, readable by its owner only")
	assert.Contains(t, string(readme), `(umask 077; for r in read write admin; do echo "$r $(openssl rand -hex 16)"; done > packaging/client-tokens)`,
		"the README says how to make the client tokens compose needs, readable by its owner only")
	// Compose mounts a secret's file with its host owner and mode (uid
	// and mode apply only under swarm): the files must belong to the
	// image's user, or the node cannot read them and never starts.
	dockerfile, err := os.ReadFile("Dockerfile")
	require.NoError(t, err)
	users := regexp.MustCompile(`(?m)^USER (\S+)$`).FindAllStringSubmatch(string(dockerfile), -1)
	require.NotEmpty(t, users)
	user := users[len(users)-1][1]
	assert.Contains(t, string(readme), "`sudo chown "+user+" packaging/cluster-secret packaging/client-tokens`",
		"the README gives the secrets to the image's user (%s)", user)
}

// unit is a systemd unit file: section → key → values, in order.
type unit map[string]map[string][]string

func parseUnit(t *testing.T, path string) unit {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	u := unit{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		switch {
		case l == "" || strings.HasPrefix(l, "#"):
		case strings.HasPrefix(l, "["):
			section = strings.Trim(l, "[]")
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(l, "=")
			require.True(t, ok, "%s: %q", path, l)
			u[section][k] = append(u[section][k], v)
		}
	}
	require.NoError(t, sc.Err())
	return u
}

// confValue is a setting of a dhtkv --config file.
func confValue(t *testing.T, path, name string) string {
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\s+(\S+)`).FindSubmatch(b)
	require.NotNil(t, m, "%s sets no %s", path, name)
	return string(m[1])
}

// TestSystemdUnit checks packaging/dhtkv.service and dhtkv.conf: the
// hardening options, one per row; write access to exactly the data
// directory the configuration names and the snapshots'; a stop timeout beyond the node's
// shutdown; a configuration a node starts with.
// Where systemd-analyze is installed, the unit must verify without a
// warning and its exposure rating stay at or below 2.0 ("OK").
func TestSystemdUnit(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary: a process test; runs without -short")
	}
	u := parseUnit(t, "dhtkv.service")
	svc := u["Service"]
	for _, tc := range []struct{ key, want string }{
		{"User", "dhtkv"},
		{"NoNewPrivileges", "yes"},
		{"ProtectSystem", "strict"},
		{"ProtectHome", "yes"},
		{"PrivateTmp", "yes"},
		{"PrivateDevices", "yes"},
		{"CapabilityBoundingSet", ""},
		{"AmbientCapabilities", ""},
		{"RestrictSUIDSGID", "yes"},
		{"RestrictNamespaces", "yes"},
		{"MemoryDenyWriteExecute", "yes"},
		{"LockPersonality", "yes"},
		{"ProtectKernelTunables", "yes"},
		{"ProtectKernelModules", "yes"},
		{"ProtectControlGroups", "yes"},
		{"SystemCallArchitectures", "native"},
		{"SystemCallFilter", "@system-service"},
		{"RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"},
		{"UMask", "0077"},
		{"KillSignal", "SIGTERM"},
	} {
		assert.Contains(t, svc[tc.key], tc.want, "%s=%s", tc.key, tc.want)
	}
	assert.Equal(t, []string{"/usr/local/bin/dhtkv --config /etc/dhtkv/dhtkv.conf"}, svc["ExecStart"])
	assert.Equal(t, []string{"dhtkv"}, svc["ConfigurationDirectory"], "/etc/dhtkv")
	// The node writes its data directory and its snapshots' and nothing
	// else; systemd creates both for the user.
	dataDir := confValue(t, "dhtkv.conf", "data-dir")
	snapshotDir := confValue(t, "dhtkv.conf", "snapshot-dir") // the only place /snapshot writes
	assert.Equal(t, "/var/lib/dhtkv-snapshots", snapshotDir)
	assert.Equal(t, []string{dataDir + " " + snapshotDir}, svc["ReadWritePaths"])
	assert.Equal(t, []string{"dhtkv dhtkv-snapshots"}, svc["StateDirectory"])
	assert.Equal(t, "/var/lib/dhtkv", dataDir)
	stop, err := time.ParseDuration(svc["TimeoutStopSec"][0])
	require.NoError(t, err)
	assert.Greater(t, stop, 10*time.Second, "more than --shutdown-timeout")

	startProcess(t, []string{}, "--config", "dhtkv.conf") // none of the test's own DHTKV_ variables

	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze not installed")
	}
	// verify needs ExecStart's binary to exist: point it at the built one.
	b, err := os.ReadFile("dhtkv.service")
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "dhtkv.service")
	require.NoError(t, os.WriteFile(path, bytes.ReplaceAll(b, []byte("/usr/local/bin/dhtkv"), []byte(dhtkvBinary(t))), 0o644))
	out, err := exec.Command("systemd-analyze", "verify", path).CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Empty(t, strings.TrimSpace(string(out)), "systemd-analyze verify warns")
	out, err = exec.Command("systemd-analyze", "security", "--offline=true", "--threshold=20", path).CombinedOutput()
	require.NoError(t, err, "exposure above 2.0:\n%s", out)
	assert.True(t, slices.ContainsFunc(strings.Split(string(out), "\n"), func(l string) bool { return strings.Contains(l, "Overall exposure level") }), "%s", out)
}

// installs are the files the install steps in dhtkv.service's header
// comment put in place: destination → source, relative to the
// repository (bin/: built by make build). Each step is an `install` command line (several may be
// joined with &&), with a destination directory (-t DIR, or a last
// argument ending in /, or several sources) or a destination file.
func installs(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		comment, ok := strings.CutPrefix(line, "#")
		if !ok {
			continue
		}
		comment, _, _ = strings.Cut(comment, "#") // a remark after the command
		for _, cmd := range strings.Split(comment, "&&") {
			args := strings.Fields(cmd)
			if len(args) == 0 || args[0] != "install" {
				continue
			}
			var dir string
			var srcs []string
			for i := 1; i < len(args); i++ {
				switch a := args[i]; {
				case a == "-t":
					i++
					dir = args[i]
				case a == "-m" || a == "-o" || a == "-g":
					i++
				case strings.HasPrefix(a, "-"):
				default:
					srcs = append(srcs, a)
				}
			}
			if dir == "" && len(srcs) > 1 {
				dest := srcs[len(srcs)-1]
				srcs = srcs[:len(srcs)-1]
				if len(srcs) == 1 && !strings.HasSuffix(dest, "/") {
					out[dest] = srcs[0]
					continue
				}
				dir = dest
			}
			for _, pattern := range srcs {
				if strings.HasPrefix(pattern, "bin/") { // built by make build
					out[filepath.Join(dir, filepath.Base(pattern))] = pattern
					continue
				}
				matches, err := filepath.Glob(filepath.Join(root, pattern))
				require.NoError(t, err)
				require.NotEmpty(t, matches, "%s: install %s: no such file in the repository", path, pattern)
				for _, m := range matches {
					rel, err := filepath.Rel(root, m)
					require.NoError(t, err)
					out[filepath.Join(dir, filepath.Base(m))] = rel
				}
			}
		}
	}
	return out
}

// The unit's Documentation= names documents that are there once the
// unit is installed as its comment says: a file:// URI a file the install
// steps copy from the repository.
func TestSystemdUnitDocumentation(t *testing.T) {
	u := parseUnit(t, "dhtkv.service")
	installed := installs(t, "dhtkv.service")
	require.Contains(t, installed, "/etc/systemd/system/dhtkv.service", "the install steps are parsed: %v", installed)
	docs := strings.Fields(strings.Join(u["Unit"]["Documentation"], " "))
	require.NotEmpty(t, docs, "the unit names its documentation")
	for _, uri := range docs {
		path, ok := strings.CutPrefix(uri, "file://")
		if !ok {
			assert.Regexp(t, `^(https?://|man:)`, uri, "a URI systemd takes")
			continue
		}
		src, ok := installed[path]
		if assert.True(t, ok, "Documentation=%s: no install step puts a file there; installed: %v", uri, installed) {
			assert.FileExists(t, filepath.Join(root, src))
		}
	}
}

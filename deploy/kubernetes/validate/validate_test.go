package validate

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

const (
	manifests = ".."       // deploy/kubernetes
	repoRoot  = "../../.." // the build context of cmd/dhtkv
)

var (
	binOnce sync.Once
	bin     *Binary
	binErr  error
	binDir  string
)

// binary builds cmd/dhtkv once for the package's tests.
func binary(t *testing.T) *Binary {
	t.Helper()
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "dhtkv-validate-"); binErr == nil {
			bin, binErr = BuildBinary(repoRoot, binDir)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return bin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// files returns deploy/kubernetes's files with stand-ins for the secret
// files git ignores (an operator's own, if present, are not read).
func files(t *testing.T) map[string]string {
	t.Helper()
	f, err := ReadDir(manifests)
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range SecretFiles {
		f[name] = content
	}
	return f
}

// TestManifests renders deploy/kubernetes and checks it: every object
// decodes strictly, and every invariant of Check holds for the dhtkv this
// repository builds.
func TestManifests(t *testing.T) {
	b, err := Render(files(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := Check(b, binary(t), t.TempDir()); err != nil {
		t.Fatal(err)
	}
	ignore, err := os.ReadFile(filepath.Join(manifests, ".gitignore"))
	if err != nil {
		t.Fatal(err)
	}
	for name := range SecretFiles {
		if !strings.Contains(string(ignore), "\n/"+name+"\n") {
			t.Errorf("deploy/kubernetes/.gitignore does not ignore the secret file %s", name)
		}
	}
	dockerfile, err := os.ReadFile(filepath.Join(repoRoot, "packaging", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	// The init image: busybox's shell at /busybox/sh (the init
	// container's command) and dhtkvctl (init.sh's).
	stage, found := "", false
	for _, part := range strings.Split(string(dockerfile), "\nFROM ")[1:] {
		if head, _, _ := strings.Cut(part, "\n"); strings.HasSuffix(head, " AS init") {
			stage, found = part, true
		}
	}
	if !found || !strings.Contains(stage, ":debug-nonroot AS init") || !strings.Contains(stage, "dhtkvctl") || !strings.Contains(stage, "/busybox") {
		t.Errorf("packaging/Dockerfile: want a stage `FROM ...:debug-nonroot AS init` with dhtkvctl and busybox:\n%s", stage)
	}
}

// TestManifestsStartANode starts the dhtkv this repository builds with the
// StatefulSet's arguments and environment, but on loopback ports, in a
// temporary directory and as a cluster of one (the pod's own addresses,
// paths and peers do not exist here), and asks the probes' paths on the
// admin port: the configuration is one a node starts with, the probes
// answer 200 once it is up, and SIGTERM stops it, exit 0, within the
// pod's grace period.
func TestManifestsStartANode(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the binary: runs without -short")
	}
	b, err := Render(files(t))
	if err != nil {
		t.Fatal(err)
	}
	pod := b.StatefulSet.Spec.Template.Spec
	node := container(pod.Containers, nodeContainer)
	dir := t.TempDir()
	secret, err := writeTemp(dir, "cluster-secret", SecretFiles["cluster-secret"])
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := writeTemp(dir, "client-tokens", SecretFiles["client-tokens"])
	if err != nil {
		t.Fatal(err)
	}
	api, admin := freeAddr(t), freeAddr(t)
	overrides := map[string]string{
		"listen": api, "admin-listen": admin,
		"data-dir": filepath.Join(dir, "data"), "snapshot-dir": filepath.Join(dir, "snapshots"),
		"cluster-secret-file": secret, "client-tokens": tokens,
		// The test machine's disk is shared: no 1% ballast.
		"ballast-size": "0",
	}
	var args []string
	for _, a := range node.Args {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if _, ok := overrides[name]; !ok {
			args = append(args, a)
		}
	}
	for k, v := range overrides {
		args = append(args, "--"+k+"="+v)
	}
	env := []string{"PATH=" + os.Getenv("PATH")}
	for _, e := range node.Env {
		switch {
		case e.Name == "DHTKV_SELF" || e.Name == "DHTKV_CONFIG" || e.Name == "POD_NAME":
			// A cluster of one: --self from --listen, no --cluster.
		case e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil:
			env = append(env, e.Name+"="+node.Resources.Limits.Cpu().String())
		default:
			env = append(env, e.Name+"="+e.Value)
		}
	}
	cmd := exec.Command(binary(t).Path, args...)
	cmd.Env = env
	var log strings.Builder
	var logMu sync.Mutex
	cmd.Stdout, cmd.Stderr = lockedWriter{&log, &logMu}, lockedWriter{&log, &logMu}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	logged := func() string {
		logMu.Lock()
		defer logMu.Unlock()
		return log.String()
	}

	get := func(p *corev1.Probe) (int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(p.TimeoutSeconds)*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+p.HTTPGet.Path, nil)
		if err != nil {
			return 0, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	deadline := time.Now().Add(time.Minute)
	for {
		select {
		case err := <-exited:
			stopped = true
			t.Fatalf("dhtkv exited at start (%v): %s", err, logged())
		default:
		}
		if code, err := get(node.StartupProbe); err == nil && code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("startupProbe %s never answered 200: %s", node.StartupProbe.HTTPGet.Path, logged())
		}
		time.Sleep(50 * time.Millisecond) // polling a process from outside
	}
	for _, p := range []*corev1.Probe{node.LivenessProbe, node.ReadinessProbe} {
		code, err := get(p)
		if err != nil || code != http.StatusOK {
			t.Errorf("GET %s on the admin port: %d, %v", p.HTTPGet.Path, code, err)
		}
	}
	if strings.Contains(logged(), "readable by other users") || strings.Contains(logged(), "environment variable ignored") {
		t.Errorf("the node warns at start: %s", logged())
	}

	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
	select {
	case err := <-exited:
		stopped = true
		if err != nil {
			t.Fatalf("dhtkv exited with %v on SIGTERM: %s", err, logged())
		}
		t.Logf("stopped in %v", time.Since(start))
	case <-time.After(grace):
		t.Fatalf("dhtkv did not stop within the grace period %v: %s", grace, logged())
	}
}

type lockedWriter struct {
	b  *strings.Builder
	mu *sync.Mutex
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// freeAddr is a loopback address whose port was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestManifestsCatchMistakes: each mistake, made in a copy of the files,
// fails Render or Check with the reason.
func TestManifestsCatchMistakes(t *testing.T) {
	type edit struct{ file, old, new string }
	for _, tc := range []struct {
		name  string
		edits []edit
		want  string
	}{
		{"an unknown field", []edit{{"statefulset.yaml", "          startupProbe:\n", "          startupProbes:\n"}}, `unknown field "spec.template.spec.containers[0].startupProbes"`},
		{"a field given twice", []edit{{"pdb.yaml", "  maxUnavailable: 1\n", "  maxUnavailable: 1\n  maxUnavailable: 2\n"}}, "maxUnavailable"},
		{"readiness on the public port", []edit{{"statefulset.yaml", "              path: /readyz\n              port: admin\n", "              path: /readyz\n              port: api\n"}}, "readinessProbe: port api is not the admin port 6060"},
		{"liveness on /readyz", []edit{{"statefulset.yaml", "          livenessProbe:\n            httpGet:\n              path: /livez\n", "          livenessProbe:\n            httpGet:\n              path: /readyz\n"}}, `livenessProbe: path "/readyz", want /livez`},
		{"admin port moved, probes not", []edit{{"statefulset.yaml", "--admin-listen=0.0.0.0:6060", "--admin-listen=0.0.0.0:6061"}}, "no containerPort 6061"},
		{"a Secret key missing", []edit{{"kustomization.yaml", "      - admin-token\n", ""}}, `DHTKV_TOKEN_FILE "/etc/dhtkv-secrets/admin-token": not a key of Secret dhtkv`},
		{"the script copies a key the Secret lacks", []edit{{"kustomization.yaml", "      - client-tokens\n", ""}}, "init.sh copies client-tokens from Secret dhtkv, which has no such key"},
		{"the node reads a file nobody wrote", []edit{{"statefulset.yaml", "--client-tokens=/run/dhtkv/client-tokens", "--client-tokens=/etc/dhtkv-secrets/client-tokens"}}, "--client-tokens \"/etc/dhtkv-secrets/client-tokens\" is not one of the copies"},
		{"PDB selects nothing", []edit{{"pdb.yaml", "      app.kubernetes.io/name: dhtkv\n", "      app.kubernetes.io/name: dhtkv-nodes\n"}}, "PodDisruptionBudget dhtkv: its selector does not select"},
		{"PDB of two", []edit{{"pdb.yaml", "maxUnavailable: 1", "maxUnavailable: 2"}}, "want maxUnavailable 1"},
		{"a Service selects nothing", []edit{{"service.yaml", "  name: dhtkv-client\n  labels:\n    app.kubernetes.io/name: dhtkv\nspec:\n  selector:\n    app.kubernetes.io/name: dhtkv\n", "  name: dhtkv-client\n  labels:\n    app.kubernetes.io/name: dhtkv\nspec:\n  selector:\n    app.kubernetes.io/name: dhtkv-client\n"}}, "Service dhtkv-client: its selector map[app.kubernetes.io/name:dhtkv-client] does not select"},
		{"an unknown flag", []edit{{"statefulset.yaml", "--replicas=3", "--replica=3"}}, "dhtkv has no flag --replica"},
		{"a value the binary refuses", []edit{{"statefulset.yaml", "--replicas=3", "--replicas=three"}}, `dhtkv refuses the configuration (exit 2): dhtkv: error parsing commandline arguments: invalid value "three" for flag -replicas`},
		{"--cluster in the arguments", []edit{{"statefulset.yaml", "            - --replicas=3\n", "            - --replicas=3\n            - --cluster=http://dhtkv-0.dhtkv:8080\n"}}, "--cluster is set by argument"},
		{"data outside the volume", []edit{{"statefulset.yaml", "--data-dir=/var/lib/dhtkv/data", "--data-dir=/data"}}, "--data-dir /data is not inside the \"data\" volume's mount"},
		{"data at the volume's root", []edit{{"statefulset.yaml", "--data-dir=/var/lib/dhtkv/data", "--data-dir=/var/lib/dhtkv"}}, "is not inside the \"data\" volume's mount"},
		{"not ready, not found", []edit{{"service.yaml", "publishNotReadyAddresses: true", "publishNotReadyAddresses: false"}}, "publishNotReadyAddresses must be true"},
		{"OrderedReady", []edit{{"statefulset.yaml", "podManagementPolicy: Parallel", "podManagementPolicy: OrderedReady"}}, "want Parallel"},
		{"Service variables", []edit{{"statefulset.yaml", "enableServiceLinks: false", "enableServiceLinks: true"}}, "enableServiceLinks must be false"},
		{"GOMEMLIMIT above the limit", []edit{{"statefulset.yaml", "value: 1536MiB", "value: 2GiB"}}, "GOMEMLIMIT 2GiB is above 90% of the memory limit 2Gi"},
		{"caches above GOMEMLIMIT", []edit{{"statefulset.yaml", "--cache-bytes=256MiB", "--cache-bytes=1GiB"}}, "above GOMEMLIMIT 1536MiB"},
		{"a short grace period", []edit{{"statefulset.yaml", "terminationGracePeriodSeconds: 60", "terminationGracePeriodSeconds: 30"}}, "terminationGracePeriodSeconds must be at least --shutdown-timeout 20s"},
		{"root", []edit{{"statefulset.yaml", "runAsNonRoot: true\n        runAsUser: 65532", "runAsNonRoot: true\n        runAsUser: 0"}}, "want runAsNonRoot and a non-zero runAsUser"},
		{"seeds of another StatefulSet", []edit{{"statefulset.yaml", "http://dhtkv-0.dhtkv:8080,http://dhtkv-1.dhtkv:8080,http://dhtkv-2.dhtkv:8080", "http://db-0.dhtkv:8080,http://db-1.dhtkv:8080,http://db-2.dhtkv:8080"}}, "SEED_URLS"},
		{"an image no entry sets", []edit{{"statefulset.yaml", "          image: dhtkv\n", "          image: dhtkv-node\n"}}, `image "dhtkv-node" is not set by an images entry`},
		{"a manifest not listed", []edit{{"extra.yaml", "", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n"}}, "resources does not list extra.yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := files(t)
			for _, e := range tc.edits {
				if e.old == "" {
					f[e.file] = e.new
					continue
				}
				if n := strings.Count(f[e.file], e.old); n != 1 {
					t.Fatalf("%s holds %q %d times, want once", e.file, e.old, n)
				}
				f[e.file] = strings.Replace(f[e.file], e.old, e.new, 1)
			}
			b, err := Render(f)
			if err == nil {
				err = Check(b, binary(t), t.TempDir())
			}
			if err == nil {
				t.Fatalf("no error; want one saying %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error does not say %q:\n%v", tc.want, err)
			}
		})
	}
}

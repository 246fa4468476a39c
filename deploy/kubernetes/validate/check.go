package validate

import (
	"errors"
	"fmt"
	"math"
	"net"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The names the manifests give what the checks look for.
const (
	nodeContainer = "dhtkv"
	initContainer = "init"
	dataVolume    = "data" // the volumeClaimTemplate
	runVolume     = "run"  // what the init container hands the node
	initScript    = "init.sh"
	seeds         = 3
	// versionFilterBytes is replica.VersionFilter's fixed size
	// (docs/storage.md, Memory budget of one node).
	versionFilterBytes = 8 << 20
	// shutdownMargin is what the grace period must leave after
	// --shutdown-timeout: the peer calls' end and Pebble's close.
	shutdownMargin = 15 * time.Second
)

// checker collects what is wrong with a bundle.
type checker struct {
	b    *Bundle
	bin  *Binary
	errs []error
}

func (c *checker) errorf(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf(format, args...))
}

// Check returns everything wrong with b for the binary bin: the
// invariants listed in the package comment, each error naming the object
// and field. tmp is a directory for the files the binary is given.
func Check(b *Bundle, bin *Binary, tmp string) error {
	c := &checker{b: b, bin: bin}
	sts := b.StatefulSet
	if sts == nil {
		return errors.New("no StatefulSet")
	}
	pod := &sts.Spec.Template.Spec
	node := container(pod.Containers, nodeContainer)
	ini := container(pod.InitContainers, initContainer)
	if node == nil || ini == nil {
		return fmt.Errorf("StatefulSet %s: want a container %q and an init container %q", sts.Name, nodeContainer, initContainer)
	}
	flags := c.flags(node)
	c.statefulSet(sts)
	c.selectors(sts)
	ports := c.ports(node, flags)
	c.probes(node, ports)
	c.services(sts, node, ports)
	c.identity(sts, node, ini, ports)
	c.volumes(sts, node, ini, flags)
	c.secrets(pod, node, ini, flags)
	c.script(pod, ini)
	c.resources(node, flags)
	c.security(pod)
	c.images(pod)
	c.grace(pod, flags)
	if len(c.errs) == 0 {
		c.parses(node, ini, tmp)
	}
	return errors.Join(c.errs...)
}

func container(cs []corev1.Container, name string) *corev1.Container {
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	return nil
}

func env(ct *corev1.Container, name string) *corev1.EnvVar {
	for i := range ct.Env {
		if ct.Env[i].Name == name {
			return &ct.Env[i]
		}
	}
	return nil
}

// envValue is a plain env value of ct ("" when unset or from elsewhere).
func envValue(ct *corev1.Container, name string) string {
	if e := env(ct, name); e != nil {
		return e.Value
	}
	return ""
}

// flags reads the node's settings as the binary would: the defaults of
// -h, under the DHTKV_ variables, under the arguments (each
// --name=value, or --name for a boolean). Flags the binary does not
// have, and a flag given twice, are errors. The per-pod flags (cluster,
// join) must come from the init container's --config file, which every
// other source overrides, and self from DHTKV_SELF.
func (c *checker) flags(ct *corev1.Container) map[string]string {
	out := map[string]string{}
	for k, v := range c.bin.Flags {
		out[k] = v
	}
	set := map[string]string{} // flag → where
	for _, e := range ct.Env {
		name, ok := strings.CutPrefix(e.Name, "DHTKV_")
		if !ok {
			continue
		}
		f := strings.ReplaceAll(strings.ToLower(name), "_", "-")
		if _, known := c.bin.Flags[f]; !known {
			c.errorf("container %s: env %s: dhtkv has no flag --%s", ct.Name, e.Name, f)
			continue
		}
		set[f] = "env " + e.Name
		out[f] = e.Value
	}
	if len(ct.Command) > 0 {
		c.errorf("container %s: command %v replaces the image's entrypoint, dhtkv", ct.Name, ct.Command)
	}
	for _, a := range ct.Args {
		rest, ok := strings.CutPrefix(a, "--")
		if !ok {
			c.errorf("container %s: argument %q: want --name=value", ct.Name, a)
			continue
		}
		name, value, hasValue := strings.Cut(rest, "=")
		if _, known := c.bin.Flags[name]; !known {
			c.errorf("container %s: argument %q: dhtkv has no flag --%s", ct.Name, a, name)
			continue
		}
		if where, twice := set[name]; twice {
			c.errorf("container %s: argument %q: --%s is also set by %s", ct.Name, a, name, where)
		}
		set[name] = "argument " + a
		if !hasValue {
			value = "true"
		}
		out[name] = value
	}
	for _, f := range []string{"cluster", "join"} {
		if where, ok := set[f]; ok {
			c.errorf("container %s: --%s is set by %s: it differs by pod and comes from the init container's config file, which that would override", ct.Name, f, where)
		}
	}
	if set["config"] != "env DHTKV_CONFIG" {
		c.errorf("container %s: want DHTKV_CONFIG naming the init container's config file", ct.Name)
	}
	if set["self"] != "env DHTKV_SELF" {
		c.errorf("container %s: want DHTKV_SELF, the pod's URL", ct.Name)
	}
	return out
}

func (c *checker) statefulSet(sts *appsv1.StatefulSet) {
	if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		c.errorf("StatefulSet %s: podManagementPolicy %q: want Parallel (a node is ready only with a quorum, so OrderedReady never starts the second pod)", sts.Name, sts.Spec.PodManagementPolicy)
	}
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas < seeds {
		c.errorf("StatefulSet %s: replicas below the %d seeds", sts.Name, seeds)
	}
	if p := sts.Spec.Template.Spec.EnableServiceLinks; p == nil || *p {
		c.errorf("StatefulSet %s: enableServiceLinks must be false: Service variables named DHTKV_* would be read as flags", sts.Name)
	}
	if r := sts.Spec.PersistentVolumeClaimRetentionPolicy; r == nil || r.WhenScaled != appsv1.RetainPersistentVolumeClaimRetentionPolicyType || r.WhenDeleted != appsv1.RetainPersistentVolumeClaimRetentionPolicyType {
		c.errorf("StatefulSet %s: persistentVolumeClaimRetentionPolicy must retain the claims: a claim is a node's data and identity", sts.Name)
	}
}

// selects reports whether sel selects pods labelled lbls.
func selects(sel *metav1.LabelSelector, lbls map[string]string) bool {
	if sel == nil {
		return false
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && !s.Empty() && s.Matches(labels.Set(lbls))
}

func (c *checker) selectors(sts *appsv1.StatefulSet) {
	lbls := sts.Spec.Template.Labels
	if !selects(sts.Spec.Selector, lbls) {
		c.errorf("StatefulSet %s: its selector does not select its pod template's labels %v", sts.Name, lbls)
	}
	pdb := c.b.PDB
	if pdb == nil {
		return
	}
	if !selects(pdb.Spec.Selector, lbls) {
		c.errorf("PodDisruptionBudget %s: its selector does not select the StatefulSet's pods (labels %v)", pdb.Name, lbls)
	}
	if pdb.Spec.MinAvailable != nil || pdb.Spec.MaxUnavailable == nil || *pdb.Spec.MaxUnavailable != intstr.FromInt32(1) {
		c.errorf("PodDisruptionBudget %s: want maxUnavailable 1 and no minAvailable (3 replicas, ack 2: one node down at a time)", pdb.Name)
	}
	for _, s := range c.b.Services {
		if len(s.Spec.Selector) == 0 || !labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(lbls)) {
			c.errorf("Service %s: its selector %v does not select the StatefulSet's pods (labels %v)", s.Name, s.Spec.Selector, lbls)
		}
	}
}

// nodePorts are the node's public and admin ports.
type nodePorts struct{ api, admin int32 }

// port is the port of a host:port flag value.
func port(value string) (int32, error) {
	_, p, err := net.SplitHostPort(value)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(p, 10, 16)
	return int32(n), err
}

// ports checks that the container declares the ports --listen and
// --admin-listen bind, on every address (a pod is reached on its IP).
func (c *checker) ports(ct *corev1.Container, flags map[string]string) nodePorts {
	var out nodePorts
	for _, f := range []struct {
		flag string
		p    *int32
	}{{"listen", &out.api}, {"admin-listen", &out.admin}} {
		v := flags[f.flag]
		host, _, _ := net.SplitHostPort(v)
		p, err := port(v)
		if err != nil {
			c.errorf("container %s: --%s %q: %v", ct.Name, f.flag, v, err)
			continue
		}
		if host != "0.0.0.0" && host != "" && host != "::" {
			c.errorf("container %s: --%s %q: other pods reach the node on its pod IP: listen on 0.0.0.0", ct.Name, f.flag, v)
		}
		*f.p = p
		found := false
		for _, cp := range ct.Ports {
			found = found || cp.ContainerPort == p
		}
		if !found {
			c.errorf("container %s: no containerPort %d for --%s %s", ct.Name, p, f.flag, v)
		}
	}
	return out
}

// resolve is the container port a probe's or Service's target names.
func resolve(ct *corev1.Container, target intstr.IntOrString) (int32, bool) {
	if target.Type == intstr.Int {
		return target.IntVal, true
	}
	for _, cp := range ct.Ports {
		if cp.Name == target.StrVal {
			return cp.ContainerPort, true
		}
	}
	return 0, false
}

// probes checks that the probes ask the admin listener: liveness and
// start-up /livez (200 whenever the process answers, so a node that
// rebuilds or streams partitions is never restarted for it), readiness
// /readyz.
func (c *checker) probes(ct *corev1.Container, ports nodePorts) {
	for _, p := range []struct {
		kind, path string
		probe      *corev1.Probe
	}{{"startupProbe", "/livez", ct.StartupProbe}, {"livenessProbe", "/livez", ct.LivenessProbe}, {"readinessProbe", "/readyz", ct.ReadinessProbe}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			c.errorf("container %s: %s: want an httpGet of %s", ct.Name, p.kind, p.path)
			continue
		}
		g := p.probe.HTTPGet
		if g.Path != p.path {
			c.errorf("container %s: %s: path %q, want %s", ct.Name, p.kind, g.Path, p.path)
		}
		if g.Scheme != "" && g.Scheme != corev1.URISchemeHTTP {
			c.errorf("container %s: %s: scheme %s: the admin listener is plain HTTP", ct.Name, p.kind, g.Scheme)
		}
		if port, ok := resolve(ct, g.Port); !ok || port != ports.admin {
			c.errorf("container %s: %s: port %s is not the admin port %d (--admin-listen), which serves %s", ct.Name, p.kind, g.Port.String(), ports.admin, p.path)
		}
	}
	if p := ct.LivenessProbe; p != nil && p.PeriodSeconds*p.FailureThreshold < 30 {
		c.errorf("container %s: livenessProbe restarts a node after %ds without an answer: a node under load or a long GC pause may take that", ct.Name, p.PeriodSeconds*p.FailureThreshold)
	}
}

// services checks the headless Service the StatefulSet names (it must
// publish pods that are not ready: a node is ready only once it reaches
// its peers) and that every Service port leads to a container port.
func (c *checker) services(sts *appsv1.StatefulSet, ct *corev1.Container, ports nodePorts) {
	h := c.b.Service(sts.Spec.ServiceName)
	if h == nil {
		c.errorf("StatefulSet %s: serviceName %q: no such Service", sts.Name, sts.Spec.ServiceName)
	} else {
		if h.Spec.ClusterIP != corev1.ClusterIPNone {
			c.errorf("Service %s: the StatefulSet's Service must be headless (clusterIP: None)", h.Name)
		}
		if !h.Spec.PublishNotReadyAddresses {
			c.errorf("Service %s: publishNotReadyAddresses must be true: peers must resolve a node that is not ready yet, or a new cluster never forms", h.Name)
		}
	}
	clients := 0
	for _, s := range c.b.Services {
		if s.Spec.ClusterIP != corev1.ClusterIPNone {
			clients++
		}
		for _, sp := range s.Spec.Ports {
			target := sp.TargetPort
			if target.Type == intstr.Int && target.IntVal == 0 {
				target = intstr.FromInt32(sp.Port)
			}
			p, ok := resolve(ct, target)
			if !ok {
				c.errorf("Service %s: port %s targets %s, which container %s does not declare", s.Name, sp.Name, target.String(), ct.Name)
			} else if s.Spec.ClusterIP != corev1.ClusterIPNone && p != ports.api {
				c.errorf("Service %s: port %s targets %s (container port %d), not the entity API's --listen port %d: clients would reach another listener", s.Name, sp.Name, target.String(), p, ports.api)
			}
		}
	}
	if clients == 0 {
		c.errorf("no client Service (one with a cluster IP)")
	}
}

// identity checks the node URLs: each pod's (http://$(POD_NAME).SERVICE:PORT,
// the same in the node's DHTKV_SELF and the init container's SELF_URL),
// the seeds' (the first pods'), and the driver joins go through (pod 0).
func (c *checker) identity(sts *appsv1.StatefulSet, node, ini *corev1.Container, ports nodePorts) {
	svc := sts.Spec.ServiceName
	for _, ct := range []*corev1.Container{node, ini} {
		e := env(ct, "POD_NAME")
		if e == nil || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.name" || ct.Env[0].Name != "POD_NAME" {
			c.errorf("container %s: want POD_NAME from metadata.name, first (the variables after it refer to it)", ct.Name)
		}
	}
	self := fmt.Sprintf("http://$(POD_NAME).%s:%d", svc, ports.api)
	if v := envValue(node, "DHTKV_SELF"); v != self {
		c.errorf("container %s: DHTKV_SELF %q, want %q", node.Name, v, self)
	}
	if v := envValue(ini, "SELF_URL"); v != self {
		c.errorf("container %s: SELF_URL %q, want %q", ini.Name, v, self)
	}
	urls := make([]string, seeds)
	for i := range urls {
		urls[i] = fmt.Sprintf("http://%s-%d.%s:%d", sts.Name, i, svc, ports.api)
	}
	if v := envValue(ini, "SEED_URLS"); v != strings.Join(urls, ",") {
		c.errorf("container %s: SEED_URLS %q, want the first %d pods' URLs %q", ini.Name, v, seeds, strings.Join(urls, ","))
	}
	if v := envValue(ini, "DRIVER_URL"); v != urls[0] {
		c.errorf("container %s: DRIVER_URL %q, want pod 0's URL %q", ini.Name, v, urls[0])
	}
	if v, want := envValue(ini, "DRIVER_ADMIN"), fmt.Sprintf("%s-0.%s:%d", sts.Name, svc, ports.admin); v != want {
		c.errorf("container %s: DRIVER_ADMIN %q, want pod 0's admin listener %q", ini.Name, v, want)
	}
}

// mountOf is where ct mounts volume name, and whether read-only.
func mountOf(ct *corev1.Container, name string) (string, bool, bool) {
	for _, m := range ct.VolumeMounts {
		if m.Name == name {
			return m.MountPath, m.ReadOnly, true
		}
	}
	return "", false, false
}

// under reports whether p is strictly inside directory dir.
func under(p, dir string) bool {
	return strings.HasPrefix(path.Clean(p), path.Clean(dir)+"/")
}

// volumes checks that the data and snapshot directories are on the
// claim's volume, below its root (which may hold lost+found), the data
// directory as the init container sees it too.
func (c *checker) volumes(sts *appsv1.StatefulSet, node, ini *corev1.Container, flags map[string]string) {
	if !slices.ContainsFunc(sts.Spec.VolumeClaimTemplates, func(p corev1.PersistentVolumeClaim) bool { return p.Name == dataVolume }) {
		c.errorf("StatefulSet %s: no volumeClaimTemplate %q", sts.Name, dataVolume)
		return
	}
	mnt, ro, ok := mountOf(node, dataVolume)
	if !ok || ro {
		c.errorf("container %s: want the %q volume mounted writable", node.Name, dataVolume)
		return
	}
	data, snaps := flags["data-dir"], flags["snapshot-dir"]
	if !under(data, mnt) {
		c.errorf("container %s: --data-dir %s is not inside the %q volume's mount %s", node.Name, data, dataVolume, mnt)
	}
	if !under(snaps, mnt) {
		c.errorf("container %s: --snapshot-dir %q is not on the %q volume (%s): a snapshot hard-links the store's files", node.Name, snaps, dataVolume, mnt)
	}
	if under(snaps, data) || under(data, snaps) || path.Clean(data) == path.Clean(snaps) {
		c.errorf("container %s: --snapshot-dir %s and --data-dir %s nest", node.Name, snaps, data)
	}
	if imnt, _, ok := mountOf(ini, dataVolume); !ok || imnt != mnt {
		c.errorf("container %s: mounts the %q volume at %q, the node at %q", ini.Name, dataVolume, imnt, mnt)
	}
	if v := envValue(ini, "DATA_DIR"); v != data {
		c.errorf("container %s: DATA_DIR %q is not the node's --data-dir %q", ini.Name, v, data)
	}
}

// secrets checks the chain from the Secret to the node's files: the
// secret volume names the Secret the kustomization makes, the init
// container reads the keys it copies (init.sh's list) and its token from
// keys the Secret has, and the node reads each copy from the run volume.
func (c *checker) secrets(pod *corev1.PodSpec, node, ini *corev1.Container, flags map[string]string) {
	var secret *corev1.Secret
	var volume string
	for _, v := range pod.Volumes {
		if v.Secret == nil {
			continue
		}
		volume = v.Name
		if secret = c.b.Secret(v.Secret.SecretName); secret == nil {
			c.errorf("volume %s: Secret %q is not in the kustomization", v.Name, v.Secret.SecretName)
			return
		}
		if m := v.Secret.DefaultMode; m == nil || *m&0o007 != 0 {
			c.errorf("volume %s: defaultMode must not let other users read the secrets", v.Name)
		}
		for _, it := range v.Secret.Items {
			if !secretKey(secret, it.Key) {
				c.errorf("volume %s: item %s: Secret %s has no such key", v.Name, it.Key, secret.Name)
			}
		}
	}
	if secret == nil {
		c.errorf("no secret volume")
		return
	}
	dir, _, ok := mountOf(ini, volume)
	if !ok {
		c.errorf("container %s: does not mount the secret volume %s", ini.Name, volume)
		return
	}
	if _, _, ok := mountOf(node, volume); ok {
		c.errorf("container %s: mounts the secret volume itself: it reads the init container's 0600 copies", node.Name)
	}
	if v := envValue(ini, "SECRETS_DIR"); v != dir {
		c.errorf("container %s: SECRETS_DIR %q is not where the Secret is mounted, %q", ini.Name, v, dir)
	}
	tok := envValue(ini, "DHTKV_TOKEN_FILE")
	if !under(tok, dir) || !secretKey(secret, path.Base(tok)) {
		c.errorf("container %s: DHTKV_TOKEN_FILE %q: not a key of Secret %s mounted at %s", ini.Name, tok, secret.Name, dir)
	}
	run, _, ok := mountOf(node, runVolume)
	if irun, _, iok := mountOf(ini, runVolume); !ok || !iok || run != irun {
		c.errorf("containers %s and %s must mount the %q volume at the same path", node.Name, ini.Name, runVolume)
		return
	}
	if v := envValue(ini, "RUN_DIR"); v != run {
		c.errorf("container %s: RUN_DIR %q is not the %q volume's mount %q", ini.Name, v, runVolume, run)
	}
	if v := envValue(node, "DHTKV_CONFIG"); v != path.Join(run, "node.conf") {
		c.errorf("container %s: DHTKV_CONFIG %q, want the init container's %s", node.Name, v, path.Join(run, "node.conf"))
	}
	script := c.b.Files[initScript]
	copied := regexp.MustCompile(`(?m)^for f in ([a-z0-9 -]+); do$`).FindStringSubmatch(script)
	if copied == nil {
		c.errorf("%s: no `for f in FILES; do` line copying the secrets", initScript)
		return
	}
	keys := strings.Fields(copied[1])
	for _, k := range keys {
		if !secretKey(secret, k) {
			c.errorf("%s copies %s from Secret %s, which has no such key", initScript, k, secret.Name)
		}
	}
	for _, f := range []string{"cluster-secret-file", "client-tokens"} {
		p := flags[f]
		if path.Dir(p) != path.Clean(run) || !slices.Contains(keys, path.Base(p)) {
			c.errorf("container %s: --%s %q is not one of the copies %s makes in %s (%v)", node.Name, f, p, initScript, run, keys)
		}
	}
}

// script checks that the init container runs init.sh from the ConfigMap
// the kustomization generates from the file, with busybox's shell, which
// the init target of packaging/Dockerfile has.
func (c *checker) script(pod *corev1.PodSpec, ini *corev1.Container) {
	var cm *corev1.ConfigMap
	var volume string
	for _, v := range pod.Volumes {
		if v.ConfigMap != nil {
			volume = v.Name
			if cm = c.b.ConfigMap(v.ConfigMap.Name); cm == nil {
				c.errorf("volume %s: ConfigMap %q is not in the kustomization", v.Name, v.ConfigMap.Name)
				return
			}
		}
	}
	if cm == nil {
		c.errorf("no ConfigMap volume holding %s", initScript)
		return
	}
	if got, ok := configMapValue(cm, initScript); !ok || got != c.b.Files[initScript] {
		c.errorf("ConfigMap %s: key %s is not the file %s", cm.Name, initScript, initScript)
	}
	dir, _, ok := mountOf(ini, volume)
	want := []string{"/busybox/sh", path.Join(dir, initScript)}
	if !ok || !slices.Equal(ini.Command, want) {
		c.errorf("container %s: command %q, want %q", ini.Name, ini.Command, want)
	}
}

// size is a size flag's value in bytes (go-humanize, as the
// binary parses them).
func (c *checker) size(flags map[string]string, name string) float64 {
	n, err := humanize.ParseBytes(flags[name])
	if err != nil {
		c.errorf("--%s %q: %v", name, flags[name], err)
	}
	return float64(n)
}

// resources checks the node's requests and limits, GOMAXPROCS from its
// CPU limit, and GOMEMLIMIT: under the memory limit with room for what
// the Go runtime does not count, and above what the node's caches and
// buffers may hold at once (docs/storage.md's memory budget).
func (c *checker) resources(ct *corev1.Container, flags map[string]string) {
	r := ct.Resources
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := r.Requests[name]; !ok {
			c.errorf("container %s: no %s request", ct.Name, name)
		}
		if _, ok := r.Limits[name]; !ok {
			c.errorf("container %s: no %s limit", ct.Name, name)
		}
	}
	if e := env(ct, "GOMAXPROCS"); e == nil || e.ValueFrom == nil || e.ValueFrom.ResourceFieldRef == nil ||
		e.ValueFrom.ResourceFieldRef.Resource != "limits.cpu" || e.ValueFrom.ResourceFieldRef.ContainerName != ct.Name {
		c.errorf("container %s: want GOMAXPROCS from its own limits.cpu", ct.Name)
	}
	limit, ok := r.Limits[corev1.ResourceMemory]
	if !ok {
		return
	}
	v := envValue(ct, "GOMEMLIMIT")
	soft, err := humanize.ParseBytes(v)
	if err != nil || v == "" {
		c.errorf("container %s: GOMEMLIMIT %q: %v", ct.Name, v, err)
		return
	}
	if hard := limit.Value(); float64(soft) > 0.9*float64(hard) {
		c.errorf("container %s: GOMEMLIMIT %s is above 90%% of the memory limit %s", ct.Name, v, limit.String())
	}
	spread, err := strconv.ParseFloat(flags["memtable-spread"], 64)
	if err != nil {
		c.errorf("--memtable-spread %q: %v", flags["memtable-spread"], err)
	}
	budget := c.size(flags, "cache-bytes") + c.size(flags, "block-cache-bytes") +
		4*c.size(flags, "memtable-bytes")*(1+spread) + c.size(flags, "max-inflight-body-bytes") +
		c.size(flags, "max-inflight-response-bytes") + versionFilterBytes
	if budget > float64(soft) {
		c.errorf("container %s: the node's caches and buffers may hold %s, above GOMEMLIMIT %s", ct.Name, humanize.IBytes(uint64(math.Ceil(budget))), v)
	}
	if req, ok := r.Requests[corev1.ResourceMemory]; ok && req.Cmp(*resource.NewQuantity(int64(budget), resource.BinarySI)) < 0 {
		c.errorf("container %s: memory request %s is below the node's budget %s", ct.Name, req.String(), humanize.IBytes(uint64(budget)))
	}
}

// security checks that nothing runs as root or can gain privileges, and
// that the volume's root is writable by the node's group.
func (c *checker) security(pod *corev1.PodSpec) {
	sc := pod.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		c.errorf("pod: want runAsNonRoot and a non-zero runAsUser")
	}
	if sc == nil || sc.FSGroup == nil {
		c.errorf("pod: want an fsGroup: the data volume's root is not the node's user's otherwise")
	}
	for _, ct := range append(append([]corev1.Container{}, pod.InitContainers...), pod.Containers...) {
		s := ct.SecurityContext
		if s == nil || s.AllowPrivilegeEscalation == nil || *s.AllowPrivilegeEscalation ||
			s.ReadOnlyRootFilesystem == nil || !*s.ReadOnlyRootFilesystem ||
			s.Capabilities == nil || !slices.Contains(s.Capabilities.Drop, "ALL") {
			c.errorf("container %s: want allowPrivilegeEscalation false, readOnlyRootFilesystem true, capabilities drop ALL", ct.Name)
		}
		if s != nil && s.RunAsUser != nil && *s.RunAsUser == 0 {
			c.errorf("container %s: runs as root", ct.Name)
		}
	}
}

// images checks that every image is one the kustomization's images
// entries set (the manifests name them by those entries' names).
func (c *checker) images(pod *corev1.PodSpec) {
	want := map[string]bool{}
	for _, im := range c.b.Kustomization.Images {
		want[im.NewName+":"+im.NewTag] = true
	}
	for _, ct := range append(append([]corev1.Container{}, pod.InitContainers...), pod.Containers...) {
		if !want[ct.Image] {
			c.errorf("container %s: image %q is not set by an images entry of kustomization.yaml", ct.Name, ct.Image)
		}
	}
}

// grace checks that the pod is given the time the node's shutdown takes.
func (c *checker) grace(pod *corev1.PodSpec, flags map[string]string) {
	d, err := time.ParseDuration(flags["shutdown-timeout"])
	if err != nil {
		c.errorf("--shutdown-timeout %q: %v", flags["shutdown-timeout"], err)
		return
	}
	g := pod.TerminationGracePeriodSeconds
	if g == nil || time.Duration(*g)*time.Second < d+shutdownMargin {
		c.errorf("pod: terminationGracePeriodSeconds must be at least --shutdown-timeout %v + %v", d, shutdownMargin)
	}
}

// parses runs the binary on the node container's arguments and
// environment, with the config file init.sh writes for a seed and for a
// pod that joins: every flag and value must parse.
func (c *checker) parses(node, ini *corev1.Container, tmp string) {
	base := []string{}
	for _, e := range node.Env {
		v := e.Value
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			v = "dhtkv-0"
		case e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil:
			v = "2"
		}
		v = strings.ReplaceAll(v, "$(POD_NAME)", "dhtkv-0")
		if e.Name == "DHTKV_CONFIG" {
			continue
		}
		base = append(base, e.Name+"="+v)
	}
	for _, conf := range []string{"cluster " + envValue(ini, "SEED_URLS"), "join " + envValue(ini, "DRIVER_URL")} {
		p, err := writeTemp(tmp, "node.conf", conf+"\n")
		if err != nil {
			c.errs = append(c.errs, err)
			return
		}
		if err := c.bin.Parses(node.Args, append(base, "DHTKV_CONFIG="+p)); err != nil {
			c.errorf("container %s with node.conf %q: %w", node.Name, conf, err)
		}
	}
}

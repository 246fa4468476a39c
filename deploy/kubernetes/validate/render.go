// Package validate checks deploy/kubernetes without a cluster: it renders
// the kustomization with kustomize's own library (as kubectl apply -k
// does), decodes every object strictly into the Kubernetes API types (an
// unknown or duplicated field fails, as the API server's strict field
// validation would refuse it), and checks what the API server cannot:
// that the objects fit together and fit dhtkv (probes on the admin port
// the node listens on, at the paths it serves; Secret keys the pods read;
// selectors that select the pods; flags the binary has, with values it
// accepts; volumes under the data directory; a memory limit the node's
// caches fit in).
//
// It is a module of its own so that the server's go.mod does not carry
// the Kubernetes API packages. It imports nothing of dhtkv: the facts of
// the binary come from building and running cmd/dhtkv (go build from the
// repository root, which make test has cached by then).
package validate

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
	serjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// SecretFiles are the files of the kustomization's secretGenerator,
// which git ignores (the operator makes them): rendering in a test puts
// stand-ins in their place.
var SecretFiles = map[string]string{
	"cluster-secret": "a-cluster-secret-for-the-test\n",
	"client-tokens":  "admin abcdefghijklmnopqrstuvwxyz012345\n",
	"admin-token":    "abcdefghijklmnopqrstuvwxyz012345\n",
}

// ReadDir returns the regular files directly in dir, by name: what the
// kustomization may refer to.
func ReadDir(dir string) (map[string]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	files := map[string]string{}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		files[e.Name()] = string(b)
	}
	return files, nil
}

// Bundle is the kustomization and what it renders, decoded.
type Bundle struct {
	Kustomization types.Kustomization
	StatefulSet   *appsv1.StatefulSet
	Services      []*corev1.Service
	PDB           *policyv1.PodDisruptionBudget
	ConfigMaps    []*corev1.ConfigMap
	Secrets       []*corev1.Secret
	// Files are the directory's files the kustomization was rendered from.
	Files map[string]string
}

// Render renders the kustomization in files (name → content, as ReadDir
// returns) in memory, and decodes every object it yields strictly. A
// YAML file of the directory that the kustomization does not list is an
// error too: a manifest written and forgotten.
func Render(files map[string]string) (*Bundle, error) {
	b := &Bundle{Files: files}
	src, ok := files["kustomization.yaml"]
	if !ok {
		return nil, errors.New("no kustomization.yaml")
	}
	if err := yaml.UnmarshalStrict([]byte(src), &b.Kustomization); err != nil {
		return nil, fmt.Errorf("kustomization.yaml: %w", err)
	}
	var unlisted []string
	for name := range files {
		if (strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")) && name != "kustomization.yaml" && !slices.Contains(b.Kustomization.Resources, name) {
			unlisted = append(unlisted, name)
		}
	}
	if len(unlisted) > 0 {
		sort.Strings(unlisted)
		return nil, fmt.Errorf("kustomization.yaml: resources does not list %s", strings.Join(unlisted, ", "))
	}

	fs := filesys.MakeFsInMemory()
	const root = "/kustomization"
	if err := fs.MkdirAll(root); err != nil {
		return nil, err
	}
	for name, content := range files {
		if err := fs.WriteFile(filepath.Join(root, name), []byte(content)); err != nil {
			return nil, err
		}
	}
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fs, root)
	if err != nil {
		return nil, fmt.Errorf("kustomize build: %w", err)
	}

	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	dec := serjson.NewSerializerWithOptions(serjson.DefaultMetaFactory, scheme, scheme, serjson.SerializerOptions{Yaml: true, Strict: true})
	var errs []error
	for _, r := range res.Resources() {
		doc, err := r.AsYAML()
		if err != nil {
			return nil, err
		}
		name := r.GetKind() + " " + r.GetName()
		obj, _, err := dec.Decode(doc, nil, nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue
		}
		switch o := obj.(type) {
		case *appsv1.StatefulSet:
			if b.StatefulSet != nil {
				errs = append(errs, fmt.Errorf("%s: a second StatefulSet", name))
			}
			b.StatefulSet = o
		case *corev1.Service:
			b.Services = append(b.Services, o)
		case *policyv1.PodDisruptionBudget:
			if b.PDB != nil {
				errs = append(errs, fmt.Errorf("%s: a second PodDisruptionBudget", name))
			}
			b.PDB = o
		case *corev1.ConfigMap:
			b.ConfigMaps = append(b.ConfigMaps, o)
		case *corev1.Secret:
			b.Secrets = append(b.Secrets, o)
		default:
			errs = append(errs, fmt.Errorf("%s: a kind this check does not know (%T)", name, obj))
		}
	}
	if b.StatefulSet == nil {
		errs = append(errs, errors.New("no StatefulSet"))
	}
	if b.PDB == nil {
		errs = append(errs, errors.New("no PodDisruptionBudget"))
	}
	return b, errors.Join(errs...)
}

// Service returns the Service named name, or nil.
func (b *Bundle) Service(name string) *corev1.Service {
	for _, s := range b.Services {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// Secret returns the Secret named name, or nil.
func (b *Bundle) Secret(name string) *corev1.Secret {
	for _, s := range b.Secrets {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// ConfigMap returns the ConfigMap named name, or nil.
func (b *Bundle) ConfigMap(name string) *corev1.ConfigMap {
	for _, c := range b.ConfigMaps {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// secretKey reports whether Secret s holds key, in data or stringData.
func secretKey(s *corev1.Secret, key string) bool {
	if _, ok := s.Data[key]; ok {
		return true
	}
	_, ok := s.StringData[key]
	return ok
}

// configMapValue is key's value in c, and whether it has one.
func configMapValue(c *corev1.ConfigMap, key string) (string, bool) {
	if v, ok := c.Data[key]; ok {
		return v, true
	}
	v, ok := c.BinaryData[key]
	return string(bytes.Clone(v)), ok
}

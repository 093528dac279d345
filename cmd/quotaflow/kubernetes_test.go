package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	sigsjson "sigs.k8s.io/json"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/quotaflow/quotaflow/internal/rules"
	"github.com/quotaflow/quotaflow/schema"
)

// TestKubernetes checks deploy/kubernetes without a cluster. Every manifest is decoded strictly
// (an unknown or duplicate field fails) into the Kubernetes API types, and every
// kustomization.yaml into the subset of kustomize this test evaluates (resources, generators,
// images, namespace); any other kustomize field fails the test until the test learns it. Each
// overlay is then built as kustomize would and checked against itself and against quotaflow:
//
//   - the kustomizations list exactly the files of the folder, and only existing ones;
//   - Services, PodDisruptionBudgets, HorizontalPodAutoscalers and spread constraints select
//     or name real Deployments and their pods, ports and resource requests;
//   - every container runs a quotaflow command whose flags (args) and QUOTAFLOW_* variables
//     (env, envFrom) exist, and whose settings pass the command's own validation, with the
//     files it reads resolved through the pod's volumes to the ConfigMaps and Secrets the
//     kustomization generates;
//   - every probe hits a port the command listens on and a path it serves: the checker's are
//     asked of the real checker command started in this process, the aggregator's are read
//     from the handlers runAggregator registers;
//   - shutdown, spool, memory and security settings fit what the binary and the image do.
//
// When kubectl is installed, its kustomize build of each overlay must also give what this test
// evaluated.
func TestKubernetes(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..", "deploy", "kubernetes")
	dirs := kustomizationDirs(t, root)

	t.Run("files", func(t *testing.T) { checkKustomizeFiles(t, root, dirs) })
	t.Run("flag sets", checkKubeFlagSets)

	var overlays []string
	for _, d := range dirs {
		if rel, _ := filepath.Rel(root, d); strings.HasPrefix(rel, "overlays"+string(filepath.Separator)) {
			overlays = append(overlays, d)
		}
	}
	if len(overlays) == 0 {
		t.Fatalf("no overlay under %s/overlays: the base is not meant to be applied alone", root)
	}
	for _, dir := range overlays {
		name, _ := filepath.Rel(root, dir)
		t.Run(filepath.ToSlash(name), func(t *testing.T) {
			t.Parallel()
			b, err := kustomizeBuild(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(b.deployments()) == 0 {
				t.Fatalf("%s builds no Deployment", dir)
			}
			t.Run("selectors", b.checkSelectors)
			t.Run("services", b.checkServices)
			t.Run("autoscalers", b.checkAutoscalers)
			t.Run("disruption budgets", b.checkDisruptionBudgets)
			t.Run("images", b.checkImages)
			t.Run("pods", b.checkPods)
			t.Run("containers", b.checkContainers)
			t.Run("kubectl kustomize", b.compareWithKubectl)
		})
	}
}

// ---- Strict decoding ----

// decodeStrict decodes YAML into v as the API server's strict field validation would: field
// names are case-sensitive, and unknown or duplicate fields are errors.
func decodeStrict(data []byte, v any) error {
	j, err := sigsyaml.YAMLToJSONStrict(data)
	if err != nil {
		return err
	}
	strictErrs, err := sigsjson.UnmarshalStrict(j, v, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strictErrs...)
}

// manifestKinds are the kinds the manifests may hold, by "apiVersion kind".
var manifestKinds = map[string]func() any{
	"apps/v1 Deployment":                     func() any { return new(appsv1.Deployment) },
	"batch/v1 Job":                           func() any { return new(batchv1.Job) },
	"v1 Service":                             func() any { return new(corev1.Service) },
	"v1 ConfigMap":                           func() any { return new(corev1.ConfigMap) },
	"v1 Secret":                              func() any { return new(corev1.Secret) },
	"autoscaling/v2 HorizontalPodAutoscaler": func() any { return new(autoscalingv2.HorizontalPodAutoscaler) },
	"policy/v1 PodDisruptionBudget":          func() any { return new(policyv1.PodDisruptionBudget) },
}

// kubeObject is one decoded manifest.
type kubeObject struct {
	source string // file it came from
	kind   string
	name   string
	obj    any // one of manifestKinds' types
}

func (o kubeObject) String() string { return o.kind + "/" + o.name }

// loadManifests decodes every document of a manifest file.
func loadManifests(file string) ([]kubeObject, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var out []kubeObject
	for i, doc := range splitYAMLDocuments(data) {
		var tm metav1.TypeMeta
		if err := sigsyaml.Unmarshal(doc, &tm); err != nil {
			return nil, fmt.Errorf("%s, document %d: %w", file, i+1, err)
		}
		newObj, ok := manifestKinds[tm.APIVersion+" "+tm.Kind]
		if !ok {
			return nil, fmt.Errorf("%s, document %d: apiVersion %q kind %q: not a kind this test knows (%s); teach manifestKinds and the checks",
				file, i+1, tm.APIVersion, tm.Kind, strings.Join(slices.Sorted(maps.Keys(manifestKinds)), ", "))
		}
		obj := newObj()
		if err := decodeStrict(doc, obj); err != nil {
			return nil, fmt.Errorf("%s, document %d (%s): %w", file, i+1, tm.Kind, err)
		}
		meta := obj.(metav1.Object)
		if meta.GetName() == "" {
			return nil, fmt.Errorf("%s, document %d (%s): no metadata.name", file, i+1, tm.Kind)
		}
		out = append(out, kubeObject{source: file, kind: tm.Kind, name: meta.GetName(), obj: obj})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no manifest in it", file)
	}
	return out, nil
}

// splitYAMLDocuments splits a YAML stream at its "---" lines, leaving out documents of only
// comments and blank lines.
func splitYAMLDocuments(data []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	content := false
	flush := func() {
		if content {
			docs = append(docs, bytes.Clone(cur.Bytes()))
		}
		cur.Reset()
		content = false
	}
	for _, line := range strings.SplitAfter(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "---" || strings.HasPrefix(trimmed, "--- ") {
			flush()
			continue
		}
		if trimmed != "" && !strings.HasPrefix(trimmed, "#") {
			content = true
		}
		cur.WriteString(line)
	}
	flush()
	return docs
}

// ---- kustomize, the part of it the manifests use ----

// kustomization is the subset of kustomize's Kustomization this test evaluates; decoded
// strictly, so that a field it does not evaluate (patches, namePrefix, ...) fails the test
// instead of being ignored by its checks.
type kustomization struct {
	APIVersion         string           `json:"apiVersion"`
	Kind               string           `json:"kind"`
	Namespace          string           `json:"namespace,omitempty"`
	Resources          []string         `json:"resources,omitempty"`
	Images             []kustomizeImage `json:"images,omitempty"`
	ConfigMapGenerator []generatorArgs  `json:"configMapGenerator,omitempty"`
	SecretGenerator    []generatorArgs  `json:"secretGenerator,omitempty"`
}

type kustomizeImage struct {
	Name    string `json:"name"`
	NewName string `json:"newName,omitempty"`
	NewTag  string `json:"newTag,omitempty"`
	Digest  string `json:"digest,omitempty"`
}

type generatorArgs struct {
	Name     string   `json:"name"`
	Behavior string   `json:"behavior,omitempty"` // create (default), merge or replace
	Type     string   `json:"type,omitempty"`     // of a Secret
	Literals []string `json:"literals,omitempty"` // KEY=VALUE
	Files    []string `json:"files,omitempty"`    // [KEY=]PATH
	Envs     []string `json:"envs,omitempty"`     // files of KEY=VALUE lines
}

func loadKustomization(dir string) (*kustomization, error) {
	file := filepath.Join(dir, "kustomization.yaml")
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var k kustomization
	if err := decodeStrict(data, &k); err != nil {
		return nil, fmt.Errorf("%s: %w (this test evaluates only resources, configMapGenerator, secretGenerator, images and namespace: teach kustomizeBuild any other field)", file, err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		return nil, fmt.Errorf("%s: apiVersion %q kind %q, want kustomize.config.k8s.io/v1beta1 Kustomization", file, k.APIVersion, k.Kind)
	}
	return &k, nil
}

// kustomizationDirs are the folders under root that hold a kustomization.yaml.
func kustomizationDirs(t *testing.T, root string) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch name := d.Name(); {
		case d.IsDir():
		case name == "kustomization.yaml":
			dirs = append(dirs, filepath.Dir(p))
		case name == "kustomization.yml" || name == "Kustomization":
			return fmt.Errorf("%s: name it kustomization.yaml (this test and the docs use that name)", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) == 0 {
		t.Fatalf("no kustomization.yaml under %s", root)
	}
	return dirs
}

// inside reports whether p is dir or below it.
func inside(dir, p string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// references are the files a kustomization names: resource files, the kustomization.yaml of
// resource folders, and its generators' files. A generator's file must lie inside the
// kustomization's folder (kustomize's default load restrictions).
func (k *kustomization) references(dir string) ([]string, error) {
	var refs []string
	var errs []error
	for _, r := range k.Resources {
		if strings.Contains(r, "://") || strings.HasPrefix(r, "github.com/") {
			errs = append(errs, fmt.Errorf("resources: %q: remote resources are not evaluated by this test", r))
			continue
		}
		p := filepath.Join(dir, r)
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			p = filepath.Join(p, "kustomization.yaml")
		}
		refs = append(refs, p)
	}
	for _, g := range slices.Concat(k.ConfigMapGenerator, k.SecretGenerator) {
		for _, f := range g.Files {
			_, src := splitKeyPath(f)
			refs = append(refs, filepath.Join(dir, src))
		}
		for _, f := range g.Envs {
			refs = append(refs, filepath.Join(dir, f))
		}
	}
	for _, p := range refs {
		if _, err := os.Stat(p); err != nil {
			errs = append(errs, fmt.Errorf("%s lists %s, which does not exist", filepath.Join(dir, "kustomization.yaml"), p))
		}
	}
	return refs, errors.Join(errs...)
}

// checkKustomizeFiles: every file of the folder is listed by a kustomization (or is a
// kustomization or a README), every file listed exists, and every base is used by an overlay.
func checkKustomizeFiles(t *testing.T, root string, dirs []string) {
	listed := map[string]string{} // file → the kustomization listing it
	for _, dir := range dirs {
		k, err := loadKustomization(dir)
		if err != nil {
			t.Fatal(err)
		}
		refs, err := k.references(dir)
		if err != nil {
			t.Error(err)
		}
		for _, p := range refs {
			listed[filepath.Clean(p)] = filepath.Join(dir, "kustomization.yaml")
			if !inside(root, p) {
				t.Errorf("%s lists %s, outside %s", filepath.Join(dir, "kustomization.yaml"), p, root)
			}
		}
	}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		p = filepath.Clean(p)
		switch {
		case strings.HasSuffix(d.Name(), ".md"):
		case d.Name() == "kustomization.yaml":
			rel, _ := filepath.Rel(root, p)
			if _, ok := listed[p]; !ok && !strings.HasPrefix(rel, "overlays"+string(filepath.Separator)) {
				t.Errorf("%s: no overlay uses this kustomization (list its folder in an overlay's resources)", p)
			}
		default:
			if _, ok := listed[p]; !ok {
				t.Errorf("%s: listed by no kustomization.yaml (resources, or a generator's files or envs): kubectl apply -k would leave it out", p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// configObject is a ConfigMap or a Secret of a build, generated or listed as a resource.
type configObject struct {
	kind, name string
	generated  bool
	data       map[string]string
}

// kubeBuild is what kustomize would build from an overlay.
type kubeBuild struct {
	dir     string
	objects []kubeObject
	configs map[string]*configObject // "ConfigMap/name", "Secret/name"
}

// kustomizeBuild evaluates the kustomization in dir: its resources (files, and folders built
// the same way), then its generators (create, merge or replace), then its images.
func kustomizeBuild(dir string) (*kubeBuild, error) {
	k, err := loadKustomization(dir)
	if err != nil {
		return nil, err
	}
	if _, err := k.references(dir); err != nil {
		return nil, err
	}
	b := &kubeBuild{dir: dir, configs: map[string]*configObject{}}
	for _, r := range k.Resources {
		p := filepath.Join(dir, r)
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			sub, err := kustomizeBuild(p)
			if err != nil {
				return nil, err
			}
			b.objects = append(b.objects, sub.objects...)
			for id, c := range sub.configs {
				if _, dup := b.configs[id]; dup {
					return nil, fmt.Errorf("%s: %s comes from two resources", dir, id)
				}
				b.configs[id] = c
			}
			continue
		}
		objs, err := loadManifests(p)
		if err != nil {
			return nil, err
		}
		for _, o := range objs {
			var data map[string]string
			switch obj := o.obj.(type) {
			case *corev1.ConfigMap:
				data = maps.Clone(obj.Data)
			case *corev1.Secret:
				data = secretData(obj)
			default:
				b.objects = append(b.objects, o)
				continue
			}
			if _, dup := b.configs[o.String()]; dup {
				return nil, fmt.Errorf("%s: %s is defined twice", dir, o)
			}
			if data == nil {
				data = map[string]string{}
			}
			b.configs[o.String()] = &configObject{kind: o.kind, name: o.name, data: data}
		}
	}
	for id := range b.ids() {
		if n := b.count(id); n > 1 {
			return nil, fmt.Errorf("%s: %s is defined %d times", dir, id, n)
		}
	}
	for _, gen := range []struct {
		kind string
		args []generatorArgs
	}{{"ConfigMap", k.ConfigMapGenerator}, {"Secret", k.SecretGenerator}} {
		for _, g := range gen.args {
			c, err := generate(dir, gen.kind, g)
			if err != nil {
				return nil, err
			}
			id := gen.kind + "/" + g.Name
			old, exists := b.configs[id]
			switch g.Behavior {
			case "", "create":
				if exists {
					return nil, fmt.Errorf("%s: %s generated again; say behavior: merge or replace", dir, id)
				}
				b.configs[id] = c
			case "merge":
				if !exists {
					return nil, fmt.Errorf("%s: behavior merge for %s, which no resource defines", dir, id)
				}
				maps.Copy(old.data, c.data)
			case "replace":
				if !exists {
					return nil, fmt.Errorf("%s: behavior replace for %s, which no resource defines", dir, id)
				}
				b.configs[id] = c
			default:
				return nil, fmt.Errorf("%s: %s: behavior %q, want create, merge or replace", dir, id, g.Behavior)
			}
		}
	}
	for _, img := range k.Images {
		if img.Name == "" || img.NewName == "" && img.NewTag == "" && img.Digest == "" {
			return nil, fmt.Errorf("%s: images entry %+v changes nothing", dir, img)
		}
		for _, c := range b.containers() {
			if imageName(c.Image) == img.Name {
				c.Image = rewriteImage(c.Image, img)
			}
		}
	}
	return b, nil
}

func (b *kubeBuild) ids() map[string]bool {
	ids := map[string]bool{}
	for _, o := range b.objects {
		ids[o.String()] = true
	}
	return ids
}

func (b *kubeBuild) count(id string) int {
	n := 0
	for _, o := range b.objects {
		if o.String() == id {
			n++
		}
	}
	return n
}

// generate makes the ConfigMap or Secret of a generator.
func generate(dir, kind string, g generatorArgs) (*configObject, error) {
	where := fmt.Sprintf("%s: %s generator %q", filepath.Join(dir, "kustomization.yaml"), kind, g.Name)
	if g.Name == "" {
		return nil, fmt.Errorf("%s: no name", where)
	}
	if kind == "Secret" && g.Type != "" && g.Type != "Opaque" {
		return nil, fmt.Errorf("%s: type %q: this test knows Opaque Secrets only", where, g.Type)
	}
	c := &configObject{kind: kind, name: g.Name, generated: true, data: map[string]string{}}
	add := func(key, value string) error {
		if key == "" {
			return fmt.Errorf("%s: an entry without a key", where)
		}
		if _, dup := c.data[key]; dup {
			return fmt.Errorf("%s: key %q twice", where, key)
		}
		c.data[key] = value
		return nil
	}
	for _, l := range g.Literals {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return nil, fmt.Errorf("%s: literal %q is not KEY=VALUE", where, l)
		}
		if err := add(k, unquoteLiteral(v)); err != nil {
			return nil, err
		}
	}
	for _, f := range g.Files {
		key, src := splitKeyPath(f)
		p := filepath.Join(dir, src)
		if !inside(dir, p) {
			return nil, fmt.Errorf("%s: file %q is outside %s (kustomize refuses it)", where, f, dir)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if err := add(key, string(data)); err != nil {
			return nil, err
		}
	}
	for _, f := range g.Envs {
		data, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		for i, line := range strings.Split(string(data), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				return nil, fmt.Errorf("%s: %s:%d: %q is not KEY=VALUE (kustomize would read the value from its own environment)", where, f, i+1, line)
			}
			if err := add(k, v); err != nil {
				return nil, err
			}
		}
	}
	return c, nil
}

// splitKeyPath splits a generator's files entry, [KEY=]PATH; the key defaults to the file's name.
func splitKeyPath(s string) (key, p string) {
	if k, v, ok := strings.Cut(s, "="); ok {
		return k, v
	}
	return path.Base(filepath.ToSlash(s)), s
}

func unquoteLiteral(v string) string {
	if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
		return v[1 : len(v)-1]
	}
	return v
}

// imageName is an image reference without its tag and digest.
func imageName(ref string) string {
	ref, _, _ = strings.Cut(ref, "@")
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		ref = ref[:i]
	}
	return ref
}

// imageTag is the tag or digest of an image reference, "" for none.
func imageTag(ref string) string {
	if _, d, ok := strings.Cut(ref, "@"); ok {
		return d
	}
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		return ref[i+1:]
	}
	return ""
}

func rewriteImage(ref string, img kustomizeImage) string {
	name, tag := imageName(ref), imageTag(ref)
	sep := ":"
	if strings.Contains(ref, "@") {
		sep = "@"
	}
	if img.NewName != "" {
		name = img.NewName
	}
	switch {
	case img.Digest != "":
		tag, sep = img.Digest, "@"
	case img.NewTag != "":
		tag, sep = img.NewTag, ":"
	}
	if tag == "" {
		return name
	}
	return name + sep + tag
}

// ---- The build's workloads ----

// workload is a pod template and who owns it.
type workload struct {
	kind, name string
	pod        *corev1.PodTemplateSpec
	deployment *appsv1.Deployment // nil for a Job
}

func (w workload) String() string { return w.kind + "/" + w.name }

func (b *kubeBuild) workloads() []workload {
	var out []workload
	for _, o := range b.objects {
		switch obj := o.obj.(type) {
		case *appsv1.Deployment:
			out = append(out, workload{kind: o.kind, name: o.name, pod: &obj.Spec.Template, deployment: obj})
		case *batchv1.Job:
			out = append(out, workload{kind: o.kind, name: o.name, pod: &obj.Spec.Template})
		}
	}
	return out
}

func (b *kubeBuild) deployments() []workload {
	return slices.DeleteFunc(b.workloads(), func(w workload) bool { return w.deployment == nil })
}

func (b *kubeBuild) containers() []*corev1.Container {
	var out []*corev1.Container
	for _, w := range b.workloads() {
		for i := range w.pod.Spec.InitContainers {
			out = append(out, &w.pod.Spec.InitContainers[i])
		}
		for i := range w.pod.Spec.Containers {
			out = append(out, &w.pod.Spec.Containers[i])
		}
	}
	return out
}

func objectsOf[T any](b *kubeBuild) map[string]T {
	out := map[string]T{}
	for _, o := range b.objects {
		if obj, ok := o.obj.(T); ok {
			out[o.name] = obj
		}
	}
	return out
}

// selecting are the Deployments whose pods sel matches.
func (b *kubeBuild) selecting(sel labels.Selector) []workload {
	return slices.DeleteFunc(b.deployments(), func(w workload) bool { return !sel.Matches(labels.Set(w.pod.Labels)) })
}

func (b *kubeBuild) checkSelectors(t *testing.T) {
	for _, w := range b.workloads() {
		t.Run(w.String(), func(t *testing.T) {
			if len(w.pod.Labels) == 0 {
				t.Errorf("pod template without labels")
			}
			if w.deployment != nil {
				sel, err := metav1.LabelSelectorAsSelector(w.deployment.Spec.Selector)
				if err != nil || sel.Empty() {
					t.Fatalf("spec.selector %v: %v (want the pods' labels)", w.deployment.Spec.Selector, err)
				}
				if !sel.Matches(labels.Set(w.pod.Labels)) {
					t.Errorf("spec.selector %s does not match its pod template's labels %v", sel, w.pod.Labels)
				}
				for _, other := range b.deployments() {
					if other.name != w.name && sel.Matches(labels.Set(other.pod.Labels)) {
						t.Errorf("spec.selector %s also matches the pods of %s", sel, other)
					}
				}
			}
			for i, c := range w.pod.Spec.TopologySpreadConstraints {
				sel, err := metav1.LabelSelectorAsSelector(c.LabelSelector)
				if err != nil || sel.Empty() || !sel.Matches(labels.Set(w.pod.Labels)) {
					t.Errorf("topologySpreadConstraints[%d].labelSelector %v (%v) does not match the pod's own labels %v: it would spread other pods", i, c.LabelSelector, err, w.pod.Labels)
				}
			}
		})
	}
}

// containerPort resolves a Service's targetPort or a probe's port among a pod's containers.
func containerPort(pod *corev1.PodSpec, p intstr.IntOrString) (*corev1.Container, int32, bool) {
	for i, c := range pod.Containers {
		for _, cp := range c.Ports {
			if p.Type == intstr.String && cp.Name == p.StrVal || p.Type == intstr.Int && cp.ContainerPort == p.IntVal {
				return &pod.Containers[i], cp.ContainerPort, true
			}
		}
	}
	return nil, 0, false
}

func (b *kubeBuild) checkServices(t *testing.T) {
	services := objectsOf[*corev1.Service](b)
	if len(services) == 0 {
		t.Fatal("no Service")
	}
	for name, svc := range services {
		t.Run(name, func(t *testing.T) {
			if len(svc.Spec.Selector) == 0 {
				t.Fatalf("no selector: the Service would have no endpoints")
			}
			sel := labels.SelectorFromSet(svc.Spec.Selector)
			targets := b.selecting(sel)
			if len(targets) == 0 {
				t.Fatalf("selector %s matches the pods of no Deployment", sel)
			}
			for _, w := range targets {
				for _, sp := range svc.Spec.Ports {
					target := sp.TargetPort
					if target.Type == intstr.Int && target.IntVal == 0 {
						target = intstr.FromInt32(sp.Port)
					}
					c, _, ok := containerPort(&w.pod.Spec, target)
					if !ok {
						t.Errorf("port %q: targetPort %s is no container port of %s", sp.Name, target.String(), w)
						continue
					}
					// The checker's port speaks h2c (and HTTP/1.1): meshes and gateways must
					// send HTTP/2 without TLS to it. Istio reads appProtocol, then the name.
					if len(c.Args) > 0 && c.Args[0] == "checker" {
						app := ""
						if sp.AppProtocol != nil {
							app = *sp.AppProtocol
						}
						if !slices.Contains([]string{"kubernetes.io/h2c", "http2", "grpc"}, app) {
							t.Errorf("port %q to the checker: appProtocol %q, want kubernetes.io/h2c (cleartext HTTP/2)", sp.Name, app)
						}
						if !strings.HasPrefix(sp.Name, "http2") && !strings.HasPrefix(sp.Name, "grpc") {
							t.Errorf("port name %q to the checker: want http2 or grpc (a prefix meshes read as HTTP/2)", sp.Name)
						}
					}
				}
			}
		})
	}
}

// minReplicas is the fewest pods a Deployment runs: its autoscaler's minimum, or its replicas.
func (b *kubeBuild) minReplicas(d workload) int32 {
	for _, h := range objectsOf[*autoscalingv2.HorizontalPodAutoscaler](b) {
		if h.Spec.ScaleTargetRef.Kind == "Deployment" && h.Spec.ScaleTargetRef.Name == d.name {
			if h.Spec.MinReplicas == nil {
				return 1
			}
			return *h.Spec.MinReplicas
		}
	}
	if d.deployment.Spec.Replicas == nil {
		return 1
	}
	return *d.deployment.Spec.Replicas
}

func (b *kubeBuild) checkAutoscalers(t *testing.T) {
	deployments := map[string]workload{}
	for _, d := range b.deployments() {
		deployments[d.name] = d
	}
	for name, h := range objectsOf[*autoscalingv2.HorizontalPodAutoscaler](b) {
		t.Run(name, func(t *testing.T) {
			ref := h.Spec.ScaleTargetRef
			d, ok := deployments[ref.Name]
			if ref.APIVersion != "apps/v1" || ref.Kind != "Deployment" || !ok {
				t.Fatalf("scaleTargetRef %s %s %q: want apps/v1 Deployment, one of %v", ref.APIVersion, ref.Kind, ref.Name, slices.Sorted(maps.Keys(deployments)))
			}
			if d.deployment.Spec.Replicas != nil {
				t.Errorf("%s sets replicas (%d): every apply would reset the count the autoscaler chose; leave it out", d, *d.deployment.Spec.Replicas)
			}
			minR := int32(1)
			if h.Spec.MinReplicas != nil {
				minR = *h.Spec.MinReplicas
			}
			if minR < 2 || minR > h.Spec.MaxReplicas {
				t.Errorf("minReplicas %d, maxReplicas %d: want 2 <= min <= max (one pod is an outage at every drain)", minR, h.Spec.MaxReplicas)
			}
			if len(h.Spec.Metrics) == 0 {
				t.Errorf("no metrics")
			}
			for i, m := range h.Spec.Metrics {
				if m.Type != autoscalingv2.ResourceMetricSourceType || m.Resource == nil {
					continue
				}
				if m.Resource.Target.Type == autoscalingv2.UtilizationMetricType {
					for _, c := range d.pod.Spec.Containers {
						if _, ok := c.Resources.Requests[m.Resource.Name]; !ok {
							t.Errorf("metrics[%d]: %s utilization, but container %s of %s requests no %s: the autoscaler cannot compute it", i, m.Resource.Name, c.Name, d, m.Resource.Name)
						}
					}
				}
			}
		})
	}
}

func (b *kubeBuild) checkDisruptionBudgets(t *testing.T) {
	budgets := objectsOf[*policyv1.PodDisruptionBudget](b)
	// One budget per Deployment: the eviction API refuses to evict a pod that two budgets
	// select, which blocks node drains.
	for _, d := range b.deployments() {
		var names []string
		for name, pdb := range budgets {
			if sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector); err == nil && sel.Matches(labels.Set(d.pod.Labels)) {
				names = append(names, name)
			}
		}
		if len(names) != 1 {
			t.Errorf("the pods of %s are selected by the budgets %v, want exactly one", d, names)
		}
	}
	for name, pdb := range budgets {
		t.Run(name, func(t *testing.T) {
			sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
			if err != nil || sel.Empty() {
				t.Fatalf("selector %v: %v (an empty selector matches every pod of the namespace)", pdb.Spec.Selector, err)
			}
			targets := b.selecting(sel)
			if len(targets) != 1 {
				t.Fatalf("selector %s matches the pods of %v, want those of one Deployment", sel, targets)
			}
			d := targets[0]
			n := int(b.minReplicas(d))
			var allowed int
			switch {
			case pdb.Spec.MaxUnavailable != nil && pdb.Spec.MinAvailable != nil:
				t.Fatalf("both minAvailable and maxUnavailable")
			case pdb.Spec.MaxUnavailable != nil:
				v, err := intstr.GetScaledValueFromIntOrPercent(pdb.Spec.MaxUnavailable, n, true)
				if err != nil {
					t.Fatal(err)
				}
				allowed = v
			case pdb.Spec.MinAvailable != nil:
				v, err := intstr.GetScaledValueFromIntOrPercent(pdb.Spec.MinAvailable, n, true)
				if err != nil {
					t.Fatal(err)
				}
				allowed = n - v
			default:
				t.Fatalf("neither minAvailable nor maxUnavailable")
			}
			if allowed < 1 || allowed >= n {
				t.Errorf("with %s at its minimum of %d pods the budget allows %d evictions, want 1 to %d: none blocks every node drain, all leaves nothing serving", d, n, allowed, n-1)
			}
		})
	}
}

func (b *kubeBuild) checkImages(t *testing.T) {
	images := map[string][]string{}
	for _, c := range b.containers() {
		images[c.Image] = append(images[c.Image], c.Name)
		tag := imageTag(c.Image)
		if tag == "" || tag == "latest" {
			t.Errorf("container %s: image %q: want a tag or digest, set by the overlay's images:", c.Name, c.Image)
		}
	}
	if len(images) != 1 {
		t.Errorf("containers run different images %v: the checker, the aggregator and migrate must come from one build of deploy/Dockerfile", images)
	}
}

// ---- Pods: security, volumes, references ----

// dockerfileUser is the final stage's USER of deploy/Dockerfile.
func dockerfileUser(t *testing.T) string {
	t.Helper()
	df := loadDockerfile(t, filepath.Join("..", "..", "deploy", "Dockerfile"))
	user := ""
	for _, in := range df.final() {
		if in.cmd == "USER" {
			user = in.args
		}
	}
	return user
}

func (b *kubeBuild) checkPods(t *testing.T) {
	imageUser := dockerfileUser(t)
	for _, w := range b.workloads() {
		t.Run(w.String(), func(t *testing.T) {
			spec := &w.pod.Spec
			if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
				t.Errorf("automountServiceAccountToken not false: quotaflow never calls the Kubernetes API")
			}
			// Service links put <SERVICE>_PORT and friends in the environment; a Service named
			// quotaflow-... would add QUOTAFLOW_* variables next to the flags' own.
			if spec.EnableServiceLinks == nil || *spec.EnableServiceLinks {
				t.Errorf("enableServiceLinks not false: Kubernetes would add a variable per Service to the environment")
			}
			sc := spec.SecurityContext
			if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
				t.Fatalf("securityContext.runAsNonRoot not true")
			}
			// The kubelet cannot tell whether a non-numeric USER (distroless's nonroot) is root:
			// with runAsNonRoot it refuses to start the container unless runAsUser is numeric.
			name, _, _ := strings.Cut(imageUser, ":")
			if _, err := strconv.Atoi(name); err != nil {
				for _, c := range spec.Containers {
					if (c.SecurityContext == nil || c.SecurityContext.RunAsUser == nil) && sc.RunAsUser == nil {
						t.Errorf("container %s: deploy/Dockerfile's USER %q is not numeric, so runAsNonRoot needs runAsUser (65532 is distroless's nonroot)", c.Name, imageUser)
					}
				}
			}
			if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
				t.Errorf("runAsUser 0")
			}
			for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
				csc := c.SecurityContext
				switch {
				case csc == nil:
					t.Errorf("container %s: no securityContext", c.Name)
				case csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem:
					t.Errorf("container %s: readOnlyRootFilesystem not true", c.Name)
				case csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation:
					t.Errorf("container %s: allowPrivilegeEscalation not false", c.Name)
				case csc.Capabilities == nil || !slices.Contains(csc.Capabilities.Drop, "ALL"):
					t.Errorf("container %s: capabilities.drop lacks ALL", c.Name)
				}
				if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Exec != nil {
					t.Errorf("container %s: preStop exec %v: the distroless image has no shell and no sleep; use the sleep action", c.Name, c.Lifecycle.PreStop.Exec.Command)
				}
			}
			b.checkReferences(t, spec)
		})
	}
}

// checkReferences: the ConfigMaps, Secrets and keys a pod refers to exist in the build.
func (b *kubeBuild) checkReferences(t *testing.T, spec *corev1.PodSpec) {
	t.Helper()
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
		var id string
		var items []corev1.KeyToPath
		var optional *bool
		switch {
		case v.ConfigMap != nil:
			id, items, optional = "ConfigMap/"+v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional
		case v.Secret != nil:
			id, items, optional = "Secret/"+v.Secret.SecretName, v.Secret.Items, v.Secret.Optional
		case v.EmptyDir != nil:
			continue
		default:
			t.Errorf("volume %s: a kind this test does not check", v.Name)
			continue
		}
		c, ok := b.configs[id]
		if !ok {
			if optional == nil || !*optional {
				t.Errorf("volume %s: %s is not in the build (have %v)", v.Name, id, slices.Sorted(maps.Keys(b.configs)))
			}
			continue
		}
		for _, it := range items {
			if _, ok := c.data[it.Key]; !ok {
				t.Errorf("volume %s: items key %q is not in %s (keys %v)", v.Name, it.Key, id, slices.Sorted(maps.Keys(c.data)))
			}
		}
	}
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		for _, m := range c.VolumeMounts {
			v, ok := volumes[m.Name]
			switch {
			case !ok:
				t.Errorf("container %s: volumeMount %s names no volume of the pod", c.Name, m.Name)
			case m.SubPath != "" && (v.ConfigMap != nil || v.Secret != nil):
				t.Errorf("container %s: volumeMount %s uses subPath: the kubelet never updates such a file, and the checker reloads its callers file when it changes", c.Name, m.Name)
			}
		}
		for _, ef := range c.EnvFrom {
			id, optional := "", (*bool)(nil)
			switch {
			case ef.ConfigMapRef != nil:
				id, optional = "ConfigMap/"+ef.ConfigMapRef.Name, ef.ConfigMapRef.Optional
			case ef.SecretRef != nil:
				id, optional = "Secret/"+ef.SecretRef.Name, ef.SecretRef.Optional
			}
			if _, ok := b.configs[id]; !ok && (optional == nil || !*optional) {
				t.Errorf("container %s: envFrom %s is not in the build (have %v)", c.Name, id, slices.Sorted(maps.Keys(b.configs)))
			}
		}
		for _, e := range c.Env {
			if e.ValueFrom == nil {
				continue
			}
			var id, key string
			var optional *bool
			switch vf := e.ValueFrom; {
			case vf.ConfigMapKeyRef != nil:
				id, key, optional = "ConfigMap/"+vf.ConfigMapKeyRef.Name, vf.ConfigMapKeyRef.Key, vf.ConfigMapKeyRef.Optional
			case vf.SecretKeyRef != nil:
				id, key, optional = "Secret/"+vf.SecretKeyRef.Name, vf.SecretKeyRef.Key, vf.SecretKeyRef.Optional
			default:
				continue
			}
			cfg, ok := b.configs[id]
			if ok {
				_, ok = cfg.data[key]
			}
			if !ok && (optional == nil || !*optional) {
				t.Errorf("container %s: env %s from %s key %q: not in the build", c.Name, e.Name, id, key)
			}
		}
	}
}

// ---- Containers: the command, its settings, probes and shutdown ----

// kubeCommand is a quotaflow command's flag set, built as its run function builds it, and the
// checks that function makes of the parsed values before starting anything. Keep them in step
// with runChecker, runAggregator and runMigrate; checkKubeFlagSets compares the flags with the
// commands' own --help.
type kubeCommand struct {
	fs       *flagSet
	validate func() error
}

var kubeCommands = map[string]func() kubeCommand{
	"checker": func() kubeCommand {
		fs := newFlagSet("checker", "", io.Discard)
		var c checkerFlags
		var p publishFlags
		c.register(fs)
		p.register(fs, "quotaflow-spool")
		return kubeCommand{fs, func() error {
			_, err := c.validate(&p, io.Discard)
			return err
		}}
	},
	"aggregator": func() kubeCommand {
		fs := newFlagSet("aggregator", "", io.Discard)
		var a aggregatorFlags
		a.register(fs, false)
		return kubeCommand{fs, func() error {
			if err := a.validate(); err != nil {
				return err
			}
			_, err := newLogger(a.logLevel, a.logFormat, io.Discard)
			return err
		}}
	},
	"migrate": func() kubeCommand {
		fs := newFlagSet("migrate", "", io.Discard)
		var c clickhouseFlags
		c.register(fs, "clickhouse://127.0.0.1:9000/quotaflow")
		return kubeCommand{fs, func() error {
			if _, err := schema.ParseDSN(c.dsn); err != nil {
				return fmt.Errorf("--clickhouse-dsn: %w", err)
			}
			_, err := c.tls.config("")
			return err
		}}
	},
}

// checkKubeFlagSets: the flag sets this test builds are the commands' own, as --help lists them.
func checkKubeFlagSets(t *testing.T) {
	for sub, newCmd := range kubeCommands {
		t.Run(sub, func(t *testing.T) {
			help := commandHelp(t, sub)
			cmd := newCmd()
			got := map[string]bool{}
			cmd.fs.VisitAll(func(f *flag.Flag) { got[f.Name] = true })
			if want := maps.Keys(help.flags); !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(want)) {
				t.Errorf("flags = %v, want those of `quotaflow %s --help` %v: update kubeCommands", slices.Sorted(maps.Keys(got)), sub, slices.Sorted(maps.Keys(help.flags)))
			}
			if got, want := slices.Sorted(maps.Values(cmd.fs.env)), slices.Sorted(maps.Keys(help.envs)); !slices.Equal(got, want) {
				t.Errorf("variables = %v, want %v", got, want)
			}
		})
	}
}

// goRuntimeEnv are the variables other than QUOTAFLOW_* a container may set: the Go runtime's.
var goRuntimeEnv = []string{"GOGC", "GOMEMLIMIT", "GOMAXPROCS", "GODEBUG", "GOTRACEBACK"}

// spoolSegmentBytes is the size of one spool segment file (publisher's defaultSegmentBytes): the
// spool may pass --spool-max-bytes by up to one segment.
const spoolSegmentBytes = 64 << 20

// placeholder is how the example overlay marks the secrets an operator must supply.
var placeholder = regexp.MustCompile(`REPLACE_ME\w*`)

// yamlComment is a YAML comment: a '#' at the start of a line or after a blank, to its end.
var yamlComment = regexp.MustCompile(`(?m)(^|\s)#.*$`)

// fillExcept replaces every placeholder but keep by a secret as long as a real one would be
// (distinct per placeholder).
func fillExcept(keep string) func(string) string {
	return func(v string) string {
		return placeholder.ReplaceAllStringFunc(v, func(p string) string {
			if p == keep {
				return p
			}
			return strings.ToLower(p) + strings.Repeat("x", 32)
		})
	}
}

// containerEnv is a container's environment as the kubelet makes it: envFrom in order, then env.
// Values from the downward API are what a pod of the workload would get.
func (b *kubeBuild) containerEnv(w workload, c *corev1.Container) (map[string]string, error) {
	env := map[string]string{}
	var errs []error
	for _, ef := range c.EnvFrom {
		var id string
		switch {
		case ef.ConfigMapRef != nil:
			id = "ConfigMap/" + ef.ConfigMapRef.Name
		case ef.SecretRef != nil:
			id = "Secret/" + ef.SecretRef.Name
		}
		cfg, ok := b.configs[id]
		if !ok {
			continue // reported by checkReferences
		}
		for k, v := range cfg.data {
			env[ef.Prefix+k] = v
		}
	}
	for _, e := range c.Env {
		switch vf := e.ValueFrom; {
		case vf == nil:
			env[e.Name] = e.Value
		case vf.ConfigMapKeyRef != nil:
			if cfg, ok := b.configs["ConfigMap/"+vf.ConfigMapKeyRef.Name]; ok {
				env[e.Name] = cfg.data[vf.ConfigMapKeyRef.Key]
			}
		case vf.SecretKeyRef != nil:
			if cfg, ok := b.configs["Secret/"+vf.SecretKeyRef.Name]; ok {
				env[e.Name] = cfg.data[vf.SecretKeyRef.Key]
			}
		case vf.FieldRef != nil:
			switch vf.FieldRef.FieldPath {
			case "metadata.name":
				env[e.Name] = w.name + "-5d4f8b7c9-x7k2p" // a pod name of the workload
			case "metadata.namespace":
				env[e.Name] = "quotaflow"
			default:
				errs = append(errs, fmt.Errorf("env %s: fieldRef %s: a field this test does not know", e.Name, vf.FieldRef.FieldPath))
			}
		default:
			errs = append(errs, fmt.Errorf("env %s: a valueFrom this test does not evaluate", e.Name))
		}
	}
	return env, errors.Join(errs...)
}

// mountedFile is the content of the ConfigMap or Secret key a volume puts at path p of a
// container.
func (b *kubeBuild) mountedFile(spec *corev1.PodSpec, c *corev1.Container, p string) (string, error) {
	for _, m := range c.VolumeMounts {
		rel, ok := strings.CutPrefix(path.Clean(p), path.Clean(m.MountPath)+"/")
		if !ok {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name != m.Name {
				continue
			}
			var id string
			var items []corev1.KeyToPath
			switch {
			case v.ConfigMap != nil:
				id, items = "ConfigMap/"+v.ConfigMap.Name, v.ConfigMap.Items
			case v.Secret != nil:
				id, items = "Secret/"+v.Secret.SecretName, v.Secret.Items
			default:
				return "", fmt.Errorf("%s is on volume %s, which holds no ConfigMap or Secret", p, v.Name)
			}
			key := rel
			if len(items) > 0 {
				key = ""
				for _, it := range items {
					if path.Clean(it.Path) == rel {
						key = it.Key
					}
				}
			}
			cfg, ok := b.configs[id]
			if !ok {
				return "", fmt.Errorf("%s: volume %s's %s is not in the build", p, v.Name, id)
			}
			value, ok := cfg.data[key]
			if !ok {
				return "", fmt.Errorf("%s: %s (volume %s, mounted on %s) has no key %q (keys %v)", p, id, v.Name, m.MountPath, key, slices.Sorted(maps.Keys(cfg.data)))
			}
			return value, nil
		}
	}
	return "", fmt.Errorf("%s: no ConfigMap or Secret volume is mounted there (mounts %v)", p, mountPaths(c))
}

func mountPaths(c *corev1.Container) []string {
	var out []string
	for _, m := range c.VolumeMounts {
		out = append(out, m.MountPath)
	}
	return out
}

// commandSettings are a container's command line and environment parsed with the command's own
// flag set. File flags (value name "file") are resolved through the pod's volumes to local
// copies of the files the kustomization generated them from, so that the command's validation
// reads what the pod would.
type commandSettings struct {
	sub  string
	cmd  kubeCommand
	env  map[string]string
	errs []error
}

// settings parses a container's settings, with fill applied to every variable and file.
func (b *kubeBuild) settings(t *testing.T, w workload, c *corev1.Container, fill func(string) string) commandSettings {
	t.Helper()
	if fill == nil {
		fill = func(v string) string { return v }
	}
	s := commandSettings{}
	if len(c.Command) > 0 {
		s.errs = append(s.errs, fmt.Errorf("command %q replaces the image's ENTRYPOINT (the quotaflow binary); give the subcommand in args", c.Command))
	}
	if len(c.Args) == 0 {
		s.errs = append(s.errs, errors.New("no args: the image's ENTRYPOINT is the bare binary, which needs a subcommand"))
		return s
	}
	s.sub = c.Args[0]
	newCmd, ok := kubeCommands[s.sub]
	if !ok {
		s.errs = append(s.errs, fmt.Errorf("args[0] %q: not a command this test knows how to run in a pod (%v)", s.sub, slices.Sorted(maps.Keys(kubeCommands))))
		return s
	}
	s.cmd = newCmd()
	env, err := b.containerEnv(w, c)
	if err != nil {
		s.errs = append(s.errs, err)
	}
	for k, v := range env {
		env[k] = fill(v)
	}
	s.env = env
	variables := slices.Collect(maps.Values(s.cmd.fs.env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if strings.HasPrefix(k, "QUOTAFLOW_") && !slices.Contains(variables, k) {
			s.errs = append(s.errs, fmt.Errorf("variable %s: not one of `quotaflow %s` (its variables: %s)", k, s.sub, strings.Join(slices.Sorted(slices.Values(variables)), ", ")))
		} else if !strings.HasPrefix(k, "QUOTAFLOW_") && !slices.Contains(goRuntimeEnv, k) {
			s.errs = append(s.errs, fmt.Errorf("variable %s: neither a QUOTAFLOW_* variable nor one of the Go runtime's %v", k, goRuntimeEnv))
		}
	}
	args := c.Args[1:]
	for _, a := range args {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") {
			s.errs = append(s.errs, fmt.Errorf("argument %q: the commands take flags only", a))
		} else if s.cmd.fs.Lookup(name) == nil {
			s.errs = append(s.errs, fmt.Errorf("argument %q: --%s is not a flag of `quotaflow %s`", a, name, s.sub))
		}
	}
	if err := s.cmd.fs.parse(args, func(k string) string { return env[k] }); err != nil {
		s.errs = append(s.errs, fmt.Errorf("settings: %w", err))
		return s
	}
	s.cmd.fs.VisitAll(func(f *flag.Flag) {
		kind, _ := flag.UnquoteUsage(f)
		p := f.Value.String()
		if kind != "file" || p == "" {
			return
		}
		content, err := b.mountedFile(&w.pod.Spec, c, p)
		if err != nil {
			s.errs = append(s.errs, fmt.Errorf("--%s: %w", f.Name, err))
			return
		}
		local := filepath.Join(t.TempDir(), path.Base(p))
		if err := os.WriteFile(local, []byte(fill(content)), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := s.cmd.fs.Set(f.Name, local); err != nil {
			t.Fatal(err)
		}
	})
	return s
}

// value is the parsed value of flag name.
func (s commandSettings) value(name string) any {
	return s.cmd.fs.Lookup(name).Value.(flag.Getter).Get()
}

// agreed are the settings the commands that read them must agree on: the decision stream's
// (checkers and aggregators) and the ClickHouse layout (migrate and every aggregator).
var agreed = map[string][]string{
	"nats-url":           {"checker", "aggregator"},
	"partitions":         {"checker", "aggregator"},
	"clickhouse-cluster": {"aggregator", "migrate"},
}

func (b *kubeBuild) checkContainers(t *testing.T) {
	shared := map[string]map[string][]string{} // flag → value → workloads
	for _, w := range b.workloads() {
		for i := range w.pod.Spec.Containers {
			c := &w.pod.Spec.Containers[i]
			t.Run(w.String()+"/"+c.Name, func(t *testing.T) {
				s := b.settings(t, w, c, fillExcept(""))
				if len(s.errs) > 0 {
					t.Fatalf("the container's command line and environment:\n%v", errors.Join(s.errs...))
				}
				if err := s.cmd.validate(); err != nil {
					t.Errorf("settings (with every REPLACE_ME filled in) rejected as `quotaflow %s` would reject them at start: %v", s.sub, err)
				}
				b.checkPlaceholdersRefused(t, w, c)
				for f, subs := range agreed {
					if slices.Contains(subs, s.sub) {
						v := fmt.Sprint(s.value(f))
						if shared[f] == nil {
							shared[f] = map[string][]string{}
						}
						shared[f][v] = append(shared[f][v], w.name)
					}
				}
				checkResources(t, c, s)
				b.checkFiles(t, w, c, s)
				if w.deployment != nil {
					b.checkProbes(t, w, c, s)
				}
				checkShutdown(t, w, c, s)
			})
		}
	}
	for f, values := range shared {
		if len(values) > 1 {
			t.Errorf("--%s differs between %v: %v, want one value", f, agreed[f], values)
		}
	}
}

// checkPlaceholdersRefused: each placeholder in a file the command reads (an example's token)
// is refused by the command on its own, every other one filled in, so that nobody runs the
// example with a published token.
func (b *kubeBuild) checkPlaceholdersRefused(t *testing.T, w workload, c *corev1.Container) {
	t.Helper()
	s := b.settings(t, w, c, nil)
	if s.cmd.fs == nil {
		return // reported by checkContainers
	}
	found := map[string][]string{} // placeholder → the flags of the files holding it
	s.cmd.fs.VisitAll(func(f *flag.Flag) {
		if kind, _ := flag.UnquoteUsage(f); kind == "file" && f.Value.String() != "" {
			data, _ := os.ReadFile(f.Value.String())
			for _, p := range placeholder.FindAllString(yamlComment.ReplaceAllString(string(data), ""), -1) {
				if !slices.Contains(found[p], "--"+f.Name) {
					found[p] = append(found[p], "--"+f.Name)
				}
			}
		}
	})
	for _, p := range slices.Sorted(maps.Keys(found)) {
		if err := b.settings(t, w, c, fillExcept(p)).cmd.validate(); err == nil {
			t.Errorf("%s (in %v) is accepted by `quotaflow %s` as it stands: make it a placeholder the command refuses (a token under 16 characters), so that the example cannot run with a published token", p, found[p], s.sub)
		}
	}
}

// goBytes parses a GOMEMLIMIT value: a number of bytes with an optional B, KiB, MiB, GiB or TiB.
func goBytes(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}
	for _, u := range units {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			v, err := strconv.ParseInt(n, 10, 64)
			return v * u.mult, err
		}
	}
	return strconv.ParseInt(s, 10, 64)
}

// checkResources: requests for scheduling, a memory limit, and a Go memory limit below it for
// the checker, whose GOGC=400 lets the heap grow to five times what is live.
func checkResources(t *testing.T, c *corev1.Container, s commandSettings) {
	t.Helper()
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[r]; !ok {
			t.Errorf("no %s request", r)
		}
	}
	limit, ok := c.Resources.Limits[corev1.ResourceMemory]
	if !ok {
		t.Fatalf("no memory limit")
	}
	goLimit, set := s.env["GOMEMLIMIT"]
	if !set && s.sub == "checker" && s.env["GOGC"] == "" {
		t.Errorf("no GOMEMLIMIT: the checker runs with GOGC=400, and its heap may grow to five times what is live (the publisher's queue, when NATS is slow) past the memory limit %s", limit.String())
	}
	if set {
		n, err := goBytes(goLimit)
		if err != nil || n <= 0 || n >= limit.Value() {
			t.Errorf("GOMEMLIMIT=%q (%d bytes, %v): want a size below the memory limit %s (%d bytes)", goLimit, n, err, limit.String(), limit.Value())
		}
	}
}

// checkFiles: every folder the command writes is a writable volume (the root file system is
// read-only), and the spool's emptyDir has room for the spool.
func (b *kubeBuild) checkFiles(t *testing.T, w workload, c *corev1.Container, s commandSettings) {
	t.Helper()
	s.cmd.fs.VisitAll(func(f *flag.Flag) {
		kind, _ := flag.UnquoteUsage(f)
		if kind != "folder" || (f.Name == "spool-dir" && s.value("nats-url") == "") {
			return
		}
		dir := path.Clean(f.Value.String())
		var mount *corev1.VolumeMount
		for i, m := range c.VolumeMounts {
			if path.Clean(m.MountPath) == dir {
				mount = &c.VolumeMounts[i]
			}
		}
		if !path.IsAbs(dir) || mount == nil || mount.ReadOnly {
			t.Errorf("--%s %q: want an absolute path with a writable volume mounted on it (the root file system is read-only), mounts %v", f.Name, dir, mountPaths(c))
			return
		}
		for _, v := range w.pod.Spec.Volumes {
			if v.Name != mount.Name {
				continue
			}
			if v.EmptyDir == nil {
				t.Errorf("--%s: volume %s is not an emptyDir: this test checks emptyDir spools only", f.Name, v.Name)
				continue
			}
			if f.Name != "spool-dir" {
				continue
			}
			need := s.value("spool-max-bytes").(int64) + spoolSegmentBytes
			if v.EmptyDir.SizeLimit == nil || v.EmptyDir.SizeLimit.Value() < need {
				t.Errorf("spool volume %s: sizeLimit %v, want at least --spool-max-bytes plus a segment (%d bytes): past its sizeLimit the kubelet evicts the pod, and the spool goes with it", v.Name, v.EmptyDir.SizeLimit, need)
			}
		}
	})
	if s.sub == "checker" {
		rulesPath := fmt.Sprint(s.value("rules"))
		if rulesPath == "" {
			return
		}
		if _, err := rules.Load(rulesPath); err != nil {
			t.Errorf("--rules: the checker would refuse the rules file: %v", err)
		}
	}
}

// checkProbes: readiness and liveness probes on the port the command listens on, at paths it
// serves.
func (b *kubeBuild) checkProbes(t *testing.T, w workload, c *corev1.Container, s commandSettings) {
	t.Helper()
	listen := fmt.Sprint(s.value("listen"))
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		t.Fatalf("--listen %q: %v", listen, err)
	}
	if ip := net.ParseIP(host); host == "localhost" || ip != nil && ip.IsLoopback() {
		t.Errorf("--listen %q: loopback is unreachable for the kubelet's probes and the Services; listen on every address (:%s)", listen, portStr)
	}
	if c.ReadinessProbe == nil || c.LivenessProbe == nil {
		t.Errorf("want a readiness and a liveness probe, got readiness %v, liveness %v", c.ReadinessProbe != nil, c.LivenessProbe != nil)
	}
	served := servedPaths(t, s.sub)
	for name, p := range map[string]*corev1.Probe{"startupProbe": c.StartupProbe, "readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe} {
		if p == nil {
			continue
		}
		if p.HTTPGet == nil {
			t.Errorf("%s: want an httpGet probe (the image has no shell for exec)", name)
			continue
		}
		_, port, ok := containerPort(&w.pod.Spec, p.HTTPGet.Port)
		if !ok || strconv.Itoa(int(port)) != portStr {
			t.Errorf("%s: port %s is container port %d (found %v), but `quotaflow %s` listens on %q", name, p.HTTPGet.Port.String(), port, ok, s.sub, listen)
		}
		if err := served(p.HTTPGet.Path); err != nil {
			t.Errorf("%s: path %q: %v", name, p.HTTPGet.Path, err)
		}
	}
}

// servedPaths returns a function telling whether the command serves a GET of a path. The
// checker is asked directly: its real command runs in this process (without Redis or NATS: it
// answers /readyz with 503 then, which is served). The aggregator needs ClickHouse and NATS to
// get that far, so its paths are read from the handlers runAggregator registers.
func servedPaths(t *testing.T, sub string) func(string) error {
	t.Helper()
	switch sub {
	case "checker":
		base := startBareChecker(t)
		return func(p string) error {
			resp, err := http.Get(base + p)
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed {
				return fmt.Errorf("GET answered %s by the checker", resp.Status)
			}
			return nil
		}
	case "aggregator":
		mux := http.NewServeMux()
		patterns := registeredPatterns(t, "aggregator.go", "runAggregator")
		for _, p := range patterns {
			mux.Handle(p, http.NotFoundHandler())
		}
		return func(p string) error {
			if _, pattern := mux.Handler(httptest.NewRequest(http.MethodGet, p, nil)); pattern == "" {
				return fmt.Errorf("not served by runAggregator (its patterns %q)", patterns)
			}
			return nil
		}
	}
	return func(string) error { return fmt.Errorf("this test does not know what `quotaflow %s` serves", sub) }
}

// startBareChecker runs `quotaflow checker` in this process, on loopback, with the dev rules and
// the package's Redis, until the test ends; it returns its base URL.
func startBareChecker(t *testing.T) string {
	t.Helper()
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"checker", "--listen", addr, "--rules", filepath.Join("..", "..", "deploy", "dev", "rules.yaml"),
			"--redis-url", redisSrv.URL(11), "--spool-dir", t.TempDir()}, env(nil), io.Discard, io.Discard)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("checker: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("checker did not stop")
		}
	})
	base := "http://" + addr
	for deadline := time.Now().Add(10 * time.Second); ; {
		resp, err := http.Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
			return base
		}
		select {
		case err := <-done:
			t.Fatalf("checker exited at start: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("checker not listening within 10s: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// registeredPatterns are the string patterns given to Handle and HandleFunc in function fn of
// file (in this package).
func registeredPatterns(t *testing.T, file, fn string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Name.Name != fn {
			continue
		}
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			lit, isLit := call.Args[0].(*ast.BasicLit)
			if ok && (sel.Sel.Name == "Handle" || sel.Sel.Name == "HandleFunc") && isLit && lit.Kind == token.STRING {
				if p, err := strconv.Unquote(lit.Value); err == nil {
					patterns = append(patterns, p)
				}
			}
			return true
		})
	}
	if len(patterns) == 0 {
		t.Fatalf("%s: no mux.Handle or HandleFunc with a literal pattern in %s", file, fn)
	}
	return patterns
}

// checkShutdown: the grace period covers what the command does on SIGTERM.
func checkShutdown(t *testing.T, w workload, c *corev1.Container, s commandSettings) {
	t.Helper()
	grace := 30 * time.Second // Kubernetes' default
	if g := w.pod.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	var preStop time.Duration
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
		preStop = time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	}
	switch s.sub {
	case "checker":
		// Behind Services: stay up until the endpoints have dropped the pod.
		if preStop < time.Second {
			t.Errorf("preStop sleep %s: want a few seconds, so that the endpoints drop the pod before SIGTERM stops it taking checks", preStop)
		}
		// serveChecker: requests in flight get --shutdown-timeout, then the publisher's drain
		// gets it again, then the traces' flush up to 5 s.
		need := preStop + 2*s.value("shutdown-timeout").(time.Duration) + 5*time.Second
		if grace < need {
			t.Errorf("terminationGracePeriodSeconds %s, want at least preStop %s + 2 x --shutdown-timeout + 5s = %s: SIGKILL would cut the publisher's drain", grace, preStop, need)
		}
	case "aggregator":
		// Run: the last insert and the warning states' save, each within --insert-timeout, then
		// 2 s to unpin the partitions.
		need := 2*s.value("insert-timeout").(time.Duration) + 2*time.Second
		if grace < need {
			t.Errorf("terminationGracePeriodSeconds %s, want at least 2 x --insert-timeout + 2s = %s", grace, need)
		}
	}
}

// ---- kustomize itself ----

// hashSuffix is the suffix kustomize adds to generated names.
var hashSuffix = regexp.MustCompile(`-[a-z0-9]{10}$`)

// compareWithKubectl builds the overlay with kubectl's kustomize, when kubectl is installed,
// and compares it with this test's evaluation.
func (b *kubeBuild) compareWithKubectl(t *testing.T) {
	bin, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not installed: the build this test evaluates is not compared with kustomize's")
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "kustomize", b.dir)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", b.dir, err, stderr.String())
	}
	docs := splitYAMLDocuments(out)
	got := map[string]string{}  // kind/name → what this test compares
	want := map[string]string{} // the same from this test's build
	generated := map[string]string{}
	for _, c := range b.configs {
		if c.generated {
			generated[c.name] = c.kind
		}
	}
	unhash := func(kind, name string) string {
		if base := hashSuffix.ReplaceAllString(name, ""); generated[base] == kind {
			return base
		}
		return name
	}
	for i, doc := range docs {
		var tm metav1.TypeMeta
		if err := sigsyaml.Unmarshal(doc, &tm); err != nil {
			t.Fatal(err)
		}
		newObj, ok := manifestKinds[tm.APIVersion+" "+tm.Kind]
		if !ok {
			t.Errorf("kustomize built a %s %s, which this test does not build", tm.APIVersion, tm.Kind)
			continue
		}
		obj := newObj()
		if err := decodeStrict(doc, obj); err != nil {
			t.Errorf("kustomize's document %d: %v", i+1, err)
			continue
		}
		name := obj.(metav1.Object).GetName()
		got[tm.Kind+"/"+unhash(tm.Kind, name)] = summarize(obj, unhash)
	}
	for _, o := range b.objects {
		want[o.String()] = summarize(o.obj, func(_, name string) string { return name })
	}
	for id, c := range b.configs {
		want[id] = summarizeData(c.data)
	}
	for _, id := range slices.Sorted(maps.Keys(want)) {
		if got[id] != want[id] {
			t.Errorf("%s from kubectl kustomize:\n%s\nwant (this test's build):\n%s", id, got[id], want[id])
		}
	}
	for _, id := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[id]; !ok {
			t.Errorf("kubectl kustomize built %s, which this test's build lacks", id)
		}
	}
}

// summarize is what compareWithKubectl compares of an object: the data of ConfigMaps and
// Secrets, and the images, arguments and ConfigMap and Secret references of pods.
func summarize(obj any, unhash func(kind, name string) string) string {
	var pod *corev1.PodSpec
	switch o := obj.(type) {
	case *corev1.ConfigMap:
		return summarizeData(o.Data)
	case *corev1.Secret:
		return summarizeData(secretData(o))
	case *appsv1.Deployment:
		pod = &o.Spec.Template.Spec
	case *batchv1.Job:
		pod = &o.Spec.Template.Spec
	default:
		return "(present)"
	}
	var sb strings.Builder
	for _, c := range pod.Containers {
		fmt.Fprintf(&sb, "container %s: image %s, args %q\n", c.Name, c.Image, c.Args)
		for _, ef := range c.EnvFrom {
			if ef.ConfigMapRef != nil {
				fmt.Fprintf(&sb, "  envFrom ConfigMap %s\n", unhash("ConfigMap", ef.ConfigMapRef.Name))
			}
			if ef.SecretRef != nil {
				fmt.Fprintf(&sb, "  envFrom Secret %s\n", unhash("Secret", ef.SecretRef.Name))
			}
		}
	}
	for _, v := range pod.Volumes {
		if v.ConfigMap != nil {
			fmt.Fprintf(&sb, "volume %s: ConfigMap %s\n", v.Name, unhash("ConfigMap", v.ConfigMap.Name))
		}
		if v.Secret != nil {
			fmt.Fprintf(&sb, "volume %s: Secret %s\n", v.Name, unhash("Secret", v.Secret.SecretName))
		}
	}
	return sb.String()
}

// secretData is a Secret's data and stringData, as strings.
func secretData(s *corev1.Secret) map[string]string {
	data := maps.Clone(s.StringData)
	if data == nil {
		data = map[string]string{}
	}
	for k, v := range s.Data {
		data[k] = string(v)
	}
	return data
}

func summarizeData(data map[string]string) string {
	var sb strings.Builder
	for _, k := range slices.Sorted(maps.Keys(data)) {
		fmt.Fprintf(&sb, "%s=%q\n", k, data[k])
	}
	return sb.String()
}

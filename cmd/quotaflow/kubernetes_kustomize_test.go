package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/quotaflow/quotaflow/internal/app/natsauth"
)

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
		case d.Name() == natsauth.ServerFile || d.Name() == seedKey(natsauth.Operator):
			// `quotaflow nats-auth --dir <overlay>` writes them next to the seeds the overlay
			// makes its Secret of: the NATS servers' users and the operators' seed, which no
			// pod of the overlay gets (README, "NATS with JetStream").
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

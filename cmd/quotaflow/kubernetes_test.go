package main

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsjson "sigs.k8s.io/json"
	sigsyaml "sigs.k8s.io/yaml"
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
//   - every probe hits a port the command listens on and a path it serves, asked of the real
//     checker or aggregator started in this process;
//   - shutdown, spool, memory and security settings fit what the binary and the image do;
//   - every command that connects to NATS reads its role's seed (`quotaflow nats-auth`) from
//     the Secret of the seeds, and each pod gets the seeds of its roles and no other;
//   - NetworkPolicies let into NATS, Redis and ClickHouse (selected by the labels of their
//     charts and operator) only the quotaflow pods whose commands connect there, on the client
//     port, and the servers' own pods on theirs.
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
			t.Run("nats credentials", b.checkNATSCredentials)
			t.Run("network policies", b.checkNetworkPolicies)
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
	"networking.k8s.io/v1 NetworkPolicy":     func() any { return new(networkingv1.NetworkPolicy) },
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

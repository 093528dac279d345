package main

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

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

// ---- Network policies ----

// kubeServer is a server of deploy/kubernetes/README.md ("The servers"), installed by its
// upstream chart or operator in the overlay's namespace.
type kubeServer struct {
	name string
	// labels are those the chart or operator gives the server's pods, for the README's release
	// or installation name.
	labels map[string]string
	// clientPort is where quotaflow's commands connect; closedPorts are other ports of the
	// server that no quotaflow pod needs; peerPorts are where the server's pods reach each
	// other. Only the server's own pods, and others, may reach the closed and peer ports.
	clientPort  int32
	closedPorts []int32
	peerPorts   []int32
	// flags: a command with one of these flags may be set to connect to the server (an
	// overlay sets any of them in a ConfigMap without touching the policies), so its pods
	// must be let in; a command without any must not be.
	flags []string
	// others may reach the server too, on their ports.
	others []kubePeer
}

// kubePeer is an admitted source other than quotaflow's pods and the server's own.
type kubePeer struct {
	why       string
	namespace map[string]string // labels of its namespace
	pod       map[string]string // labels of its pods
	ports     []int32
}

// appName is the label of quotaflow's pods (every workload's), and of the pods of the charts.
const appName = "app.kubernetes.io/name"

var kubeServers = []kubeServer{
	{
		// nats-io/k8s chart, release nats; its nats-box pods are component nats-box.
		name:        "NATS",
		labels:      map[string]string{appName: "nats", "app.kubernetes.io/instance": "nats", "app.kubernetes.io/component": "nats"},
		clientPort:  4222,
		closedPorts: []int32{8222}, // monitoring
		peerPorts:   []int32{6222}, // cluster routes
		flags:       []string{"nats-url"},
	},
	{
		// Bitnami redis-cluster, release redis-cluster.
		name:       "Redis",
		labels:     map[string]string{appName: "redis-cluster", "app.kubernetes.io/instance": "redis-cluster"},
		clientPort: 6379,
		peerPorts:  []int32{6379, 16379}, // replication, cluster bus
		flags:      []string{"redis-url", "redis-cluster", "redis-sentinel"},
	},
	{
		// Altinity clickhouse-operator, ClickHouseInstallation quotaflow.
		name:        "ClickHouse",
		labels:      map[string]string{"clickhouse.altinity.com/chi": "quotaflow"},
		clientPort:  9000,                // quotaflow's DSNs are native-protocol only
		closedPorts: []int32{8123},       // HTTP
		peerPorts:   []int32{9000, 9009}, // distributed queries, interserver (replicated layout)
		flags:       []string{"clickhouse-dsn", "audit-clickhouse-dsn"},
		others: []kubePeer{{
			why:       "the operator, which queries the servers while it reconciles the installation (its install bundle's namespace)",
			namespace: map[string]string{"kubernetes.io/metadata.name": "kube-system"},
			pod:       map[string]string{"app": "clickhouse-operator"},
			ports:     []int32{8123},
		}},
	},
}

// uses reports whether a workload's pods may connect to the server: one of its containers runs
// a command with one of the server's flags.
func (srv kubeServer) uses(w workload) bool {
	for _, c := range slices.Concat(w.pod.Spec.InitContainers, w.pod.Spec.Containers) {
		if len(c.Args) == 0 {
			continue
		}
		newCmd, ok := kubeCommands[c.Args[0]]
		if !ok {
			continue // reported by checkContainers
		}
		fs := newCmd().fs
		for _, f := range srv.flags {
			if fs.Lookup(f) != nil {
				return true
			}
		}
	}
	return false
}

// requires reports whether sel matches only pods with every one of the labels.
func requires(sel labels.Selector, want map[string]string) bool {
	for k, v := range want {
		if got, ok := sel.RequiresExactMatch(k); !ok || got != v {
			return false
		}
	}
	return len(want) > 0
}

// policyPort reports whether a rule's ports admit TCP port p.
func policyPort(ports []networkingv1.NetworkPolicyPort, p int32) bool {
	if len(ports) == 0 {
		return true // every port
	}
	for _, np := range ports {
		if np.Protocol != nil && *np.Protocol != corev1.ProtocolTCP {
			continue
		}
		if np.Port == nil {
			return true
		}
		end := np.Port.IntVal
		if np.EndPort != nil {
			end = *np.EndPort
		}
		if np.Port.Type == intstr.Int && p >= np.Port.IntVal && p <= end {
			return true
		}
	}
	return false
}

// checkNetworkPolicies: NetworkPolicies select the pods of each server (by the labels of its
// chart or operator) for ingress, and let in on its ports only: the quotaflow pods of this
// namespace whose commands may connect to it, on its client port; the server's own pods; and
// the server's listed others. Every workload that may connect is let in, and the server's pods
// reach each other on their peer ports. No policy selects quotaflow's pods or restricts egress.
func (b *kubeBuild) checkNetworkPolicies(t *testing.T) {
	policies := objectsOf[*networkingv1.NetworkPolicy](b)
	for _, name := range slices.Sorted(maps.Keys(policies)) {
		np := policies[name]
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		switch {
		case err != nil:
			t.Errorf("NetworkPolicy %s: podSelector: %v", name, err)
			continue
		case sel.Empty():
			t.Errorf("NetworkPolicy %s: an empty podSelector selects every pod of the namespace, quotaflow's too", name)
		}
		if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) || len(np.Spec.Egress) > 0 {
			t.Errorf("NetworkPolicy %s: policyTypes %v: want [Ingress] alone (an Egress type would cut the servers' own connections: routes, replication, ZooKeeper)", name, np.Spec.PolicyTypes)
		}
		if !slices.ContainsFunc(kubeServers, func(srv kubeServer) bool { return sel.Matches(labels.Set(srv.labels)) }) {
			t.Errorf("NetworkPolicy %s: podSelector %s selects none of the servers' pods", name, sel)
		}
		for _, w := range b.workloads() {
			if sel.Matches(labels.Set(w.pod.Labels)) {
				t.Errorf("NetworkPolicy %s: podSelector %s selects the pods of %s: it would shut their ports", name, sel, w)
			}
		}
		for i, rule := range np.Spec.Ingress {
			for _, p := range rule.Ports {
				if p.Port != nil && p.Port.Type == intstr.String {
					t.Errorf("NetworkPolicy %s: ingress[%d]: named port %q: this test checks port numbers only", name, i, p.Port.StrVal)
				}
			}
		}
	}
	for _, srv := range kubeServers {
		t.Run(srv.name, func(t *testing.T) {
			// admitted[port] are the peers of the rules that admit the port.
			admitted := map[int32][]networkingv1.NetworkPolicyPeer{}
			ports := slices.Compact(slices.Sorted(slices.Values(slices.Concat([]int32{srv.clientPort}, srv.closedPorts, srv.peerPorts))))
			var selecting []string
			for _, name := range slices.Sorted(maps.Keys(policies)) {
				np := policies[name]
				sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
				if err != nil || !sel.Matches(labels.Set(srv.labels)) {
					continue
				}
				selecting = append(selecting, name)
				for i, rule := range np.Spec.Ingress {
					for _, p := range ports {
						if !policyPort(rule.Ports, p) {
							continue
						}
						if len(rule.From) == 0 {
							t.Errorf("NetworkPolicy %s: ingress[%d] admits every source on port %d", name, i, p)
						}
						admitted[p] = append(admitted[p], rule.From...)
					}
				}
			}
			if len(selecting) == 0 {
				t.Fatalf("no NetworkPolicy selects the %s pods (labels %v): any pod of the cluster reaches them", srv.name, srv.labels)
			}
			// Only quotaflow's pods that use the server, the server's own and its others.
			for _, p := range slices.Sorted(maps.Keys(admitted)) {
				for _, peer := range admitted[p] {
					if err := srv.checkPeer(b, peer, p); err != nil {
						t.Errorf("port %d (policies %v): %v", p, selecting, err)
					}
				}
			}
			// Every workload that may connect is let in on the client port.
			admits := func(port int32, podLabels map[string]string) bool {
				for _, peer := range admitted[port] {
					if peer.NamespaceSelector != nil || peer.IPBlock != nil || peer.PodSelector == nil {
						continue
					}
					if sel, err := metav1.LabelSelectorAsSelector(peer.PodSelector); err == nil && sel.Matches(labels.Set(podLabels)) {
						return true
					}
				}
				return false
			}
			for _, w := range b.workloads() {
				if srv.uses(w) && !admits(srv.clientPort, w.pod.Labels) {
					t.Errorf("the pods of %s (labels %v) may connect to %s (flags %v) but are not let in on port %d (policies %v)", w, w.pod.Labels, srv.name, srv.flags, srv.clientPort, selecting)
				}
			}
			for _, p := range srv.peerPorts {
				if !admits(p, srv.labels) {
					t.Errorf("the %s pods are not let in to each other on port %d (policies %v): the servers could not reach each other", srv.name, p, selecting)
				}
			}
		})
	}
}

// checkPeer: a source a policy admits to the server on port: quotaflow's pods of this
// namespace whose commands use the server, on its client port; the server's own pods; one of
// its others.
func (srv kubeServer) checkPeer(b *kubeBuild, peer networkingv1.NetworkPolicyPeer, port int32) error {
	if peer.IPBlock != nil {
		return fmt.Errorf("ipBlock %s: addresses, not quotaflow's pods", peer.IPBlock.CIDR)
	}
	if peer.PodSelector == nil {
		return fmt.Errorf("namespaceSelector %v without podSelector: every pod of those namespaces", peer.NamespaceSelector)
	}
	sel, err := metav1.LabelSelectorAsSelector(peer.PodSelector)
	if err != nil {
		return err
	}
	if peer.NamespaceSelector != nil {
		nsSel, err := metav1.LabelSelectorAsSelector(peer.NamespaceSelector)
		if err != nil {
			return err
		}
		for _, o := range srv.others {
			if requires(nsSel, o.namespace) && requires(sel, o.pod) && slices.Contains(o.ports, port) {
				return nil
			}
		}
		namespaces := nsSel.String()
		if nsSel.Empty() {
			namespaces = "(all)"
		}
		return fmt.Errorf("pods %s of the namespaces %s: not this namespace's quotaflow pods, nor one of %s's others", sel, namespaces, srv.name)
	}
	if requires(sel, srv.labels) {
		return nil // the server's own pods
	}
	if v, ok := sel.RequiresExactMatch(appName); !ok || v != "quotaflow" {
		return fmt.Errorf("pods %s: neither quotaflow's (%s=quotaflow) nor the %s pods (%v)", sel, appName, srv.name, srv.labels)
	}
	if port != srv.clientPort {
		return fmt.Errorf("quotaflow's pods %s: on a port of the %s pods alone, not its client port %d", sel, srv.name, srv.clientPort)
	}
	var matched []string
	for _, w := range b.workloads() {
		if !sel.Matches(labels.Set(w.pod.Labels)) {
			continue
		}
		matched = append(matched, w.String())
		if !srv.uses(w) {
			return fmt.Errorf("quotaflow's pods %s include those of %s, whose command never connects to %s (none of %v)", sel, w, srv.name, srv.flags)
		}
	}
	if len(matched) == 0 {
		return fmt.Errorf("quotaflow's pods %s: the pods of no workload", sel)
	}
	return nil
}

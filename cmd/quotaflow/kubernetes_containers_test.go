package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"
	corev1 "k8s.io/api/core/v1"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/app/daemon"
	"github.com/quotaflow/quotaflow/internal/app/natsauth"
	"github.com/quotaflow/quotaflow/internal/cli"
	"github.com/quotaflow/quotaflow/internal/testbed/daemontest"
	"github.com/quotaflow/quotaflow/schema"
)

// ---- Containers: the command, its settings, probes and shutdown ----

// kubeCommand is a quotaflow command's flag set, built as its run function builds it, and the
// checks that function makes of the parsed values before starting anything. Keep them in step
// with runChecker, runAggregator and runMigrate; checkKubeFlagSets compares the flags with the
// commands' own --help.
type kubeCommand struct {
	fs       *cli.FlagSet
	validate func() error
}

var kubeCommands = map[string]func() kubeCommand{
	"checker": func() kubeCommand {
		fs := cli.NewFlagSet("checker", "", io.Discard)
		var c checkerFlags
		c.register(fs)
		c.registerPublish(fs, "quotaflow-spool")
		return kubeCommand{fs, func() error {
			_, err := c.validate(io.Discard)
			return err
		}}
	},
	"aggregator": func() kubeCommand {
		fs := cli.NewFlagSet("aggregator", "", io.Discard)
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
		fs := cli.NewFlagSet("migrate", "", io.Discard)
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
			if got, want := cmd.fs.Variables(), slices.Sorted(maps.Keys(help.envs)); !slices.Equal(got, want) {
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
// (distinct per placeholder): a placeholder of a NATS seed (REPLACE_ME_..._SEED, a whole line
// of a seed file) by a new nkey seed of a user, as `quotaflow nats-auth` writes.
func fillExcept(keep string) func(string) string {
	return func(v string) string {
		return placeholder.ReplaceAllStringFunc(v, func(p string) string {
			switch {
			case p == keep:
				return p
			case strings.HasSuffix(p, "_SEED"):
				return newUserSeed()
			}
			return strings.ToLower(p) + strings.Repeat("x", 32)
		})
	}
}

// newUserSeed is a new nkey seed of a NATS user.
func newUserSeed() string {
	kp, err := nkeys.CreateUser()
	if err != nil {
		panic(err)
	}
	seed, err := kp.Seed()
	if err != nil {
		panic(err)
	}
	return string(seed)
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
	_, _, value, err := b.mountSource(spec, c, p)
	return value, err
}

// mountSource is the ConfigMap or Secret ("Secret/name") and its key that a volume puts at path
// p of a container, and the key's content.
func (b *kubeBuild) mountSource(spec *corev1.PodSpec, c *corev1.Container, p string) (id, key, value string, err error) {
	for _, m := range c.VolumeMounts {
		rel, ok := strings.CutPrefix(path.Clean(p), path.Clean(m.MountPath)+"/")
		if !ok {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name != m.Name {
				continue
			}
			var items []corev1.KeyToPath
			switch {
			case v.ConfigMap != nil:
				id, items = "ConfigMap/"+v.ConfigMap.Name, v.ConfigMap.Items
			case v.Secret != nil:
				id, items = "Secret/"+v.Secret.SecretName, v.Secret.Items
			default:
				return "", "", "", fmt.Errorf("%s is on volume %s, which holds no ConfigMap or Secret", p, v.Name)
			}
			key = rel
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
				return "", "", "", fmt.Errorf("%s: volume %s's %s is not in the build", p, v.Name, id)
			}
			value, ok = cfg.data[key]
			if !ok {
				return "", "", "", fmt.Errorf("%s: %s (volume %s, mounted on %s) has no key %q (keys %v)", p, id, v.Name, m.MountPath, key, slices.Sorted(maps.Keys(cfg.data)))
			}
			return id, key, value, nil
		}
	}
	return "", "", "", fmt.Errorf("%s: no ConfigMap or Secret volume is mounted there (mounts %v)", p, mountPaths(c))
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
	sub   string
	cmd   kubeCommand
	env   map[string]string
	files map[string]string // file flags set: their paths in the container, by flag name
	errs  []error
}

// settings parses a container's settings, with fill applied to every variable and file.
func (b *kubeBuild) settings(t *testing.T, w workload, c *corev1.Container, fill func(string) string) commandSettings {
	t.Helper()
	if fill == nil {
		fill = func(v string) string { return v }
	}
	s := commandSettings{files: map[string]string{}}
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
	variables := s.cmd.fs.Variables()
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
	if err := s.cmd.fs.Parse(args, func(k string) string { return env[k] }); err != nil {
		s.errs = append(s.errs, fmt.Errorf("settings: %w", err))
		return s
	}
	s.cmd.fs.VisitAll(func(f *flag.Flag) {
		kind, _ := flag.UnquoteUsage(f)
		p := f.Value.String()
		if kind != "file" || p == "" {
			return
		}
		s.files[f.Name] = p
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
			t.Errorf("%s (in %v) is accepted by `quotaflow %s` as it stands: make it a placeholder the command refuses (a token under 16 characters, a seed file without a seed), so that the example cannot run with a published secret", p, found[p], s.sub)
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

// servedPaths returns a function telling whether the command serves a GET of a path: the
// process is started in this process (the checker on the package's Redis, the aggregator on its
// NATS and ClickHouse) and asked.
func servedPaths(t *testing.T, sub string) func(string) error {
	t.Helper()
	var base string
	switch sub {
	case "checker":
		base = daemontest.Checker(t, daemon.CheckerConfig{RulesFile: filepath.Join("..", "..", "deploy", "dev", "rules.yaml"),
			Redis: redisDB(t, 11)}).URL()
	case "aggregator":
		base = daemontest.Aggregator(t, daemon.AggregatorConfig{NATSURL: natsSrv.URL, ClickHouseDSN: chSrv.DSN(databaseName("kube")),
			Listen: "127.0.0.1:0"}).URL()
	default:
		return func(string) error { return fmt.Errorf("this test does not know what `quotaflow %s` serves", sub) }
	}
	return func(p string) error {
		resp, err := http.Get(base + p)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed {
			return fmt.Errorf("GET answered %s by the %s", resp.Status, sub)
		}
		return nil
	}
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

// ---- NATS credentials ----

// natsCredentialsSecret is the Secret of the roles' NATS seeds, generated by the overlay from
// the files `quotaflow nats-auth` writes.
const natsCredentialsSecret = "quotaflow-nats-credentials"

// natsCredentialRoles are the NATS credentials flags of each command that connects to NATS,
// and the role whose seed each must be given. Every flag of a command named nats-*creds must
// be here.
var natsCredentialRoles = map[string]map[string]natsauth.Role{
	"checker":    {"nats-creds": natsauth.Checker, "nats-admin-creds": natsauth.Admin},
	"aggregator": {"nats-creds": natsauth.Aggregator},
}

// seedKey is the name of role's seed file, as `quotaflow nats-auth` writes it: its key in the
// Secret of the seeds.
func seedKey(role natsauth.Role) string { return filepath.Base(natsauth.SeedFile("", role)) }

// checkNATSCredentials: NATS admits quotaflow's roles only (`quotaflow nats-auth` writes their
// users), so every command with --nats-url is given each of its credentials flags, and each
// is a file of a volume of the Secret of the seeds, the key of the flag's role. A pod gets the
// seeds its commands read and no other (an aggregator holding admin.nk could rewrite the
// rules, one holding checker.nk publish decisions), readable by its group (fsGroup) and not by
// every user.
func (b *kubeBuild) checkNATSCredentials(t *testing.T) {
	secretID := "Secret/" + natsCredentialsSecret
	for _, w := range b.workloads() {
		t.Run(w.String(), func(t *testing.T) {
			spec := &w.pod.Spec
			read := map[string]bool{} // keys of the Secret the pod's commands read
			for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
				s := b.settings(t, w, &c, fillExcept(""))
				if s.cmd.fs == nil {
					continue // reported by checkContainers
				}
				var flags []string
				s.cmd.fs.VisitAll(func(f *flag.Flag) {
					if strings.HasPrefix(f.Name, "nats-") && strings.HasSuffix(f.Name, "creds") {
						flags = append(flags, f.Name)
					}
				})
				for _, name := range flags {
					role, ok := natsCredentialRoles[s.sub][name]
					if !ok {
						t.Errorf("container %s: --%s of `quotaflow %s`: a NATS credentials flag this test does not know; say its role in natsCredentialRoles", c.Name, name, s.sub)
						continue
					}
					p := s.files[name]
					if p == "" {
						if fmt.Sprint(s.value("nats-url")) != "" {
							t.Errorf("container %s: --%s (%s) is not set, but --nats-url is: NATS admits quotaflow's roles only, and this command is the %s role by its seed %s", c.Name, name, s.cmd.fs.Variable(name), role, seedKey(role))
						}
						continue
					}
					id, key, _, err := b.mountSource(spec, &c, p)
					switch {
					case err != nil:
						t.Errorf("container %s: --%s: %v", c.Name, name, err)
					case id != secretID || key != seedKey(role):
						t.Errorf("container %s: --%s %s is key %q of %s, want key %q of %s: the %s role's seed", c.Name, name, p, key, id, seedKey(role), secretID, role)
					default:
						read[key] = true
					}
				}
			}
			// What the pod gets of the Secret: its volumes' items (every key without items),
			// and its environment.
			got := map[string][]string{} // key → how the pod gets it
			allKeys := func() []string {
				if cfg, ok := b.configs[secretID]; ok {
					return slices.Sorted(maps.Keys(cfg.data))
				}
				return nil
			}
			for _, v := range spec.Volumes {
				if v.Secret == nil || v.Secret.SecretName != natsCredentialsSecret {
					continue
				}
				mode := int32(corev1.SecretVolumeSourceDefaultMode)
				if v.Secret.DefaultMode != nil {
					mode = *v.Secret.DefaultMode
				}
				modes := []int32{mode}
				keys := allKeys()
				if len(v.Secret.Items) > 0 {
					keys = nil
					for _, it := range v.Secret.Items {
						keys = append(keys, it.Key)
						if it.Mode != nil {
							modes = append(modes, *it.Mode)
						}
					}
				}
				for _, k := range keys {
					got[k] = append(got[k], "volume "+v.Name)
				}
				for _, m := range modes {
					if m&0o007 != 0 {
						t.Errorf("volume %s: mode %#o: every user of the container may read the NATS seeds; want 0440 (or 0400) with the pod's fsGroup", v.Name, m)
					}
				}
				if spec.SecurityContext == nil || spec.SecurityContext.FSGroup == nil {
					t.Errorf("volume %s: no fsGroup: the seeds belong to root, and the non-root user cannot read them", v.Name)
				}
			}
			for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
				for _, ef := range c.EnvFrom {
					if ef.SecretRef != nil && ef.SecretRef.Name == natsCredentialsSecret {
						for _, k := range allKeys() {
							got[k] = append(got[k], "envFrom of container "+c.Name)
						}
					}
				}
				for _, e := range c.Env {
					if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name == natsCredentialsSecret {
						got[e.ValueFrom.SecretKeyRef.Key] = append(got[e.ValueFrom.SecretKeyRef.Key], "env "+e.Name+" of container "+c.Name)
					}
				}
			}
			for _, k := range slices.Sorted(maps.Keys(got)) {
				if !read[k] {
					t.Errorf("the pod gets %s of %s (%s), which none of its commands reads: each pod holds its roles' seeds and no other (want only %v)", k, secretID, strings.Join(got[k], ", "), slices.Sorted(maps.Keys(read)))
				}
			}
		})
	}
}

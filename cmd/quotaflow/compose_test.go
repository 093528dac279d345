package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
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

	"github.com/nats-io/nats-server/v2/server"
	"go.yaml.in/yaml/v3"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/app/natsauth"
	"github.com/quotaflow/quotaflow/internal/cli"
)

// TestCompose checks docker-compose.yml and deploy/Dockerfile against the binary they run, without
// a Docker engine: `docker-compose config` validates and normalizes the compose file, and every
// service built from deploy/Dockerfile must run an existing command with flags and QUOTAFLOW_*
// variables that command's --help names, publish the port it listens on, and reach the other
// services on ports they serve. The Dockerfile must build a static binary, run it as a non-root
// user and hold the files the services point at.
func TestCompose(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	cf := loadCompose(t, filepath.Join(root, "docker-compose.yml"))
	dockerfilePath := filepath.Join(root, "deploy", "Dockerfile")
	df := loadDockerfile(t, dockerfilePath)
	df.check(t)

	// The services that run quotaflow: built from deploy/Dockerfile, or running the image one of
	// those builds.
	images := map[string]bool{}
	for _, s := range cf.Services {
		if s.Build != nil && s.Build.dockerfile(root) == dockerfilePath && s.Image != "" {
			images[s.Image] = true
		}
	}
	var names []string
	for name, s := range cf.Services {
		if s.Build != nil && s.Build.dockerfile(root) == dockerfilePath || s.Build == nil && images[s.Image] {
			names = append(names, name)
		}
	}
	slices.Sort(names)

	ran := map[string]bool{}                   // subcommand → run by some service
	shared := map[string]map[string][]string{} // flag → value → services: settings every service must agree on
	for _, name := range names {
		s := cf.Services[name]
		t.Run(name, func(t *testing.T) {
			if len(s.Command) == 0 {
				t.Fatalf("no command: the image's ENTRYPOINT is the bare binary, which needs a subcommand (e.g. command: [\"checker\"])")
			}
			sub, args := s.Command[0], s.Command[1:]
			ran[sub] = true

			// (a) The subcommand exists.
			if !slices.ContainsFunc(program().Commands, func(c cli.Command) bool { return c.Name == sub }) {
				t.Fatalf("command %q: quotaflow has no such subcommand", sub)
			}

			// (b) Flags and variables are the ones the subcommand's help names.
			help := commandHelp(t, sub)
			for k := range s.Environment {
				if !help.envs[k] {
					t.Errorf("environment %s: not a variable of `quotaflow %s` (its help names %s)", k, sub, strings.Join(sortedKeys(help.envs), ", "))
				}
			}
			cmdValues := map[string]string{} // flag → value given in command
			for i := 0; i < len(args); i++ {
				a := args[i]
				if !strings.HasPrefix(a, "-") {
					t.Errorf("command %q: argument %q is not a flag (the commands take none)", s.Command, a)
					continue
				}
				name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
				f, ok := help.flags[name]
				if !ok {
					t.Errorf("command %q: --%s is not a flag of `quotaflow %s`", s.Command, name, sub)
					continue
				}
				if !hasValue {
					value = "true"
					if !f.isBool && i+1 < len(args) {
						i++
						value = args[i]
					}
				}
				cmdValues[name] = value
			}
			// The flag parser itself must take the command line up to a --help put at its end.
			if stdout, stderr, code := runCmd(t.Context(), append(slices.Clone(s.Command), "--help"), nil); code != 0 {
				t.Errorf("quotaflow %s --help: exit %d, want 0: the command line does not parse:\n%s%s", strings.Join(s.Command, " "), code, stdout, stderr)
			}
			// And the settings, from the command line and the environment, must pass the command's own
			// validation (where this test knows how to run it without starting anything).
			if validate := composeValidators[sub]; validate != nil {
				if err := validate(args, env(hostCredentials(t, s.Environment))); err != nil {
					t.Errorf("settings rejected as `quotaflow %s` would reject them at start: %v", sub, err)
				}
			}
			// setting is what the command would use: the command line wins over the environment,
			// which wins over the default.
			setting := func(flag string) string {
				if v, ok := cmdValues[flag]; ok {
					return v
				}
				if v := s.Environment[help.flags[flag].env]; v != "" {
					return strings.TrimSpace(v)
				}
				return help.flags[flag].def
			}
			for _, flag := range []string{"nats-url", "partitions"} {
				if _, ok := help.flags[flag]; ok {
					v := setting(flag)
					if shared[flag] == nil {
						shared[flag] = map[string][]string{}
					}
					shared[flag][v] = append(shared[flag][v], name)
				}
			}

			// (c) Every published port is the one the command listens on, on every interface.
			if len(s.Ports) > 0 {
				if _, ok := help.flags["listen"]; !ok {
					t.Errorf("ports %v: `quotaflow %s` listens on no port (no --listen)", s.Ports, sub)
				} else {
					listen := setting("listen")
					host, port, err := net.SplitHostPort(listen)
					if err != nil {
						t.Errorf("--listen %q: %v", listen, err)
					}
					if ip := net.ParseIP(host); host == "localhost" || ip != nil && ip.IsLoopback() {
						t.Errorf("--listen %q (QUOTAFLOW_LISTEN): loopback in a container is unreachable from its published ports; listen on 0.0.0.0", listen)
					}
					for _, p := range s.Ports {
						if p.first != p.last || strconv.Itoa(p.first) != port {
							t.Errorf("ports: container port %s, but `quotaflow %s` listens on %q (QUOTAFLOW_LISTEN)", p, sub, listen)
						}
					}
					if !slices.Contains(df.exposed, port) {
						t.Errorf("listen port %s is not among the Dockerfile's EXPOSE %v", port, df.exposed)
					}
				}
			}

			// (d) URLs name a service of this file and a port it serves.
			for _, kv := range sortedKeys(s.Environment) {
				checkServiceURL(t, cf, kv, s.Environment[kv])
			}
			for _, flag := range sortedKeys(cmdValues) {
				checkServiceURL(t, cf, "--"+flag, cmdValues[flag])
			}

			// The rules file is the one the image holds (or a volume mounts).
			if _, ok := help.flags["rules"]; ok {
				checkRulesFile(t, df, s, root, setting("rules"))
			}

			// Decisions spooled while NATS is down must outlive the container, in a directory the
			// non-root user can write.
			if _, ok := help.flags["spool-dir"]; ok && setting("nats-url") != "" {
				dir := setting("spool-dir")
				if !path.IsAbs(dir) || !slices.ContainsFunc(s.Volumes, func(v composeVolume) bool { return path.Clean(v.Target) == path.Clean(dir) }) {
					t.Errorf("spool %q (QUOTAFLOW_SPOOL_DIR): want an absolute path with a volume mounted on it, volumes %v", dir, s.Volumes)
				}
				if c, ok := df.copyTo(dir); !ok || c.chown == "" || isRootUser(c.chown) {
					t.Errorf("spool %q: the Dockerfile's final stage must create it with COPY --chown=<non-root>, so a fresh volume on it is writable", dir)
				}
			}
		})
	}

	for _, sub := range []string{"checker", "aggregator"} {
		if !ran[sub] {
			t.Errorf("no service built from deploy/Dockerfile runs `quotaflow %s` (services %v)", sub, names)
		}
	}
	for flag, values := range shared {
		if len(values) > 1 {
			t.Errorf("--%s differs between services: %v; checkers and aggregators must agree on it", flag, values)
		}
	}
}

// composeFile is the part of `docker-compose config` (v1 or v2) the test reads.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image       string          `yaml:"image"`
	Build       *composeBuild   `yaml:"build"`
	Command     stringList      `yaml:"command"`
	Environment environment     `yaml:"environment"`
	Ports       []composePort   `yaml:"ports"`
	Expose      []string        `yaml:"expose"`
	Volumes     []composeVolume `yaml:"volumes"`
}

type composeBuild struct {
	Context    string `yaml:"context"`
	Dockerfile string `yaml:"dockerfile"`
}

func (b *composeBuild) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		b.Context = n.Value
		return nil
	}
	type plain composeBuild
	return n.Decode((*plain)(b))
}

// dockerfile is the absolute path of the Dockerfile the service builds from.
func (b *composeBuild) dockerfile(root string) string {
	ctx := b.Context
	if !filepath.IsAbs(ctx) {
		ctx = filepath.Join(root, ctx)
	}
	f := b.Dockerfile
	if f == "" {
		f = "Dockerfile"
	}
	if !filepath.IsAbs(f) {
		f = filepath.Join(ctx, f)
	}
	return filepath.Clean(f)
}

func (b *composeBuild) contextDir(root string) string {
	if filepath.IsAbs(b.Context) {
		return b.Context
	}
	return filepath.Join(root, b.Context)
}

// stringList is a command: a list, or a string split on spaces.
type stringList []string

func (l *stringList) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*l = strings.Fields(n.Value)
		return nil
	}
	return n.Decode((*[]string)(l))
}

// environment is a service's environment: a map, or a list of KEY=value.
type environment map[string]string

func (e *environment) UnmarshalYAML(n *yaml.Node) error {
	*e = environment{}
	if n.Kind == yaml.SequenceNode {
		var list []string
		if err := n.Decode(&list); err != nil {
			return err
		}
		for _, kv := range list {
			k, v, _ := strings.Cut(kv, "=")
			(*e)[k] = v
		}
		return nil
	}
	return n.Decode((*map[string]string)(e))
}

// composePort is a ports entry: "[ip:][published:]target[/proto]" or the long form.
type composePort struct {
	first, last int // the container port, or range of ports
	hostIP      string
	raw         string
}

func (p composePort) String() string { return p.raw }

func (p *composePort) UnmarshalYAML(n *yaml.Node) error {
	target := n.Value
	p.raw = n.Value
	if n.Kind == yaml.MappingNode {
		var long struct {
			Target string `yaml:"target"`
			HostIP string `yaml:"host_ip"`
		}
		if err := n.Decode(&long); err != nil {
			return err
		}
		target, p.raw, p.hostIP = long.Target, "target "+long.Target, long.HostIP
	} else {
		target, _, _ = strings.Cut(target, "/")
		if parts := strings.Split(target, ":"); len(parts) == 3 {
			p.hostIP = parts[0]
		}
		if i := strings.LastIndex(target, ":"); i >= 0 {
			target = target[i+1:]
		}
	}
	first, last, isRange := strings.Cut(target, "-")
	var err error
	if p.first, err = strconv.Atoi(first); err != nil {
		return fmt.Errorf("port %q: %w", p.raw, err)
	}
	p.last = p.first
	if isRange {
		if p.last, err = strconv.Atoi(last); err != nil {
			return fmt.Errorf("port %q: %w", p.raw, err)
		}
	}
	return nil
}

// composeVolume is a volumes entry: "[source:]target[:mode]" or the long form.
type composeVolume struct {
	Source string `yaml:"source"`
	Target string `yaml:"target"`
}

func (v *composeVolume) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		parts := strings.Split(n.Value, ":")
		if len(parts) == 1 {
			v.Target = parts[0]
		} else {
			v.Source, v.Target = parts[0], parts[1]
		}
		return nil
	}
	type plain composeVolume
	return n.Decode((*plain)(v))
}

// composeAdminToken is the operator's admin token the compose tests supply.
const composeAdminToken = "compose-test-admin-token"

// loadCompose runs `docker-compose config` on file, with the operator's admin token in the
// environment, and parses what it prints.
func loadCompose(t *testing.T, file string) composeFile {
	t.Helper()
	out, err := composeConfig(t, file, "QUOTAFLOW_ADMIN_TOKEN="+composeAdminToken)
	if err != nil {
		t.Fatal(err)
	}
	var cf composeFile
	if err := yaml.Unmarshal([]byte(out), &cf); err != nil {
		t.Fatalf("parse `docker-compose config` output: %v\n%s", err, out)
	}
	if len(cf.Services) == 0 {
		t.Fatalf("docker-compose config: no services:\n%s", out)
	}
	return cf
}

// composeConfig runs `docker-compose -f file config` with env added to this process's
// environment (QUOTAFLOW_ADMIN_TOKEN taken out first) and returns what it prints.
func composeConfig(t *testing.T, file string, env ...string) (string, error) {
	t.Helper()
	bin, err := exec.LookPath("docker-compose")
	if err != nil {
		t.Fatalf("docker-compose is not installed (`make test` installs it, see deploy/dev/install-deps.sh): %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-f", file, "config")
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "QUOTAFLOW_ADMIN_TOKEN=") })
	cmd.Env = append(cmd.Env, env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("docker-compose -f %s config: %w\n%s", file, err, stderr.String())
	}
	return string(out), nil
}

// TestComposeSecureDefaults: compose refuses to start without an admin token of the
// operator's (there is no default token outside make dev), and publishes every port on
// loopback only.
func TestComposeSecureDefaults(t *testing.T) {
	t.Parallel()
	file := filepath.Join("..", "..", "docker-compose.yml")
	if _, err := composeConfig(t, file); err == nil || !strings.Contains(err.Error(), "set QUOTAFLOW_ADMIN_TOKEN") {
		t.Errorf("docker-compose config without QUOTAFLOW_ADMIN_TOKEN = %v, want a refusal naming it", err)
	}
	cf := loadCompose(t, file)
	if got := cf.Services["checker"].Environment["QUOTAFLOW_ADMIN_TOKEN"]; got != composeAdminToken {
		t.Errorf("checker's QUOTAFLOW_ADMIN_TOKEN = %q, want the operator's %q", got, composeAdminToken)
	}
	for name, s := range cf.Services {
		for _, p := range s.Ports {
			if p.hostIP != "127.0.0.1" {
				t.Errorf("service %s publishes %s on %q, want 127.0.0.1 only", name, p, p.hostIP)
			}
		}
	}
}

// commandHelp is what `quotaflow <sub> --help` says about the flags.
type helpInfo struct {
	flags map[string]helpFlag // flag name → its help
	envs  map[string]bool     // every QUOTAFLOW_* variable a flag reads
}

type helpFlag struct {
	env    string // QUOTAFLOW_* variable, "" if none
	def    string // default value, "" if none printed
	isBool bool
}

var (
	helpFlagLine = regexp.MustCompile(`^  --([a-zA-Z0-9][a-zA-Z0-9_.-]*)(?: ([^\t ]+))?(?:\t.*)?$`)
	helpEnv      = regexp.MustCompile(`\(env (QUOTAFLOW_[A-Z0-9_]+)\)`)
	helpDefault  = regexp.MustCompile(`\(default (.*)\)\s*$`)
)

func commandHelp(t *testing.T, sub string) helpInfo {
	t.Helper()
	stdout, stderr, code := runCmd(t.Context(), []string{sub, "--help"}, nil)
	if code != 0 {
		t.Fatalf("quotaflow %s --help: exit %d\n%s%s", sub, code, stdout, stderr)
	}
	h := helpInfo{flags: map[string]helpFlag{}, envs: map[string]bool{}}
	var cur string
	sc := bufio.NewScanner(strings.NewReader(stdout + stderr))
	for sc.Scan() {
		line := sc.Text()
		if m := helpFlagLine.FindStringSubmatch(line); m != nil {
			cur = m[1]
			h.flags[cur] = helpFlag{isBool: m[2] == ""}
		} else if !strings.HasPrefix(line, "    \t") {
			cur = ""
		}
		if cur == "" {
			continue
		}
		f := h.flags[cur]
		if m := helpEnv.FindStringSubmatch(line); m != nil {
			f.env = m[1]
			h.envs[m[1]] = true
		}
		if m := helpDefault.FindStringSubmatch(line); m != nil {
			f.def = m[1]
			if u, err := strconv.Unquote(m[1]); err == nil {
				f.def = u
			}
		}
		h.flags[cur] = f
	}
	if len(h.flags) == 0 || len(h.envs) == 0 {
		t.Fatalf("quotaflow %s --help: found no flags or no QUOTAFLOW_* variables in:\n%s%s", sub, stdout, stderr)
	}
	return h
}

// composeValidators parse and validate a command's settings as the command does before it
// starts anything. They mirror runChecker and runAggregator: keep them in step.
var composeValidators = map[string]func(args []string, getenv func(string) string) error{
	"checker": func(args []string, getenv func(string) string) error {
		fs := cli.NewFlagSet("checker", "", io.Discard)
		var c checkerFlags
		c.register(fs)
		c.registerPublish(fs, "quotaflow-spool")
		if err := fs.Parse(args, getenv); err != nil {
			return err
		}
		_, err := c.validate(io.Discard)
		if err == nil {
			var rdb interface{ Close() error }
			if rdb, err = c.redis.client(context.Background()); err == nil {
				rdb.Close() // a --redis-url client: nothing was contacted
			}
		}
		return err
	},
	"aggregator": func(args []string, getenv func(string) string) error {
		fs := cli.NewFlagSet("aggregator", "", io.Discard)
		var a aggregatorFlags
		a.register(fs, false)
		if err := fs.Parse(args, getenv); err != nil {
			return err
		}
		if err := a.validate(); err != nil {
			return err
		}
		_, err := newLogger(a.logLevel, a.logFormat, io.Discard)
		return err
	},
}

// Ports the images of the services quotaflow talks to serve without configuration.
var (
	imagePorts = map[string][]int{
		"redis":                        {6379},
		"nats":                         {4222},
		"clickhouse/clickhouse-server": {9000, 8123},
	}
	schemePorts = map[string]int{"redis": 6379, "rediss": 6379, "nats": 4222, "tls": 4222, "clickhouse": 9000, "http": 80, "https": 443}
)

// checkServiceURL checks that a URL setting names a service of the file and a port it serves.
func checkServiceURL(t *testing.T, cf composeFile, setting, value string) {
	t.Helper()
	if !strings.Contains(value, "://") {
		return
	}
	u, err := url.Parse(value)
	if err != nil {
		t.Errorf("%s=%q: %v", setting, value, err)
		return
	}
	host := u.Hostname()
	target, ok := cf.Services[host]
	if !ok {
		t.Errorf("%s=%q: host %q is no service of docker-compose.yml (services %v); in a container, loopback is the container itself", setting, value, host, sortedKeys(cf.Services))
		return
	}
	port := schemePorts[u.Scheme]
	if p := u.Port(); p != "" {
		port, _ = strconv.Atoi(p)
	}
	served := target.servedPorts()
	if !slices.Contains(served, port) {
		t.Errorf("%s=%q: service %s serves ports %v, not %d", setting, value, host, served, port)
	}
	// ClickHouse's image creates the user its environment names; with neither, the default user
	// has no network access unless CLICKHOUSE_SKIP_USER_SETUP=1.
	if u.Scheme == "clickhouse" && strings.HasPrefix(imageRepo(target.Image), "clickhouse/") {
		user, password := "default", ""
		if v := target.Environment["CLICKHOUSE_USER"]; v != "" {
			user = v
		}
		if v, ok := target.Environment["CLICKHOUSE_PASSWORD"]; ok {
			password = v
		}
		gotPassword, _ := u.User.Password()
		if u.User.Username() != user || gotPassword != password {
			t.Errorf("%s=%q: credentials %q, but service %s has user %q with password %q", setting, value, u.User.String(), host, user, password)
		}
		if user == "default" && password == "" && target.Environment["CLICKHOUSE_SKIP_USER_SETUP"] != "1" {
			t.Errorf("%s=%q: the image's default user without a password is local-only; set CLICKHOUSE_SKIP_USER_SETUP=1 or a user and password on service %s", setting, value, host)
		}
	}
}

// servedPorts are the container ports a service serves: its published and exposed ports and
// its image's defaults.
func (s composeService) servedPorts() []int {
	ports := slices.Clone(imagePorts[imageRepo(s.Image)])
	for _, p := range s.Ports {
		for n := p.first; n <= p.last; n++ {
			ports = append(ports, n)
		}
	}
	for _, e := range s.Expose {
		e, _, _ = strings.Cut(e, "/")
		if n, err := strconv.Atoi(e); err == nil {
			ports = append(ports, n)
		}
	}
	slices.Sort(ports)
	return slices.Compact(ports)
}

// imageRepo is an image reference without registry prefix docker.io/library, tag and digest.
func imageRepo(image string) string {
	image, _, _ = strings.Cut(image, "@")
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		image = image[:i]
	}
	image = strings.TrimPrefix(image, "docker.io/")
	return strings.TrimPrefix(image, "library/")
}

// checkRulesFile checks that the rules path a service uses is in the image or on a volume, and
// that the file put there is valid.
func checkRulesFile(t *testing.T, df *dockerfile, s composeService, root, rulesPath string) {
	t.Helper()
	if rulesPath == "" {
		t.Errorf("no rules file: set QUOTAFLOW_RULES to the path the Dockerfile copies the rules to")
		return
	}
	var source string
	for _, v := range s.Volumes {
		if path.Clean(v.Target) == path.Clean(rulesPath) && (filepath.IsAbs(v.Source) || strings.HasPrefix(v.Source, ".")) {
			source = v.Source
			if !filepath.IsAbs(source) {
				source = filepath.Join(root, source)
			}
		}
	}
	if source == "" {
		c, ok := df.copyTo(rulesPath)
		if !ok {
			t.Errorf("QUOTAFLOW_RULES=%q: the Dockerfile's final stage copies no file there (it copies to %v), and no volume mounts one", rulesPath, df.copyDests())
			return
		}
		if c.from != "" || len(c.sources) != 1 {
			t.Errorf("QUOTAFLOW_RULES=%q: want it copied from one file of the build context, got %s", rulesPath, c.raw)
			return
		}
		ctx := root
		if s.Build != nil {
			ctx = s.Build.contextDir(root)
		}
		source = filepath.Join(ctx, c.sources[0])
	}
	if _, err := rules.Load(source); err != nil {
		t.Errorf("QUOTAFLOW_RULES=%q comes from %s, which the checker would refuse: %v", rulesPath, source, err)
	}
}

// dockerfile is a parsed Dockerfile.
type dockerfile struct {
	path    string
	stages  [][]instruction // each FROM's instructions, FROM first
	exposed []string        // the final stage's EXPOSE ports
}

type instruction struct {
	line int
	cmd  string // upper case
	args string
}

type copyInstr struct {
	raw     string
	from    string // --from stage, "" for the build context
	chown   string
	sources []string
	dest    string
}

func loadDockerfile(t *testing.T, file string) *dockerfile {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("read the Dockerfile: %v", err)
	}
	df := &dockerfile{path: file}
	var cur strings.Builder
	start := 0
	for i, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || trimmed == "" && cur.Len() == 0 {
			continue // comments (also inside continued lines) and blank lines
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if strings.HasSuffix(trimmed, `\`) {
			cur.WriteString(strings.TrimSuffix(trimmed, `\`) + " ")
			continue
		}
		cur.WriteString(trimmed)
		cmd, args, _ := strings.Cut(strings.TrimSpace(cur.String()), " ")
		cur.Reset()
		in := instruction{line: start, cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			df.stages = append(df.stages, nil)
		}
		if len(df.stages) == 0 {
			if in.cmd != "ARG" {
				t.Fatalf("%s:%d: %s before the first FROM", file, in.line, in.cmd)
			}
			continue
		}
		df.stages[len(df.stages)-1] = append(df.stages[len(df.stages)-1], in)
	}
	if len(df.stages) > 0 {
		for _, in := range df.final() {
			if in.cmd == "EXPOSE" {
				for _, p := range strings.Fields(in.args) {
					p, _, _ = strings.Cut(p, "/")
					df.exposed = append(df.exposed, p)
				}
			}
		}
	}
	return df
}

func (df *dockerfile) final() []instruction { return df.stages[len(df.stages)-1] }

// copies are the final stage's COPY and ADD instructions.
func (df *dockerfile) copies() []copyInstr {
	var out []copyInstr
	for _, in := range df.final() {
		if in.cmd != "COPY" && in.cmd != "ADD" {
			continue
		}
		c := copyInstr{raw: in.cmd + " " + in.args}
		fields := strings.Fields(in.args)
		var rest []string
		for i, f := range fields {
			if !strings.HasPrefix(f, "--") {
				rest = fields[i:]
				break
			}
			k, v, _ := strings.Cut(strings.TrimPrefix(f, "--"), "=")
			switch k {
			case "from":
				c.from = v
			case "chown":
				c.chown = v
			}
		}
		if len(rest) > 0 && strings.HasPrefix(rest[0], "[") {
			json.Unmarshal([]byte(strings.Join(rest, " ")), &rest)
		}
		if len(rest) < 2 {
			continue
		}
		c.sources, c.dest = rest[:len(rest)-1], rest[len(rest)-1]
		out = append(out, c)
	}
	return out
}

// copyTo is the final stage's COPY that puts a file or directory at p.
func (df *dockerfile) copyTo(p string) (copyInstr, bool) {
	for _, c := range df.copies() {
		dest := c.dest
		if strings.HasSuffix(dest, "/") && len(c.sources) == 1 {
			dest += path.Base(c.sources[0])
		}
		if path.Clean(dest) == path.Clean(p) {
			return c, true
		}
	}
	return copyInstr{}, false
}

func (df *dockerfile) copyDests() []string {
	var out []string
	for _, c := range df.copies() {
		out = append(out, c.dest)
	}
	return out
}

// check checks what every service relies on: a multi-stage build of a static binary, run by a
// non-root user as the entrypoint, so that a service's command is a subcommand.
func (df *dockerfile) check(t *testing.T) {
	t.Helper()
	if len(df.stages) < 2 {
		t.Errorf("%s: %d FROM, want a multi-stage build (build stage, then a small final stage)", df.path, len(df.stages))
		if len(df.stages) == 0 {
			t.FailNow()
		}
	}
	builds := 0
	for _, stage := range df.stages {
		cgoOff := false
		for _, in := range stage {
			if (in.cmd == "ENV" || in.cmd == "ARG") && cgoDisabled.MatchString(in.args) {
				cgoOff = true
			}
			if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
				builds++
				if !cgoOff && !strings.Contains(in.args, "CGO_ENABLED=0") {
					t.Errorf("%s:%d: go build without CGO_ENABLED=0: the binary would need libc, which the final image lacks", df.path, in.line)
				}
			}
		}
	}
	if builds == 0 {
		t.Errorf("%s: no RUN go build", df.path)
	}
	user := ""
	var entrypoint []string
	for _, in := range df.final() {
		switch in.cmd {
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			entrypoint = nil
			if err := json.Unmarshal([]byte(in.args), &entrypoint); err != nil {
				t.Errorf("%s:%d: ENTRYPOINT %s: want the exec form [\"/path/to/quotaflow\"]: %v", df.path, in.line, in.args, err)
			}
		}
	}
	if user == "" || isRootUser(user) {
		t.Errorf("%s: final stage's USER is %q, want a non-root user", df.path, user)
	}
	if len(entrypoint) != 1 {
		t.Errorf("%s: ENTRYPOINT %q, want the binary alone, so that a service's command is the subcommand", df.path, entrypoint)
	} else if _, ok := df.copyTo(entrypoint[0]); !ok {
		t.Errorf("%s: ENTRYPOINT %s is not copied into the final stage (copies %v)", df.path, entrypoint[0], df.copyDests())
	}
}

var cgoDisabled = regexp.MustCompile(`\bCGO_ENABLED[= ]0\b`)

// isRootUser reports whether a USER or --chown value names root.
func isRootUser(u string) bool {
	name, _, _ := strings.Cut(u, ":")
	return name == "root" || name == "0"
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// hostCredentials is environment with the NATS credentials files it names (paths in the
// container, in the volume nats-auth writes) replaced by seeds of the same roles on this
// machine, so that the settings validate here; TestComposeNATSAuth checks the paths.
func hostCredentials(t *testing.T, environment map[string]string) map[string]string {
	t.Helper()
	out := maps.Clone(environment)
	dir := t.TempDir()
	if _, err := natsauth.Ensure(dir); err != nil {
		t.Fatal(err)
	}
	for k, v := range out {
		if strings.HasPrefix(k, "QUOTAFLOW_NATS_") && strings.HasSuffix(k, "_CREDS") {
			out[k] = filepath.Join(dir, path.Base(v))
		}
	}
	return out
}

// TestComposeNATSAuth: docker-compose.yml runs NATS with quotaflow's users only, written once
// by a nats-auth service into a volume, and gives each process its role's seed from there.
func TestComposeNATSAuth(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	cf := loadCompose(t, filepath.Join(root, "docker-compose.yml"))
	var authDir, authVolume string
	for _, s := range cf.Services {
		if len(s.Command) > 2 && s.Command[0] == "nats-auth" && s.Command[1] == "--dir" {
			authDir = s.Command[2]
			for _, v := range s.Volumes {
				if path.Clean(v.Target) == path.Clean(authDir) {
					authVolume = v.Source
				}
			}
		}
	}
	if authVolume == "" {
		t.Fatalf("no service runs `quotaflow nats-auth --dir <a volume>`")
	}
	mounts := func(s composeService, dir string) bool {
		return slices.ContainsFunc(s.Volumes, func(v composeVolume) bool {
			return v.Source == authVolume && path.Clean(v.Target) == path.Clean(dir)
		})
	}
	want := map[string]map[string]natsauth.Role{
		"checker":    {"QUOTAFLOW_NATS_CREDS": natsauth.Checker, "QUOTAFLOW_NATS_ADMIN_CREDS": natsauth.Admin},
		"aggregator": {"QUOTAFLOW_NATS_CREDS": natsauth.Aggregator},
	}
	for name, vars := range want {
		s, ok := cf.Services[name]
		if !ok {
			t.Errorf("no service %s", name)
			continue
		}
		for v, role := range vars {
			p := s.Environment[v]
			if path.Base(p) != string(role)+".nk" || !mounts(s, path.Dir(p)) {
				t.Errorf("%s: %s=%q, want %s.nk of the volume %s mounted at its folder (volumes %v)", name, v, p, role, authVolume, s.Volumes)
			}
		}
	}
	nats, ok := cf.Services["nats"]
	if !ok || len(nats.Command) != 2 || nats.Command[0] != "-c" {
		t.Fatalf("service nats: want command [-c <configuration file>], got %v", nats.Command)
	}
	conf := nats.Command[1]
	var source string
	for _, v := range nats.Volumes {
		if v.Target == conf {
			source = v.Source
		}
	}
	if source == "" || !mounts(nats, path.Join(path.Dir(conf), "auth")) {
		t.Fatalf("service nats: want %s mounted from the repository and the volume %s at %s/auth (volumes %v)", conf, authVolume, path.Dir(conf), nats.Volumes)
	}
	// The server reads the shipped file with the users nats-auth writes beside it.
	dir := t.TempDir()
	b, err := os.ReadFile(source)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "nats-server.conf"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := runCmd(t.Context(), []string{"nats-auth", "--dir", filepath.Join(dir, "auth")}, nil); code != 0 {
		t.Fatalf("nats-auth: exit %d\n%s", code, stderr)
	}
	opts, err := server.ProcessConfigFile(filepath.Join(dir, "nats-server.conf"))
	if err != nil {
		t.Fatalf("%s with nats-auth's users: %v", source, err)
	}
	if len(opts.Nkeys) != len(natsauth.Roles) || len(opts.Users) != 0 || opts.NoAuthUser != "" {
		t.Errorf("%s: %d nkey users, %d others, no-auth user %q; want one per role and no other", source, len(opts.Nkeys), len(opts.Users), opts.NoAuthUser)
	}
	if opts.Port != 4222 || !opts.JetStream {
		t.Errorf("%s: port %d, JetStream %v; want 4222 with JetStream", source, opts.Port, opts.JetStream)
	}
}

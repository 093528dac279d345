package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quotaflow/quotaflow/checker/rules"
)

// TestImportEnvoyCommand converts a configuration of envoyproxy/ratelimit's form into a rules
// file that loads, and refuses bad input naming the file, the line and the field.
func TestImportEnvoyCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	conf := filepath.Join(dir, "config.yaml")
	os.WriteFile(conf, []byte("domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n"), 0o644)
	out := filepath.Join(dir, "rules.yaml")
	stdout, stderr, code := runCmd(context.Background(), []string{"rules", "import-envoy", dir, "--out", out}, nil)
	if code != 0 || !strings.Contains(stdout, "wrote "+out+": 1 rules") {
		t.Fatalf("exit %d, stdout %q stderr %q", code, stdout, stderr)
	}
	set, err := rules.Load(out)
	if err != nil {
		t.Fatalf("loading the converted rules: %v", err)
	}
	if r, _ := set.MatchDescriptor(set.DefaultTier(), "/edge", []rules.Entry{{Key: "remote_address", Value: "192.0.2.1"}}); r == nil || r.Limit != 10 || !r.CountDenied {
		t.Errorf("converted rule %+v, want 10 per second, counted", r)
	}
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("domain: edge2\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"), 0o644)
	for _, tt := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"rules", "import-envoy", bad}, 1, bad + ": line 4: descriptors[0].rate_limit.unit: invalid rate limit unit \"fortnight\""},
		{[]string{"rules", "import-envoy"}, 2, "want one or more configuration files or directories"},
		{[]string{"rules", "import-envoy", filepath.Join(dir, "missing")}, 1, "no such file"},
	} {
		_, stderr, code := runCmd(context.Background(), tt.args, nil)
		if code != tt.code || !strings.Contains(stderr, tt.want) {
			t.Errorf("quotaflow %v: exit %d, stderr %q; want %d and %q", tt.args, code, stderr, tt.code, tt.want)
		}
	}
}

// TestDevRulesCarryTheEnvoyExample: deploy/dev/rules.yaml carries deploy/envoy/ratelimit's
// configuration as import-envoy converts it, rule for rule.
func TestDevRulesCarryTheEnvoyExample(t *testing.T) {
	t.Parallel()
	doc, err := rules.ImportEnvoy("../../deploy/envoy/ratelimit")
	if err != nil {
		t.Fatal(err)
	}
	dev, _, err := rules.LoadFile("../../deploy/dev/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var carried []rules.DocRule
	for _, r := range dev.Rules {
		if r.Endpoint == "/edge" {
			carried = append(carried, r)
		}
	}
	if got, want := fmt.Sprintf("%+v", carried), fmt.Sprintf("%+v", doc.Rules); got != want {
		t.Errorf("deploy/dev/rules.yaml's /edge rules:\n%s\nwant import-envoy's:\n%s", got, want)
	}
}

package layering

import (
	"bufio"
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/quotaflow/quotaflow/"

// The floors, from the ground up, as docs/architecture.md draws them.
const (
	floorLibrary  = iota // internal/* (not app, testbed), proto/*: libraries
	floorModel           // checker/rules, schema: the rule model and the ClickHouse schema
	floorService         // checker, aggregator, publisher and their sub-packages
	floorAssembly        // internal/app/*: assembly and the read side
	floorBinary          // cmd/*
	floorTests           // internal/testbed/*: test servers, beside the floors
)

var floorNames = [...]string{"library", "model", "service", "assembly", "binary", "test server"}

// floor is the floor of package path p (relative to the module).
func floor(p string) int {
	switch {
	case strings.HasPrefix(p, "internal/testbed/"):
		return floorTests
	case strings.HasPrefix(p, "internal/app/"):
		return floorAssembly
	case strings.HasPrefix(p, "cmd/"), strings.HasPrefix(p, "deploy/"):
		return floorBinary
	case p == "checker/rules", p == "schema":
		return floorModel
	case p == "checker", strings.HasPrefix(p, "checker/"), p == "aggregator", strings.HasPrefix(p, "aggregator/"), p == "publisher":
		return floorService
	}
	return floorLibrary
}

// imports lists the module's packages with their production imports of the module, by go list.
func imports(t *testing.T, format string) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", format, module+"...")
	cmd.Dir = "../../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		pkgs[strings.TrimPrefix(fields[0], module)] = fields[1:]
	}
	if len(pkgs) < 40 {
		t.Fatalf("go list found %d packages; the module has far more", len(pkgs))
	}
	return pkgs
}

// TestFloors: no production import runs up a floor, and only tests import a test server.
func TestFloors(t *testing.T) {
	t.Parallel()
	for p, imps := range imports(t, "{{.ImportPath}} {{join .Imports \" \"}}") {
		f := floor(p)
		for _, imp := range imps {
			if !strings.HasPrefix(imp, module) {
				continue
			}
			imp = strings.TrimPrefix(imp, module)
			g := floor(imp)
			switch {
			case g == floorTests && f != floorTests:
				t.Errorf("%s (%s) imports the test server %s", p, floorNames[f], imp)
			case g > f && g != floorTests:
				t.Errorf("%s (%s floor) imports %s, a floor above (%s)", p, floorNames[f], imp, floorNames[g])
			case f == floorTests && g == floorBinary:
				t.Errorf("%s (a test server) imports the binary %s", p, imp)
			}
		}
	}
}

// TestModelLinksNoStore: the rule model, the aggregator and the events contract link neither
// the bucket store nor a Redis client: only the checker knows both rules and buckets.
func TestModelLinksNoStore(t *testing.T) {
	t.Parallel()
	deps := imports(t, "{{.ImportPath}} {{join .Deps \" \"}}")
	for _, p := range []string{"checker/rules", "aggregator", "aggregator/events", "schema"} {
		d, ok := deps[p]
		if !ok {
			t.Fatalf("no package %s", p)
		}
		for _, dep := range d {
			if dep == module+"internal/bucket" || strings.HasPrefix(dep, "github.com/redis/") {
				t.Errorf("%s links %s", p, dep)
			}
		}
	}
}

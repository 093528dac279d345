package instance

import (
	"runtime/debug"
	"testing"
)

// TestVersion: a release names its version, a checkout its commit, the commit's time and
// whether the tree was modified, and a build without VCS information says so.
func TestVersion(t *testing.T) {
	t.Parallel()
	rev := debug.BuildSetting{Key: "vcs.revision", Value: "51c49e6d2b0a8f3e4c5d6e7f8a9b0c1d2e3f4a5b"}
	at := debug.BuildSetting{Key: "vcs.time", Value: "2026-11-25T09:28:07Z"}
	tests := []struct {
		name string
		bi   *debug.BuildInfo
		want string
	}{
		{"released", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.4.0"}}, "quotaflow v1.4.0 (go1.26.0)"},
		{"modified checkout", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"},
			Settings: []debug.BuildSetting{rev, at, {Key: "vcs.modified", Value: "true"}}},
			"quotaflow (devel) (rev 51c49e6d2b0a of 2026-11-25T09:28:07Z, modified; go1.26.0)"},
		{"clean checkout", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v0.0.0-20261125092807-51c49e6d2b0a"},
			Settings: []debug.BuildSetting{rev, at, {Key: "vcs.modified", Value: "false"}}},
			"quotaflow (devel) (rev 51c49e6d2b0a of 2026-11-25T09:28:07Z; go1.26.0)"},
		{"modified, as go build names it", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v0.0.0-20261125092807-51c49e6d2b0a+dirty"},
			Settings: []debug.BuildSetting{rev, at, {Key: "vcs.modified", Value: "true"}}},
			"quotaflow (devel) (rev 51c49e6d2b0a of 2026-11-25T09:28:07Z, modified; go1.26.0)"},
		{"after a tag", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.4.1-0.20261125092807-51c49e6d2b0a"},
			Settings: []debug.BuildSetting{rev, at}}, "quotaflow (devel) (rev 51c49e6d2b0a of 2026-11-25T09:28:07Z; go1.26.0)"},
		{"no VCS", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}},
			"quotaflow (devel) (no VCS information: built with -buildvcs=false or outside git; go1.26.0)"},
		{"no build info", nil, "quotaflow (unknown version: built without module information)"},
	}
	for _, tt := range tests {
		if got := Version(tt.bi); got != tt.want {
			t.Errorf("%s: Version = %q, want %q", tt.name, got, tt.want)
		}
	}
}

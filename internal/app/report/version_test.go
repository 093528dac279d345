package report

import (
	"runtime/debug"
	"testing"
)

// TestVersion: a release names its version, a checkout its commit and whether it was
// modified.
func TestVersion(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		bi   *debug.BuildInfo
		want string
	}{
		{"released", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.4.0"}}, "quotaflow v1.4.0 (go1.26.0)"},
		{"checkout", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "51c49e6d2b0a8f3e4c5d6e7f8a9b0c1d2e3f4a5b"}, {Key: "vcs.modified", Value: "true"}}},
			"quotaflow (devel) (rev 51c49e6d2b0a, modified; go1.26.0)"},
		{"clean checkout", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.4.1-0.20261125092807-51c49e6d2b0a"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "51c49e6d2b0a8f3e"}, {Key: "vcs.modified", Value: "false"}}},
			"quotaflow v1.4.1-0.20261125092807-51c49e6d2b0a (rev 51c49e6d2b0a; go1.26.0)"},
		{"no build info", nil, "quotaflow (unknown version: built without module information)"},
	}
	for _, tt := range tests {
		if got := Version(tt.bi); got != tt.want {
			t.Errorf("%s: Version = %q, want %q", tt.name, got, tt.want)
		}
	}
}

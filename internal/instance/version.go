package instance

import (
	"regexp"
	"runtime/debug"
	"strings"
)

// Build is this binary's Version, as `quotaflow --version`, the health reports and `quotaflow
// status` name it.
func Build() string {
	bi, _ := debug.ReadBuildInfo()
	return Version(bi)
}

// pseudoVersion is the version the go command gives a checkout's main module (v0.0.0-
// 20261129103115-9722342bca92): the commit and its time, which Version says plainly instead.
var pseudoVersion = regexp.MustCompile(`-(0\.)?\d{14}-[0-9a-f]{12}(\+dirty)?$`)

// Version describes a build: "quotaflow v1.2.0 (go1.26.0)" for a release (go install
// ...@v1.2.0); "quotaflow (devel) (rev 0123abcd4567 of 2026-11-29T10:31:15Z, modified;
// go1.26.0)" for a checkout, naming the commit, its time and whether the tree differed.
func Version(bi *debug.BuildInfo) string {
	if bi == nil {
		return "quotaflow (unknown version: built without module information)"
	}
	v := bi.Main.Version
	if v == "" || pseudoVersion.MatchString(v) {
		v = "(devel)"
	}
	var rev, at, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value[:min(12, len(s.Value))]
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	var about []string
	switch {
	case rev != "" && at != "":
		about = append(about, "rev "+rev+" of "+at)
	case rev != "":
		about = append(about, "rev "+rev)
	case v == "(devel)":
		about = append(about, "no VCS information: built with -buildvcs=false or outside git")
	}
	if modified == "true" {
		about = append(about, "modified")
	}
	if len(about) == 0 {
		return "quotaflow " + v + " (" + bi.GoVersion + ")"
	}
	return "quotaflow " + v + " (" + strings.Join(about, ", ") + "; " + bi.GoVersion + ")"
}

package report

import "runtime/debug"

// Version describes a build: "quotaflow v1.2.0 (rev 0123abcd4567, modified; go1.26.0)". A
// binary built by go install ...@v1.2.0 carries its module version; one built in a checkout
// says (devel) and names the commit it was built from.
func Version(bi *debug.BuildInfo) string {
	if bi == nil {
		return "quotaflow (unknown version: built without module information)"
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	out := "quotaflow " + v + " ("
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		out += "rev " + rev
		if modified == "true" {
			out += ", modified"
		}
		out += "; "
	}
	return out + bi.GoVersion + ")"
}

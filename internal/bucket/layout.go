package bucket

import "fmt"

// Layout is how the check script writes a bucket's state in Redis (StoreConfig.Layout). Every
// layout reads the keys of every other, and of the versions before layouts existed, so a
// bucket keeps its count whichever layout wrote it last; a write converts the key to the
// Store's layout. The fields of LayoutShared are read by it and LayoutMixed only. Only the
// algorithms whose module says so have a compact key (fixed_window, token_bucket; gcra's
// compact form is readable by every version and is written in both) or a field (those and
// gcra).
type Layout uint8

// The layouts. Their order is that of the scripts (checkScripts); LayoutPrevious is the zero
// value, so that a Store nobody configured writes what a checker of the previous version reads.
const (
	// LayoutPrevious writes what the versions before layouts wrote (hashes), which they can
	// read: the layout of a rolling upgrade, while such a version may still run.
	LayoutPrevious Layout = iota
	// LayoutCompact writes the smaller states of lua/<algorithm>.lua's headers, which a version
	// before layouts cannot read (it fails the check on a Redis WRONGTYPE error). It needs
	// Redis 7.0 or later (PEXPIRETIME).
	LayoutCompact
	// LayoutShared writes the buckets of fixed_window, gcra and token_bucket as fields of
	// hashes that many buckets share (lua/shared.lua), about half the memory of a key each,
	// and the others as LayoutCompact does. It reads the keys of the other layouts, moving a
	// bucket into its field at its next write. Only it and LayoutMixed read fields. It needs
	// Redis 7.0 or later.
	LayoutShared
	// LayoutMixed is the step between LayoutCompact and LayoutShared, either way: it writes
	// what LayoutCompact writes, but reads a bucket's field when its key is missing and writes
	// it there, so that checkers of it and of LayoutShared share every bucket (never one in a
	// field and a key at once). LayoutCompact does not read fields: a field read on every
	// missing key costs the check a call (docs/performance.md).
	LayoutMixed
	layouts // the number of layouts
)

var layoutNames = [layouts]string{LayoutPrevious: "previous", LayoutCompact: "compact", LayoutShared: "shared",
	LayoutMixed: "mixed"}

// fields reports whether l reads the fields of shared hashes (lua/shared.lua), whose names its
// calls then carry.
func (l Layout) fields() bool { return l == LayoutShared || l == LayoutMixed }

// String returns the layout's name as --bucket-layout takes it.
func (l Layout) String() string {
	if l < layouts {
		return layoutNames[l]
	}
	return fmt.Sprintf("layout(%d)", uint8(l))
}

// parseLayout returns the layout named s ("previous", "compact", "shared" or "mixed").
func parseLayout(s string) (Layout, error) {
	for l, name := range layoutNames {
		if name == s {
			return Layout(l), nil
		}
	}
	return 0, fmt.Errorf("unknown bucket layout %q (want previous, compact, shared or mixed)", s)
}

// MarshalText returns the layout's name, for flags and configuration files.
func (l Layout) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// UnmarshalText sets l to the layout named text (ParseLayout).
func (l *Layout) UnmarshalText(text []byte) error {
	v, err := parseLayout(string(text))
	if err != nil {
		return err
	}
	*l = v
	return nil
}

package bucket

import "fmt"

// Layout is how the check script writes a bucket's state in Redis (StoreConfig.Layout). Every
// layout reads the keys of every other, and of the versions before layouts existed, so a
// bucket keeps its count whichever layout wrote it last; a write converts the key to the
// Store's layout. The fields of LayoutShared are read by it and LayoutCompact only. Only the algorithms whose module says so have two layouts (fixed_window,
// token_bucket); gcra's compact form is readable by every version and is written in both.
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
	// bucket into its field at its next write. LayoutCompact reads fields too (when its key is
	// missing), so checkers of the two share every bucket during a switch either way;
	// LayoutPrevious and the versions before layouts do not. It needs Redis 7.0 or later.
	LayoutShared
	layouts // the number of layouts
)

var layoutNames = [layouts]string{LayoutPrevious: "previous", LayoutCompact: "compact", LayoutShared: "shared"}

// String returns the layout's name as --bucket-layout takes it.
func (l Layout) String() string {
	if l < layouts {
		return layoutNames[l]
	}
	return fmt.Sprintf("layout(%d)", uint8(l))
}

// ParseLayout returns the layout named s ("previous", "compact" or "shared").
func ParseLayout(s string) (Layout, error) {
	for l, name := range layoutNames {
		if name == s {
			return Layout(l), nil
		}
	}
	return 0, fmt.Errorf("unknown bucket layout %q (want previous, compact or shared)", s)
}

// MarshalText returns the layout's name, for flags and configuration files.
func (l Layout) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// UnmarshalText sets l to the layout named text (ParseLayout).
func (l *Layout) UnmarshalText(text []byte) error {
	v, err := ParseLayout(string(text))
	if err != nil {
		return err
	}
	*l = v
	return nil
}

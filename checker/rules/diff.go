package rules

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Changes is what replacing one document by another adds, changes and removes, each item named
// "<kind> <id>": "rule orders", "tier gold", "user 42", "api_key k1", "exemption acme"; and the
// document's own settings, "default_tier", "warnings" and "policies", which are changed (a
// setting left out returns to its default), never removed.
type Changes struct {
	Added   []string `json:"added"`
	Changed []string `json:"changed"`
	Removed []string `json:"removed"`
}

// Diff returns what replacing old (nil: an empty store) by next changes, each list in the
// order of kinds above and then of ids. Users are compared as the documents hold them: a
// store's document with its users put back.
func Diff(old, next *Document) Changes {
	if old == nil {
		old = &Document{}
	}
	var c Changes
	items(&c, "rule", byID(old.Rules, func(r DocRule) string { return r.ID }), byID(next.Rules, func(r DocRule) string { return r.ID }))
	items(&c, "tier", old.Tiers, next.Tiers)
	items(&c, "user", old.Users, next.Users)
	items(&c, "api_key", old.APIKeys, next.APIKeys)
	items(&c, "exemption", byID(old.Exemptions, func(e DocExemption) string { return e.ID }), byID(next.Exemptions, func(e DocExemption) string { return e.ID }))
	for _, s := range []struct {
		name      string
		old, next any
	}{
		{"default_tier", old.DefaultTier, next.DefaultTier},
		{"warnings", old.Warnings, next.Warnings},
		{"policies", old.Policies, next.Policies},
	} {
		if !sameJSON(s.old, s.next) {
			c.Changed = append(c.Changed, s.name)
		}
	}
	return c
}

// Empty reports whether nothing changes.
func (c Changes) Empty() bool { return len(c.Added)+len(c.Changed)+len(c.Removed) == 0 }

// items adds the differences of one kind of keyed items.
func items[T any](c *Changes, kind string, old, next map[string]T) {
	for _, id := range slices.Sorted(maps.Keys(next)) {
		o, ok := old[id]
		switch {
		case !ok:
			c.Added = append(c.Added, kind+" "+id)
		case !sameJSON(o, next[id]):
			c.Changed = append(c.Changed, kind+" "+id)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(old)) {
		if _, ok := next[id]; !ok {
			c.Removed = append(c.Removed, kind+" "+id)
		}
	}
}

func byID[T any](list []T, id func(T) string) map[string]T {
	m := make(map[string]T, len(list))
	for _, v := range list {
		m[id(v)] = v
	}
	return m
}

// sameJSON reports whether a and b are written the same: the store keeps documents as JSON.
func sameJSON(a, b any) bool {
	ja, erra := json.Marshal(a)
	jb, errb := json.Marshal(b)
	return erra == nil && errb == nil && string(ja) == string(jb)
}

// ApplyOptions say how a document replaces a stored one. The zero value refuses to remove
// anything.
type ApplyOptions struct {
	// Prune lets the apply remove what the document lacks (rules, tiers, users, API keys,
	// exemptions the store holds); without it such an apply is refused with a *RemovalError.
	Prune bool
	// DryRun computes the changes and writes nothing.
	DryRun bool
}

// RemovalError is an apply refused because the document lacks items the store holds (made
// through the admin API, say): removing them takes an explicit prune.
type RemovalError struct {
	// Removed names each item the apply would remove, as Changes does.
	Removed []string
}

func (e *RemovalError) Error() string {
	return fmt.Sprintf("refused, nothing was changed: the document lacks %d item(s) the rule store holds (%s); add them to it, or apply with prune to remove them",
		len(e.Removed), strings.Join(e.Removed, ", "))
}

package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/quotaflow/quotaflow/internal/urlpath"
	"github.com/quotaflow/quotaflow/internal/yamldoc"
)

// envoyproxy/ratelimit's configuration, imported (ImportEnvoy): each file is one domain's tree
// of descriptors, each descriptor a key, an optional value, and an optional rate_limit; a
// descriptor with a rate limit becomes one descriptor rule at endpoint "/" + domain (what the
// RLS transport checks that domain's descriptors at), matching the path of keys and values
// from the tree's root to it. The reference's semantics come along: a fixed window counting
// every hit (count_denied), its windows of whole units from the epoch (a month is 30 days,
// a year 365), replaces, unlimited and shadow_mode.

// envoyFile is one configuration file of the reference service.
type envoyFile struct {
	Domain      string            `yaml:"domain"`
	Descriptors []envoyDescriptor `yaml:"descriptors"`
}

type envoyDescriptor struct {
	Key            string            `yaml:"key"`
	Value          string            `yaml:"value"`
	RateLimit      *envoyRateLimit   `yaml:"rate_limit"`
	Descriptors    []envoyDescriptor `yaml:"descriptors"`
	ShadowMode     Scalar            `yaml:"shadow_mode"`
	QuotaMode      Scalar            `yaml:"quota_mode"`
	DetailedMetric Scalar            `yaml:"detailed_metric"`
	ValueToMetric  Scalar            `yaml:"value_to_metric"`
	ShareThreshold Scalar            `yaml:"share_threshold"`
}

type envoyRateLimit struct {
	RequestsPerUnit Scalar `yaml:"requests_per_unit"`
	Unit            string `yaml:"unit"`
	// UnitMultiplier is newer releases' (and quotaflow's): a window of that many units.
	UnitMultiplier Scalar         `yaml:"unit_multiplier"`
	Unlimited      Scalar         `yaml:"unlimited"`
	Name           string         `yaml:"name"`
	Replaces       []envoyReplace `yaml:"replaces"`
}

type envoyReplace struct {
	Name string `yaml:"name"`
}

// envoyUnitWindows are the reference's units as windows (its UnitToDivider).
var envoyUnitWindows = map[string]time.Duration{
	"second": time.Second,
	"minute": time.Minute,
	"hour":   time.Hour,
	"day":    24 * time.Hour,
	"week":   7 * 24 * time.Hour,
	"month":  30 * 24 * time.Hour,
	"year":   365 * 24 * time.Hour,
}

// ImportEnvoy reads envoyproxy/ratelimit configuration files (paths of files, or of
// directories whose *.yaml and *.yml files are read, as the reference reads its runtime
// directory) and returns them as a rules Document, which Compile validates like any other. Its
// errors name the file, the line and the field ("config.yaml: line 12: descriptors[0]
// .rate_limit.unit: ...").
func ImportEnvoy(paths ...string) (*Document, error) {
	files, err := envoyFiles(paths)
	if err != nil {
		return nil, err
	}
	doc := &Document{}
	domains := map[string]string{} // a domain's endpoint → the file that declared it
	ids := map[string]bool{}
	var problems []string
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("reading envoy configuration: %w", err)
		}
		var f envoyFile
		lines, err := yamldoc.Decode(data, &f)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", name, err))
			continue
		}
		im := envoyImport{file: name, lines: lines, ids: ids}
		switch {
		case f.Domain == "":
			im.add("domain", "required: a configuration cannot have an empty domain")
		default:
			// The endpoint the RLS transport checks the domain's descriptors at: "/" + domain
			// in normal form (letters folded to lower case, so "Shop" and "shop" are one).
			ep, err := urlpath.Normalize("/" + f.Domain)
			switch {
			case err != nil:
				im.add("domain", "%q cannot name an endpoint: %v", f.Domain, err)
			case domains[ep] != "":
				im.add("domain", "%q is declared by %s too (the reference refuses a domain declared twice; quotaflow folds case)", f.Domain, domains[ep])
			default:
				domains[ep], im.endpoint = name, ep
				im.descriptors(doc, f.Domain, "descriptors", nil, f.Descriptors)
			}
		}
		problems = append(problems, im.problems...)
	}
	if len(problems) > 0 {
		if len(problems) == 1 {
			return nil, fmt.Errorf("envoy configuration: %s", problems[0])
		}
		return nil, fmt.Errorf("envoy configuration: %d problems:\n  %s", len(problems), strings.Join(problems, "\n  "))
	}
	if len(doc.Rules) == 0 {
		return nil, fmt.Errorf("envoy configuration: no descriptor of %s has a rate_limit", strings.Join(files, ", "))
	}
	return doc, nil
}

// envoyFiles lists the files of paths, a directory's in name order.
func envoyFiles(paths []string) ([]string, error) {
	if len(paths) == 0 {
		return nil, fmt.Errorf("envoy configuration: no file or directory given")
	}
	var files []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("envoy configuration: %w", err)
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		var found []string
		for _, glob := range []string{"*.yaml", "*.yml"} {
			m, _ := filepath.Glob(filepath.Join(p, glob)) // only ErrBadPattern, not with these
			found = append(found, m...)
		}
		if len(found) == 0 {
			return nil, fmt.Errorf("envoy configuration: %s has no *.yaml or *.yml file", p)
		}
		slices.Sort(found)
		files = append(files, found...)
	}
	return files, nil
}

// envoyImport imports one file.
type envoyImport struct {
	file     string
	lines    yamldoc.Lines
	endpoint string
	ids      map[string]bool
	problems []string
}

func (im *envoyImport) add(path, format string, args ...any) {
	where := im.file
	if l, ok := im.lines[path]; ok {
		where += ": line " + strconv.Itoa(l)
	}
	im.problems = append(im.problems, fmt.Sprintf("%s: %s: %s", where, path, fmt.Sprintf(format, args...)))
}

// descriptors imports the descriptors at path (under the entries of parent) into doc.
func (im *envoyImport) descriptors(doc *Document, domain, path string, parent []DocEntry, ds []envoyDescriptor) {
	seen := map[Entry]bool{}
	for i, d := range ds {
		at := fmt.Sprintf("%s[%d]", path, i)
		if d.Key == "" {
			im.add(at+".key", "required: a descriptor cannot have an empty key")
			continue
		}
		e := DocEntry{Key: d.Key, Value: d.Value}
		if seen[Entry{d.Key, d.Value}] {
			im.add(at, "duplicate descriptor %s under the same parent", Entry{d.Key, d.Value})
			continue
		}
		seen[Entry{d.Key, d.Value}] = true
		if b, _ := strconv.ParseBool(string(d.ShareThreshold)); b {
			if !strings.HasSuffix(d.Value, "*") {
				im.add(at+".share_threshold", "can only be used with wildcard values (ending with '*'), got %q", d.Value)
			}
			e.Shared = "true"
		}
		entries := append(slices.Clip(parent), e)
		if len(entries) > MaxDescriptorEntries {
			im.add(at, "deeper than %d entries", MaxDescriptorEntries)
			continue
		}
		if d.RateLimit != nil {
			if r, ok := im.rule(domain, at, entries, &d); ok {
				doc.Rules = append(doc.Rules, r)
			}
		}
		im.descriptors(doc, domain, at+".descriptors", entries, d.Descriptors)
	}
}

// rule is the descriptor rule of descriptor d at path at.
func (im *envoyImport) rule(domain, at string, entries []DocEntry, d *envoyDescriptor) (DocRule, bool) {
	rl := d.RateLimit
	n := len(im.problems)
	r := DocRule{ID: im.id(domain, entries, rl.Name), Dimension: DimensionDescriptor.String(), Endpoint: im.endpoint,
		Descriptor: entries, Name: rl.Name, Shadow: d.ShadowMode}
	if b, _ := strconv.ParseBool(string(d.QuotaMode)); b && string(d.ShadowMode) != "true" {
		// (With shadow_mode too, the reference answers as shadow mode: its shadow comes first.)
		r.QuotaMode = "true"
	}
	unlimited, err := strconv.ParseBool(string(rl.Unlimited))
	if rl.Unlimited != "" && err != nil {
		im.add(at+".rate_limit.unlimited", "want true or false, got %q", rl.Unlimited)
	}
	for j, rep := range rl.Replaces {
		switch {
		case rep.Name == "":
			im.add(fmt.Sprintf("%s.rate_limit.replaces[%d].name", at, j), "required: should not have an empty replaces entry")
		case rep.Name == rl.Name:
			im.add(fmt.Sprintf("%s.rate_limit.replaces[%d].name", at, j), "%q is this limit's own name", rep.Name)
		}
		r.Replaces = append(r.Replaces, rep.Name)
	}
	w, unitOK := envoyUnitWindows[strings.ToLower(rl.Unit)]
	switch {
	case unlimited && rl.Unit != "":
		im.add(at+".rate_limit.unit", "an unlimited limit has no unit")
	case unlimited:
		r.Unlimited = "true"
		return r, len(im.problems) == n
	case !unitOK:
		im.add(at+".rate_limit.unit", "invalid rate limit unit %q (want second, minute, hour, day, week, month or year)", rl.Unit)
	}
	if rl.UnitMultiplier != "" {
		m, err := strconv.ParseInt(strings.TrimSpace(string(rl.UnitMultiplier)), 10, 64)
		if err != nil || m < 1 || time.Duration(m)*w > MaxWindow {
			im.add(at+".rate_limit.unit_multiplier", "want a whole number from 1 making a window of at most %s, got %q", MaxWindow, rl.UnitMultiplier)
		}
		w *= time.Duration(max(m, 1))
	}
	limit, err := strconv.ParseUint(strings.TrimSpace(string(rl.RequestsPerUnit)), 10, 32)
	if err != nil && rl.RequestsPerUnit != "" {
		im.add(at+".rate_limit.requests_per_unit", "want a whole number from 0 to %d, got %q", uint32(1<<32-1), rl.RequestsPerUnit)
	}
	if limit > MaxLimit {
		im.add(at+".rate_limit.requests_per_unit", "%d is more than quotaflow's largest limit, %d", limit, MaxLimit)
	}
	r.Algorithm, r.Limit, r.Window, r.CountDenied = "fixed_window", Scalar(strconv.FormatUint(limit, 10)), Scalar(envoyWindow(w)), "true"
	return r, len(im.problems) == n
}

var notIDByte = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// id is a rule id for a descriptor: its limit's name when that is an id, else its domain and
// entries written as the reference names its stats (domain.key_value.key), made an id; an id
// already taken, or too long, gets a hash of the entries.
func (im *envoyImport) id(domain string, entries []DocEntry, name string) string {
	if nameRE.MatchString(name) && !im.ids[name] {
		im.ids[name] = true
		return name
	}
	parts := []string{domain}
	for _, e := range entries {
		p := e.Key
		if e.Value != "" {
			p += "_" + e.Value
		}
		parts = append(parts, p)
	}
	full := strings.Join(parts, ".")
	id := strings.TrimLeft(notIDByte.ReplaceAllString(full, "-"), "_.-")
	if id == "" || len(id) > 64 || im.ids[id] {
		sum := sha256.Sum256([]byte(full))
		id = strings.TrimRight(id[:min(len(id), 55)], "_.-") + "-" + hex.EncodeToString(sum[:4])
		id = strings.TrimLeft(id, "-")
	}
	im.ids[id] = true
	return id
}

// envoyWindow writes w as a rules file does: 1s, 1m, 1h, 720h.
func envoyWindow(w time.Duration) string {
	switch {
	case w%time.Hour == 0:
		return strconv.FormatInt(int64(w/time.Hour), 10) + "h"
	case w%time.Minute == 0:
		return strconv.FormatInt(int64(w/time.Minute), 10) + "m"
	}
	return strconv.FormatInt(int64(w/time.Second), 10) + "s"
}

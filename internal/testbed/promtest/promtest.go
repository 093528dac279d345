// Package promtest checks the PromQL of quotaflow's alerts and dashboards: promtool (Debian's
// prometheus package, installed by deploy/dev/install-deps.sh) for the syntax and the rules'
// unit tests, and a catalog of the metric families quotaflow exports
// (deploy/prometheus/metrics.txt, kept equal to a real scrape by cmd/quotaflow's
// TestMetricsCatalog) for the names and labels each expression selects.
package promtest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// Promtool returns the path of promtool, failing the test when it is not installed.
func Promtool(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool is not installed (`make test` installs Debian's prometheus package, see deploy/dev/install-deps.sh): %v", err)
	}
	return path
}

// Family is a metric family of the catalog.
type Family struct {
	Name, Type string
	// Labels are the labels of its samples; Prometheus adds job and instance when it scrapes,
	// and a histogram's _bucket series have le.
	Labels []string
}

// Catalog is the metric families a Prometheus server scraping quotaflow (and the exporters
// its alerts name) holds, by name.
type Catalog map[string]Family

// LoadCatalog reads catalog files: a family per line, its name, type and labels separated by
// spaces; # starts a comment.
func LoadCatalog(paths ...string) (Catalog, error) {
	c := Catalog{}
	for _, path := range paths {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		for n := 1; sc.Scan(); n++ {
			l := strings.TrimSpace(sc.Text())
			if l == "" || strings.HasPrefix(l, "#") {
				continue
			}
			fs := strings.Fields(l)
			if len(fs) < 2 {
				f.Close()
				return nil, fmt.Errorf("%s:%d: %q: want a name, a type and labels", path, n, l)
			}
			c[fs[0]] = Family{Name: fs[0], Type: fs[1], Labels: fs[2:]}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// series returns the family of a series name (a histogram's name_bucket, name_sum and
// name_count are its family's) and whether le is one of its labels.
func (c Catalog) series(name string) (Family, bool, bool) {
	if f, ok := c[name]; ok && f.Type != "histogram" && f.Type != "summary" {
		return f, false, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if f, ok := c[base]; ok && (f.Type == "histogram" || f.Type == "summary" && suffix != "_bucket") {
				return f, suffix == "_bucket", true
			}
		}
	}
	return Family{}, false, false
}

// CheckSeries returns what is wrong with a series of name and label names: a name no family
// has, or a label its family lacks.
func (c Catalog) CheckSeries(name string, labels []string) []string {
	f, le, ok := c.series(name)
	if !ok {
		return []string{fmt.Sprintf("%s: no such metric in the catalog", name)}
	}
	var errs []string
	for _, l := range labels {
		if l == "__name__" || l == "job" || l == "instance" || l == "le" && le || slices.Contains(f.Labels, l) {
			continue
		}
		errs = append(errs, fmt.Sprintf("%s: no label %q (it has %v, job and instance)", name, l, f.Labels))
	}
	return errs
}

// CheckExpr returns what is wrong with the selectors of a PromQL expression (CheckSeries of
// each), or why they could not be read.
func (c Catalog) CheckExpr(expr string) []string {
	sels, err := Selectors(expr)
	if err != nil {
		return []string{err.Error()}
	}
	if len(sels) == 0 {
		return []string{"selects no metric"}
	}
	var errs []string
	for _, s := range sels {
		errs = append(errs, c.CheckSeries(s.Name, s.Labels)...)
	}
	return errs
}

// Selector is a vector selector of an expression: the metric's name and the label names its
// matchers name.
type Selector struct {
	Name   string
	Labels []string
}

// keywords are PromQL's words that are no metric: operators, modifiers, grouping.
var keywords = map[string]bool{
	"and": true, "or": true, "unless": true, "atan2": true, "bool": true, "offset": true, "inf": true, "nan": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
}

// grouping are the keywords followed by a parenthesized list of label names.
var grouping = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

// Selectors returns the vector selectors of a PromQL expression. It reads PromQL's tokens:
// an identifier is a metric unless it calls a function or aggregates (a '(', by or without
// follows), is a keyword, or names
// labels (in a matcher's braces or a by (...) list); range and subquery brackets and strings
// are skipped. Grafana's variables ($__rate_interval) may stand in durations and strings.
func Selectors(expr string) ([]Selector, error) {
	toks, err := tokenize(expr)
	if err != nil {
		return nil, err
	}
	var out []Selector
	for i := 0; i < len(toks); i++ {
		tk := toks[i]
		switch {
		case tk.kind == ident && grouping[tk.text]:
			if i+1 < len(toks) && toks[i+1].text == "(" {
				j := i + 2
				for j < len(toks) && toks[j].text != ")" {
					j++
				}
				i = j
			}
		case tk.kind == ident && keywords[tk.text]:
		case tk.kind == ident && i+1 < len(toks) && (toks[i+1].text == "(" || toks[i+1].text == "by" || toks[i+1].text == "without"):
			// a function, or an aggregation (sum by (le) (...))
		case tk.kind == ident || tk.text == "{":
			sel := Selector{}
			if tk.kind == ident {
				sel.Name = tk.text
				i++
			}
			if i < len(toks) && toks[i].text == "{" {
				j := i + 1
				for ; j < len(toks) && toks[j].text != "}"; j++ {
					if toks[j].kind == ident && j+1 < len(toks) && toks[j+1].kind == op {
						sel.Labels = append(sel.Labels, toks[j].text)
						if toks[j].text == "__name__" && j+2 < len(toks) && toks[j+2].kind == str && toks[j+1].text == "=" {
							sel.Name = toks[j+2].text
						}
					}
				}
				if j == len(toks) {
					return nil, fmt.Errorf("%q: unclosed {", expr)
				}
				i = j
			} else {
				i--
			}
			if sel.Name == "" {
				return nil, fmt.Errorf("%q: a selector without a metric name", expr)
			}
			out = append(out, sel)
		}
	}
	return out, nil
}

type tokenKind int

const (
	ident tokenKind = iota
	str
	op   // a matcher's operator: = != =~ !~
	punc // anything else
)

type token struct {
	kind tokenKind
	text string // a string's value, unquoted
}

// tokenize splits a PromQL expression into identifiers, strings, matcher operators and other
// punctuation; numbers and the contents of [...] (ranges, subqueries) are dropped.
func tokenize(expr string) ([]token, error) {
	var toks []token
	rs := []rune(expr)
	braces := 0 // inside a selector's matchers
	for i := 0; i < len(rs); {
		r := rs[i]
		switch {
		case unicode.IsSpace(r):
			i++
		case r == '#': // a comment, to the end of the line
			for i < len(rs) && rs[i] != '\n' {
				i++
			}
		case r == '"' || r == '\'' || r == '`':
			j := i + 1
			var b strings.Builder
			for ; j < len(rs) && rs[j] != r; j++ {
				if rs[j] == '\\' && r != '`' && j+1 < len(rs) {
					j++
				}
				b.WriteRune(rs[j])
			}
			if j == len(rs) {
				return nil, fmt.Errorf("%q: unterminated string", expr)
			}
			toks = append(toks, token{str, b.String()})
			i = j + 1
		case r == '[':
			depth := 0
			for ; i < len(rs); i++ {
				if rs[i] == '[' {
					depth++
				} else if rs[i] == ']' {
					if depth--; depth == 0 {
						break
					}
				}
			}
			if i == len(rs) {
				return nil, fmt.Errorf("%q: unclosed [", expr)
			}
			i++
		case braces > 0 && (r == '=' || r == '!'):
			j := i + 1
			if j < len(rs) && (rs[j] == '=' || rs[j] == '~') {
				j++
			}
			toks = append(toks, token{op, string(rs[i:j])})
			i = j
		case r == '_' || r == ':' || unicode.IsLetter(r):
			j := i
			for j < len(rs) && (rs[j] == '_' || rs[j] == ':' || unicode.IsLetter(rs[j]) || unicode.IsDigit(rs[j])) {
				j++
			}
			toks = append(toks, token{ident, string(rs[i:j])})
			i = j
		case unicode.IsDigit(r) || r == '.': // a number or a duration (offset 5m, 1h30m)
			for i < len(rs) && (unicode.IsDigit(rs[i]) || unicode.IsLetter(rs[i]) || rs[i] == '.' ||
				(rs[i] == '+' || rs[i] == '-') && (rs[i-1] == 'e' || rs[i-1] == 'E')) {
				i++
			}
		case r == '$': // a Grafana variable outside a string: $__interval, ${var}
			i++
			for i < len(rs) && (rs[i] == '_' || rs[i] == '{' || rs[i] == '}' || unicode.IsLetter(rs[i]) || unicode.IsDigit(rs[i])) {
				i++
			}
		default:
			if r == '{' {
				braces++
			} else if r == '}' {
				braces--
			}
			toks = append(toks, token{punc, string(r)})
			i++
		}
	}
	return toks, nil
}

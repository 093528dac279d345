package rules

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/quotaflow/quotaflow/internal/yamldoc"
)

// problems collects validation errors so that a document reports all of them at once, each
// with the line it was written on when the document came from text.
type problems struct {
	lines yamldoc.Lines // Document.lines
	list  []problem
}

type problem struct {
	line int // 0: unknown
	text string
}

// add records a problem of where: "rules[0]", `rule "orders" (rules[0])`, `users["42"]`…, on
// the line of the field it names, or else of where's part of the document.
func (p *problems) add(where, format string, args ...any) {
	text := fmt.Sprintf(format, args...)
	field, _, _ := strings.Cut(text, ":")
	p.addAt(p.line(where, field), where, "%s", text)
}

// addAt records a problem on a line known to the caller; where may be empty when the line
// says enough.
func (p *problems) addAt(line int, where, format string, args ...any) {
	text := fmt.Sprintf(format, args...)
	if where != "" {
		text = where + ": " + text
	}
	p.list = append(p.list, problem{line, text})
}

// line finds the line of field of where: where is a path ("default_tier", `users["42"]`,
// "policies.penalty") or names one in parentheses (`rule "orders" (rules[0]): warning` is
// rules[0].warning); the line of where itself when the field's is not known.
func (p *problems) line(where, field string) int {
	path, inner := where, ""
	if i := strings.LastIndexByte(where, '('); i >= 0 {
		if j := strings.IndexByte(where[i:], ')'); j > 0 {
			inner = where[i+1 : i+j]
			path = inner + strings.ReplaceAll(where[i+j+1:], ": ", ".")
		}
	}
	for _, k := range []string{path + "." + field, path, inner} {
		if n, ok := p.lines[k]; ok {
			return n
		}
	}
	return 0
}

func (p *problems) err() error {
	if len(p.list) == 0 {
		return nil
	}
	slices.SortFunc(p.list, func(a, b problem) int {
		return cmp.Or(cmp.Compare(a.line, b.line), cmp.Compare(a.text, b.text))
	})
	out := make([]string, 0, len(p.list))
	for i, pr := range p.list {
		if i > 0 && pr == p.list[i-1] {
			continue // one problem reached twice (two tiers, two paths): said once
		}
		if pr.line > 0 {
			pr.text = fmt.Sprintf("line %d: %s", pr.line, pr.text)
		}
		out = append(out, pr.text)
	}
	return &ValidationError{Problems: out}
}

// ValidationError lists every problem found in a rules document.
type ValidationError struct {
	Problems []string
}

// Error implements error.
func (e *ValidationError) Error() string {
	if len(e.Problems) == 1 {
		return e.Problems[0]
	}
	return fmt.Sprintf("%d problems:\n  %s", len(e.Problems), strings.Join(e.Problems, "\n  "))
}

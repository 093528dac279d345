// Package yamldoc decodes the YAML files people write (the rules file, the callers file) with
// errors in their words: the line of the mistake, the unknown field with the one meant, what
// was expected where a value is of the wrong kind — never a Go type.
package yamldoc

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/quotaflow/quotaflow/internal/suggest"
)

// ErrEmpty is a document with nothing in it.
var ErrEmpty = errors.New("the document is empty")

// Lines maps the parts of a decoded document to the line they were written on, by path:
// "rules", "rules[0]", "rules[0].limit", `users["42"]`, `users["42"].tier`.
type Lines map[string]int

// Error is a document of the wrong shape: every problem, each "line N: …".
type Error struct {
	Problems []string
}

// Error implements error.
func (e *Error) Error() string {
	if len(e.Problems) == 1 {
		return e.Problems[0]
	}
	return fmt.Sprintf("%d problems:\n  %s", len(e.Problems), strings.Join(e.Problems, "\n  "))
}

// Decode decodes the first YAML (or JSON) document of data into v, a pointer to a struct,
// refusing fields v has no place for, and returns the line of each part. A syntax error is
// one error naming the line of the mistake; a document of the wrong shape an *Error.
func Decode(data []byte, v any) (Lines, error) {
	var root yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(data)).Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, ErrEmpty
		}
		return nil, syntaxError(data, err)
	}
	s := shape{lines: Lines{}}
	s.walk(&root, reflect.TypeOf(v), "")
	if err := s.err(); err != nil {
		return nil, err
	}
	if err := root.Decode(v); err != nil {
		// The shape was checked: what is left is a key written twice in one mapping, which
		// yaml words well ("line 7: mapping key "window" already defined at line 6").
		var te *yaml.TypeError
		if errors.As(err, &te) {
			return nil, &Error{Problems: te.Errors}
		}
		return nil, err
	}
	return s.lines, nil
}

// yamlLine is the position yaml puts in front of a syntax error.
var yamlLine = regexp.MustCompile(`^(?:yaml: )?line \d+: `)

// syntaxError words a YAML syntax error with the line of the mistake. yaml.v3 names the line
// where the construct it was reading began, and for a parser error (rather than a scanner
// error) counts it from 0: an unclosed "[" on line 6 reads "line 5", an item indented one
// space too little "line 1" (the line before its list). The first line at which the text
// read so far fails the same way is where the mistake is; it is searched by bisection, each
// step a parse of the lines up to it.
func syntaxError(data []byte, err error) error {
	want := err.Error()
	failsAlike := func(n int) bool {
		var v yaml.Node
		e := yaml.Unmarshal(firstLines(data, n), &v)
		return e != nil && e.Error() == want
	}
	lines := bytes.Count(data, []byte("\n")) + 1
	line := sort.Search(lines, func(i int) bool { return failsAlike(i + 1) }) + 1
	msg := yamlLine.ReplaceAllString(strings.TrimPrefix(want, "yaml: "), "")
	if line > lines {
		return fmt.Errorf("yaml: %s", msg) // no prefix fails alike: keep yaml's words
	}
	return fmt.Errorf("line %d: %s", line, msg)
}

// firstLines returns the first n lines of data.
func firstLines(data []byte, n int) []byte {
	end := 0
	for ; n > 0; n-- {
		i := bytes.IndexByte(data[end:], '\n')
		if i < 0 {
			return data
		}
		end += i + 1
	}
	return data[:end]
}

// shape checks a YAML tree against a Go type before decoding, so that a document of the
// wrong shape is told in its own words, and records the line of each part on the way.
type shape struct {
	lines    Lines
	problems []problem
}

type problem struct {
	line int
	text string
}

func (s *shape) add(line int, format string, args ...any) {
	s.problems = append(s.problems, problem{line, fmt.Sprintf(format, args...)})
}

func (s *shape) err() error {
	if len(s.problems) == 0 {
		return nil
	}
	slices.SortStableFunc(s.problems, func(a, b problem) int { return cmp.Compare(a.line, b.line) })
	e := &Error{}
	for _, p := range s.problems {
		e.Problems = append(e.Problems, fmt.Sprintf("line %d: %s", p.line, p.text))
	}
	return e
}

func (s *shape) walk(n *yaml.Node, t reflect.Type, path string) {
	for n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return // an empty value: the zero value, for the caller to judge
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if path != "" {
		s.lines[path] = n.Line
	}
	switch t.Kind() {
	case reflect.Struct:
		if !s.want(n, yaml.MappingNode, t, path) {
			return
		}
		fields, names := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Value == "<<" { // a merge key: its mapping's fields are this mapping's
				line := s.lines[path]
				s.walk(v, t, path)
				s.lines[path] = line // written here, not where the merged mapping is
				continue
			}
			f, ok := fields[k.Value]
			if !ok {
				meant, ok := suggest.Closest(k.Value, names)
				if ok {
					s.add(k.Line, "unknown field %q (did you mean %q?)", k.Value, meant)
				} else {
					s.add(k.Line, "unknown field %q", k.Value)
				}
				continue
			}
			s.walk(v, f.Type, join(path, k.Value))
		}
	case reflect.Map:
		if !s.want(n, yaml.MappingNode, t, path) {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			s.walk(n.Content[i+1], t.Elem(), fmt.Sprintf("%s[%q]", path, n.Content[i].Value))
		}
	case reflect.Slice:
		if !s.want(n, yaml.SequenceNode, t, path) {
			return
		}
		for i, item := range n.Content {
			s.walk(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
		}
	default:
		s.want(n, yaml.ScalarNode, t, path)
	}
}

// want reports whether n is of kind, and records a problem naming path if not.
func (s *shape) want(n *yaml.Node, kind yaml.Kind, t reflect.Type, path string) bool {
	if n.Kind == kind {
		return true
	}
	var want string
	switch t.Kind() {
	case reflect.Struct:
		want = "a mapping of fields"
	case reflect.Map:
		want = "a mapping of names to values"
	case reflect.Slice:
		want = "a list"
	default:
		want = "a single value"
	}
	if path == "" {
		path = "the document"
	}
	s.add(n.Line, "%s: want %s, got %s", path, want, kindName(n.Kind))
	return false
}

func kindName(k yaml.Kind) string {
	switch k {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return "a single value"
	}
	return "an alias" // a dangling one; yaml refused the others already
}

// yamlFields returns the fields of struct t by their YAML names, and the names in the order
// the struct declares them (which breaks ties between suggestions).
func yamlFields(t reflect.Type) (map[string]reflect.StructField, []string) {
	fields := map[string]reflect.StructField{}
	var names []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "-" || name == "" {
			continue
		}
		fields[name] = f
		names = append(names, name)
	}
	return fields, names
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

package yamldoc

import (
	"errors"
	"testing"
)

type doc struct {
	Name  string            `yaml:"name"`
	Items []item            `yaml:"items"`
	Tags  map[string]string `yaml:"tags,omitempty"`
	Inner *struct {
		Depth string `yaml:"depth"`
	} `yaml:"inner"`
}

type item struct {
	ID    string `yaml:"id"`
	Limit string `yaml:"limit"`
}

func TestDecodeLines(t *testing.T) {
	t.Parallel()
	var d doc
	lines, err := Decode([]byte(`name: x
base: &base {limit: 5}
items:
  - id: a
    <<: *base
  - {id: b, limit: 7}
tags:
  team: core
inner:
  depth: 3
`), &d)
	// base: is no field of doc: refused, though an anchor's home is a common YAML idiom, as
	// yaml.v3's KnownFields does.
	if err == nil || err.Error() != `line 2: unknown field "base"` {
		t.Fatalf("Decode = %v, want the unknown field base", err)
	}
	lines, err = Decode([]byte(`name: x
items:
  - &a {id: a, limit: 5}
  - id: b
    <<: *a
    limit: 7
tags:
  team: core
inner:
  depth: 3
`), &d)
	if err != nil {
		t.Fatal(err)
	}
	if d.Items[1].ID != "b" || d.Items[1].Limit != "7" || d.Inner.Depth != "3" {
		t.Errorf("decoded %+v, want item b with limit 7 and depth 3", d)
	}
	for path, want := range map[string]int{"name": 1, "items": 3, "items[0]": 3, "items[0].limit": 3, "items[1]": 4, "items[1].limit": 6, `tags["team"]`: 8, "inner": 10, "inner.depth": 10} {
		if got := lines[path]; got != want {
			t.Errorf("line of %s = %d, want %d", path, got, want)
		}
	}
}

func TestDecodeEmpty(t *testing.T) {
	t.Parallel()
	for _, text := range []string{"", "\n", "# nothing\n"} {
		if _, err := Decode([]byte(text), &doc{}); !errors.Is(err, ErrEmpty) {
			t.Errorf("Decode(%q) = %v, want ErrEmpty", text, err)
		}
	}
}

func TestDecodeAllProblems(t *testing.T) {
	t.Parallel()
	_, err := Decode([]byte("nmae: x\nitems: {id: a}\ninner: [1]\n"), &doc{})
	var e *Error
	if !errors.As(err, &e) || len(e.Problems) != 3 {
		t.Fatalf("Decode = %v, want 3 problems", err)
	}
	want := []string{
		`line 1: unknown field "nmae" (did you mean "name"?)`,
		"line 2: items: want a list, got a mapping",
		"line 3: inner: want a mapping of fields, got a list",
	}
	for i, w := range want {
		if e.Problems[i] != w {
			t.Errorf("problem %d = %q, want %q", i, e.Problems[i], w)
		}
	}
}

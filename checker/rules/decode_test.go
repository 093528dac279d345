package rules

import (
	"fmt"
	"strings"
	"testing"
)

// lines joins YAML lines; tests name the line of a mistake by its place in the list.
func lines(l ...string) string { return strings.Join(l, "\n") + "\n" }

// twoRules is a valid document of 13 lines with two rules: a starts on line 2, b on line 8.
func twoRules(change func(l []string)) string {
	l := []string{
		"rules:",
		"  - id: a",
		"    dimension: user",
		"    endpoint: /x",
		"    algorithm: fixed_window",
		"    limit: 10",
		"    window: 1m",
		"  - id: b",
		"    dimension: user",
		"    endpoint: /y",
		"    algorithm: fixed_window",
		"    limit: 10",
		"    window: 1m",
	}
	if change != nil {
		change(l)
	}
	return lines(l...)
}

func TestDecodeErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		doc  string
		want string // the whole error
	}{
		{"unknown field", twoRules(func(l []string) { l[4] = "    algoritm: fixed_window" }),
			`line 5: unknown field "algoritm" (did you mean "algorithm"?)`},
		{"unknown field, nothing close", twoRules(func(l []string) { l[11] = "    colour: blue" }),
			`line 12: unknown field "colour"`},
		{"unknown top-level field", "rule:\n" + strings.TrimPrefix(twoRules(nil), "rules:\n"),
			`line 1: unknown field "rule" (did you mean "rules"?)`},
		{"unknown nested field", "warnings: {entr: 0.5}\n" + twoRules(nil),
			`line 1: unknown field "entr" (did you mean "enter"?)`},
		{"unknown field in JSON", `{"rules": [{"id": "a", "dimesion": "user"}]}`,
			`line 1: unknown field "dimesion" (did you mean "dimension"?)`},
		{"rules a mapping", "rules:\n  a: {id: a}\n", "line 2: rules: want a list, got a mapping"},
		{"tiers a list", "tiers: [free]\n" + twoRules(nil), "line 1: tiers: want a mapping of names to values, got a list"},
		{"a rule a value", "rules:\n  - a\n", "line 2: rules[0]: want a mapping of fields, got a single value"},
		{"id a mapping", twoRules(func(l []string) { l[7] = "  - id: {x: 1}" }), "line 8: rules[1].id: want a single value, got a mapping"},
		{"document a list", "- a\n- b\n", "line 1: the document: want a mapping of fields, got a list"},
		{"key twice", twoRules(func(l []string) { l[5] = "    window: 1m" }), `line 7: mapping key "window" already defined at line 6`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Decode([]byte(tt.doc))
			if err == nil || err.Error() != tt.want {
				t.Errorf("Decode = %v, want %q", err, tt.want)
			}
		})
	}
}

// TestSyntaxErrorLine: a YAML syntax error names the line of the mistake. yaml.v3 itself names
// the line before the construct it was reading for the mistakes of its parser (an unclosed
// "[" on line 6 reads "line 5", a misindented line "line 1").
func TestSyntaxErrorLine(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		change func(l []string)
		want   string
	}{
		{"unclosed flow sequence", func(l []string) { l[5] = "    limit: [10" }, "line 6: did not find expected ',' or ']'"},
		{"unclosed flow mapping", func(l []string) { l[5] = "    limit: {10" }, "line 6: did not find expected ',' or '}'"},
		{"field indented too little", func(l []string) { l[4] = "   algorithm: fixed_window" }, "line 5: did not find expected '-' indicator"},
		{"item without its space", func(l []string) { l[7] = "  -id: b" }, "line 8: did not find expected '-' indicator"},
		{"text after a quoted value", func(l []string) { l[3] = `    endpoint: "/x" y` }, "line 4: did not find expected key"},
		{"tab as indentation", func(l []string) { l[4] = "\talgorithm: fixed_window" }, "line 5: found a tab character that violates indentation"},
		// yaml's own line is right for the mistakes of its scanner: they stay right.
		{"colon left out", func(l []string) { l[4] = "    algorithm fixed_window" }, "line 5: could not find expected ':'"},
		{"field indented too much", func(l []string) { l[4] = "     algorithm: fixed_window" }, "line 5: mapping values are not allowed in this context"},
		{"quote not closed", func(l []string) { l[3] = `    endpoint: "/x` }, "line 4: found unexpected end of stream"},
		{"character that starts no token", func(l []string) { l[3] = "    endpoint: @x" }, "line 4: found character that cannot start any token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Decode([]byte(twoRules(tt.change)))
			if err == nil || err.Error() != tt.want {
				t.Errorf("Decode = %v, want %q", err, tt.want)
			}
		})
	}
}

// TestProblemLines: the problems Compile finds after parsing name the line of the field, or of
// the part of the document, they are about.
func TestProblemLines(t *testing.T) {
	t.Parallel()
	doc := lines(
		"tiers:", // 1
		"  free: {}",
		"  pro: {}",
		"default_tier: gold", // 4
		"users:",
		"  u1: {tier: silver}", // 6
		"policies:",
		"  tier_protection:",
		"    - tier: free",
		"      capacity: 0", // 10
		"      factor: 0.5",
		"rules:",
		"  - id: r1", // 13
		"    dimension: user",
		"    endpoint: /x",
		"    algorithm: fixed_windo", // 16
		"    limit: 5",
		"    window: 1m",
		"  - id: r1", // 19
		"    dimension: ip",
		"    endpoint: x", // 21
		"    algorithm: gcra",
		"    limit: 10",
		"    window: 1m",
		"    warning:",
		"      enter: 2", // 26
	)
	_, err := Parse([]byte(doc))
	if err == nil {
		t.Fatal("Parse succeeded, want problems")
	}
	for _, want := range []string{
		`line 4: default_tier: "gold" is not declared under tiers:`,
		`line 6: users["u1"]: tier: "silver" is not declared under tiers:`,
		`line 10: policies.tier_protection[0]: capacity: want a whole number`,
		`line 16: rule "r1" (rules[0]): algorithm: unknown algorithm "fixed_windo"`,
		`line 19: rule "r1": id: "r1" is used by more than one rule`,
		`line 21: rule "r1" (rules[1]): endpoint: "x" must start with "/"`,
		`line 26: rule "r1" (rules[1]): warning: enter: want a usage ratio`,
	} {
		if !strings.Contains(err.Error(), "\n  "+want) {
			t.Errorf("problems do not include %q:\n%v", want, err)
		}
	}
	// In line order.
	if i, j := strings.Index(err.Error(), "line 4:"), strings.Index(err.Error(), "line 26:"); i < 0 || j < i {
		t.Errorf("problems not in line order:\n%v", err)
	}
}

// TestProblemsOnce: each problem is reported once, however many ways lead to it.
func TestProblemsOnce(t *testing.T) {
	t.Parallel()
	const ok = "{id: a, dimension: user, endpoint: /x, algorithm: gcra, limit: 5, window: 1s}"
	tests := []struct {
		name    string
		doc     string
		want    string // once
		notWant string // at all
	}{
		// Two tiers, one pair of rules sharing a bucket in each.
		{"shared bucket in two tiers", "tiers: {free: {}, pro: {}}\ndefault_tier: free\nrules:\n- " + ok + "\n- {id: b, dimension: user, endpoint: /x, algorithm: gcra, limit: 9, window: 1s}",
			`rule "b": duplicates rule "a" for tiers "free" and "pro"`, ""},
		// The rule's warning inherits the document's bad pair: said where it is written.
		{"inherited thresholds", "warnings: {enter: 0.5, exit: 0.9}\nrules:\n- {id: a, dimension: user, endpoint: /x, algorithm: gcra, limit: 5, window: 1s, warning: {quiet_period: 1m}}",
			"warnings: exit: 0.9 must be below enter (0.5)", `rule "a" (rules[0]): warning: exit`},
		// A refused ratio is not compared again.
		{"refused ratio", "rules:\n- {id: a, dimension: user, endpoint: /x, algorithm: gcra, limit: 5, window: 1s, warning: {enter: 2}}",
			"warning: enter: want a usage ratio", "must be below enter"},
		// A user's limit names a rule that exists but has problems of its own.
		{"limit of a refused rule", "users: {'1': {limits: {a: 5}}}\nrules:\n- {id: a, dimension: user, endpoint: /x, algorithm: gcra, limit: 0, window: 1s}",
			`limit: want a whole number`, "no rule has this id"},
		// Three rules with one id: one problem.
		{"id used three times", "rules:\n- " + ok + "\n- {id: a, dimension: ip, endpoint: /x, algorithm: gcra, limit: 5, window: 1s}\n- {id: a, dimension: global, endpoint: /x, algorithm: gcra, limit: 5, window: 1s}",
			`id: "a" is used by more than one rule`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(tt.doc))
			if err == nil {
				t.Fatalf("Parse succeeded, want %q", tt.want)
			}
			if n := strings.Count(err.Error(), tt.want); n != 1 {
				t.Errorf("%q said %d times, want once:\n%v", tt.want, n, err)
			}
			if tt.notWant != "" && strings.Contains(err.Error(), tt.notWant) {
				t.Errorf("error says %q:\n%v", tt.notWant, err)
			}
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	data := []byte(sample)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeSyntaxError is the cost of finding the line of a syntax error at the end of a
// file of 500 rules (3,000 lines): a bisection of prefix parses, on the error path only.
func BenchmarkDecodeSyntaxError(b *testing.B) {
	var sb strings.Builder
	sb.WriteString("rules:\n")
	for i := range 500 {
		fmt.Fprintf(&sb, "  - id: r%d\n    dimension: user\n    endpoint: /x%d\n    algorithm: gcra\n    limit: 5\n    window: 1s\n", i, i)
	}
	sb.WriteString("  - id: last\n    limit: [5\n")
	data := []byte(sb.String())
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(data); err == nil || !strings.HasPrefix(err.Error(), "line 3003: ") {
			b.Fatalf("Decode = %v, want line 3003", err)
		}
	}
}

package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"go.yaml.in/yaml/v3"

	"github.com/quotaflow/quotaflow/checker/rules"
)

// RuleYAML prints a rule that the admin API answered in JSON as block YAML, as a rules file
// writes it. JSON is YAML: read as a node tree it keeps the fields' order and numbers as
// numbers (rules.Scalar would encode them quoted); dropping the styles prints block YAML.
func RuleYAML(w io.Writer, raw json.RawMessage) error {
	var n yaml.Node
	if err := yaml.Unmarshal(raw, &n); err != nil {
		return fmt.Errorf("decode rule: %w", err)
	}
	plainStyle(&n)
	return yaml.NewEncoder(w).Encode(&n)
}

// RulesFile is doc as a YAML rules file, after a comment saying where it came from.
func RulesFile(doc *rules.Document, from string) ([]byte, error) {
	raw, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("encode rules: %w", err)
	}
	var n yaml.Node
	if err := yaml.Unmarshal(raw, &n); err != nil {
		return nil, fmt.Errorf("encode rules: %w", err)
	}
	plainStyle(&n)
	var b bytes.Buffer
	fmt.Fprintf(&b, "# %s.\n", from)
	if err := yaml.NewEncoder(&b).Encode(&n); err != nil {
		return nil, fmt.Errorf("encode rules: %w", err)
	}
	return b.Bytes(), nil
}

func plainStyle(n *yaml.Node) {
	n.Style = 0
	for _, c := range n.Content {
		plainStyle(c)
	}
}

// Applied prints what an apply of file added (+), changed (~) and removed (-), one item a
// line, then the document's size and the counts; a dry run says that nothing changed.
func Applied(w io.Writer, file string, ruleCount, userCount int, ch rules.Changes, dryRun bool) {
	for _, l := range []struct {
		mark  string
		items []string
	}{{"+", ch.Added}, {"~", ch.Changed}, {"-", ch.Removed}} {
		for _, item := range l.items {
			fmt.Fprintf(w, "%s %s\n", l.mark, item)
		}
	}
	verb := "applied"
	if dryRun {
		verb = "dry run, nothing changed:"
	}
	fmt.Fprintf(w, "%s %s: %d rules, %d users; %d added, %d changed, %d removed\n", verb, file, ruleCount, userCount,
		len(ch.Added), len(ch.Changed), len(ch.Removed))
}

// Lacking prints the items an apply without --prune was refused for: what the store holds
// and the file lacks, one a line.
func Lacking(w io.Writer, items []string) {
	for _, item := range items {
		fmt.Fprintf(w, "- %s\n", item)
	}
}

// RulesDocument prints a rules document as the admin API answers it (raw JSON): with asJSON
// indented as it is, else as Rules' table, Width wide or, when wide, in full.
func RulesDocument(w io.Writer, raw json.RawMessage, asJSON, wide bool) error {
	if asJSON {
		var b bytes.Buffer
		json.Indent(&b, raw, "", "  ")
		fmt.Fprintln(w, b.String())
		return nil
	}
	var doc rules.Document
	if err := json.Unmarshal(raw, &doc); err != nil {
		return fmt.Errorf("decode rules: %w", err)
	}
	width := Width
	if wide {
		width = 0
	}
	return Rules(w, &doc, width)
}

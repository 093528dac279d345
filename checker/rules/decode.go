package rules

import (
	"errors"
	"fmt"

	"github.com/quotaflow/quotaflow/internal/yamldoc"
)

// Decode reads a rules document, YAML or JSON, refusing unknown fields. It does not validate:
// Compile does, naming every problem. Its errors name the line and say what was expected in
// the document's words, not in Go's: `line 37: unknown field "algoritm" (did you mean
// "algorithm"?)`.
func Decode(data []byte) (*Document, error) {
	var d Document
	lines, err := yamldoc.Decode(data, &d)
	var ye *yamldoc.Error
	switch {
	case errors.Is(err, yamldoc.ErrEmpty):
		return nil, errors.New("rules: the document is empty; it needs a top-level rules: list")
	case errors.As(err, &ye):
		return nil, &ValidationError{Problems: ye.Problems}
	case err != nil:
		return nil, err
	}
	// Problems of rules in a compiled set name the rule by id alone (rules sharing a bucket).
	for i, r := range d.Rules {
		if k := fmt.Sprintf("rule %q", r.ID); r.ID != "" && lines[k] == 0 {
			lines[k] = lines[fmt.Sprintf("rules[%d]", i)]
		}
	}
	d.lines = lines
	return &d, nil
}

package admin

import (
	"bytes"
	"errors"
	"fmt"
	"os"

	"github.com/quotaflow/quotaflow/internal/field"
	"go.yaml.in/yaml/v3"
)

// tokenEntry is one token of an --admin-tokens-file.
type tokenEntry struct {
	Token string `yaml:"token"`
	Name  string `yaml:"name"`
	Role  string `yaml:"role"`
}

// LoadTokens is the admin API's tokens: those of the tokens file at path (ParseTokens; none
// when path is empty), and token when set, a write token named "admin". Its errors are
// *field.Errors naming TokensFile or Token.
func LoadTokens(path, token string) (map[string]Token, error) {
	tokens := map[string]Token{}
	if path != "" {
		data, err := os.ReadFile(path)
		if err == nil {
			tokens, err = ParseTokens(data)
		}
		if err != nil {
			return nil, field.Errorf("TokensFile", "%s: %v", path, err)
		}
	}
	if token != "" {
		if _, dup := tokens[token]; dup {
			return nil, field.Errorf("Token", "the same token is also in TokensFile")
		}
		tokens[token] = Token{Name: "admin", Role: RoleWrite}
	}
	return tokens, nil
}

// ParseTokens reads a tokens file (YAML): tokens: as a list of {token, name, role}, or as a map
// from token to {name, role}. A token has at least 16 characters, a name (writes are logged
// under it) and the role read or write; errors name the entry and the field.
func ParseTokens(data []byte) (map[string]Token, error) {
	var file struct {
		Tokens yaml.Node `yaml:"tokens"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&file); err != nil {
		return nil, fmt.Errorf("yaml: %w", err)
	}
	var entries []tokenEntry
	var where []string
	switch file.Tokens.Kind {
	case yaml.SequenceNode:
		if err := file.Tokens.Decode(&entries); err != nil {
			return nil, fmt.Errorf("tokens: %w", err)
		}
		for i := range entries {
			where = append(where, fmt.Sprintf("tokens[%d]", i))
		}
	case yaml.MappingNode:
		var m map[string]tokenEntry
		if err := file.Tokens.Decode(&m); err != nil {
			return nil, fmt.Errorf("tokens: %w", err)
		}
		for tok, e := range m {
			e.Token = tok
			entries = append(entries, e)
			where = append(where, fmt.Sprintf("tokens[%s…]", tok[:min(4, len(tok))]))
		}
	default:
		return nil, errors.New("tokens: want a list of {token, name, role}")
	}
	out := make(map[string]Token, len(entries))
	for i, e := range entries {
		switch {
		case len(e.Token) < 16:
			return nil, fmt.Errorf("%s.token: want at least 16 characters", where[i])
		case e.Name == "":
			return nil, fmt.Errorf("%s.name: required (write calls are logged under it)", where[i])
		case e.Role != RoleRead && e.Role != RoleWrite:
			return nil, fmt.Errorf("%s.role: want read or write, got %q", where[i], e.Role)
		}
		if _, dup := out[e.Token]; dup {
			return nil, fmt.Errorf("%s.token: listed twice", where[i])
		}
		out[e.Token] = Token{Name: e.Name, Role: e.Role}
	}
	return out, nil
}

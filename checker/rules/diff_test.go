package rules

import (
	"fmt"
	"testing"
)

func TestDiff(t *testing.T) {
	t.Parallel()
	decode := func(text string) *Document {
		d, err := Decode([]byte(text))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	const base = `default_tier: free
tiers: {free: {}, gold: {}}
users: {bob: {tier: gold}, carol: {tier: free}}
exemptions: [{id: acme, dimension: user, value: acme}]
rules:
- {id: a, dimension: user, endpoint: /a, algorithm: gcra, limit: 5, window: 1m}
- {id: b, dimension: user, endpoint: /b, algorithm: gcra, limit: 5, window: 1m}
`
	tests := []struct {
		name      string
		old, next *Document
		want      string
	}{
		{"nothing", decode(base), decode(base), "{[] [] []}"},
		{"an empty store", nil, decode(base), "{[rule a rule b tier free tier gold user bob user carol exemption acme] [default_tier] []}"},
		{"added, changed and removed", decode(base), decode(`default_tier: gold
tiers: {free: {}, gold: {}}
users: {bob: {tier: free}, dave: {tier: free}}
rules:
- {id: a, dimension: user, endpoint: /a, algorithm: gcra, limit: 6, window: 1m}
- {id: c, dimension: user, endpoint: /c, algorithm: gcra, limit: 5, window: 1m}
`), "{[rule c user dave] [rule a user bob default_tier] [rule b user carol exemption acme]}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := Diff(tt.old, tt.next)
			if s := fmt.Sprintf("{%v %v %v}", nilToEmpty(got.Added), nilToEmpty(got.Changed), nilToEmpty(got.Removed)); s != tt.want {
				t.Errorf("Diff = %s\nwant %s", s, tt.want)
			}
			if got.Empty() != (tt.want == "{[] [] []}") {
				t.Errorf("Empty() = %v", got.Empty())
			}
		})
	}
}

func nilToEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

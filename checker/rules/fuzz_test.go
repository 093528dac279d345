package rules

import (
	"slices"
	"strings"
	"testing"

	"github.com/quotaflow/quotaflow/internal/algorithm"
)

// refMatch is the matching rule written the slow, obvious way: score every rule's pattern
// against the endpoint and keep the best, preferring rules that name the tier.
func refMatch(s *Set, dim Dimension, tier, endpoint string) []string {
	segs := strings.FieldsFunc(endpoint, func(r rune) bool { return r == '/' })
	score := func(p string) int {
		switch {
		case p == "*":
			return 0
		case strings.HasSuffix(p, "/*"):
			pre := strings.FieldsFunc(p[:len(p)-2], func(r rune) bool { return r == '/' })
			if len(pre) <= len(segs) && slices.Equal(pre, segs[:len(pre)]) {
				return 1 + len(pre)
			}
			return -1
		case p == endpoint:
			return 1 << 30
		}
		return -1
	}
	best, tiered := -1, false
	var out []string
	for _, r := range s.Rules() {
		if r.Dimension != dim || (r.Tier != "" && r.Tier != tier) || !s.HasTier(tier) {
			continue
		}
		sc, rt := score(r.Endpoint), r.Tier != ""
		switch {
		case sc < 0 || sc < best || (sc == best && tiered && !rt):
		case sc > best || (rt && !tiered):
			best, tiered, out = sc, rt, []string{r.ID}
		default:
			out = append(out, r.ID)
		}
	}
	slices.Sort(out)
	return out
}

func FuzzMatch(f *testing.F) {
	s := mustParse(f, sample)
	for _, e := range []string{"/api/v1/orders", "/api/v1/orders/", "/api//v1", "/", "", "api", "/api/v1/orders?x=1",
		"//api", "/api/v2/\x00", "/\xff/api", "/api/v1/orders/9/items"} {
		f.Add(e, "free")
		f.Add(e, "premium")
	}
	f.Fuzz(func(t *testing.T, endpoint, tier string) {
		for dim := DimensionUser; dim <= DimensionGlobal; dim++ {
			var got []string
			for _, r := range s.Match(dim, tier, endpoint) {
				got = append(got, r.ID)
			}
			slices.Sort(got)
			if want := refMatch(s, dim, tier, endpoint); !slices.Equal(got, want) {
				t.Errorf("Match(%s, %q, %q) = %v, want %v", dim, tier, endpoint, got, want)
			}
		}
	})
}

func FuzzParse(f *testing.F) {
	// Small seeds: the fuzz engine minimizes every new input, which crawls on large ones.
	f.Add("default_tier: a\ntiers: {a: {}, b: {}}\nusers: {'1': {tier: b}}\nrules:\n- {id: r, dimension: ip, endpoint: '*', tier: b, algorithm: fixed_window, limit: 5, window: 1h, shadow: true, fail_mode: local}")
	f.Add("rules:\n- {id: a, dimension: user, endpoint: /x/*, algorithm: gcra, limit: 5, window: 1s, burst: 2}")
	f.Add("tiers: {a: {}}\nusers: {'1': {tier: a, limits: {r: 3}}}\nrules: [{id: r}]")
	f.Fuzz(func(t *testing.T, doc string) {
		s, err := Parse([]byte(doc))
		if err != nil {
			return
		}
		for _, r := range s.Rules() {
			if err := ValidatePattern(r.Endpoint); err != nil {
				t.Errorf("accepted rule %q with invalid endpoint: %v", r.ID, err)
			}
			// A ban (limit 0) is a fixed window's of a fixed length alone: the store refuses
			// any other limit of 0.
			ban := r.Limit == 0 && r.Burst == 0 && r.Algorithm == algorithm.FixedWindow && !r.Calendar.Unit.Valid()
			if (r.Limit < 1 || r.Burst < 1) && !ban || r.Window < MinWindow || !r.Algorithm.Valid() || !r.Dimension.Valid() {
				t.Errorf("accepted invalid rule %+v", r)
			}
		}
	})
}

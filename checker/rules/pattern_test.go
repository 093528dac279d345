package rules

import (
	"strings"
	"testing"
)

// TestValidatePatternNormalForm: endpoints are matched in normal form (internal/urlpath), so a
// pattern in any other form would never match; it is refused with the form to write.
func TestValidatePatternNormalForm(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"*", "/*", "/api/*", "/api/v1/search", "/api/v1/%C3%BC/*", "/a:b@c", "/quotaflow.v1.ratelimiter/checkratelimit"} {
		if err := ValidatePattern(p); err != nil {
			t.Errorf("ValidatePattern(%q) = %v, want nil", p, err)
		}
	}
	for _, tc := range []struct{ pattern, want string }{
		{"/api/v1/search/", `write "/api/v1/search"`},
		{"/API/v1/search", `write "/api/v1/search"`},
		{"/Api/*", `write "/api/*"`},
		{"/api/./v1/*", `write "/api/v1/*"`},
		{"/api//v1", `write "/api/v1"`},
		{"/api/%73earch", `write "/api/search"`},
		{"/api/search;x", `write "/api/search"`},
		{"/api/ü", `write "/api/%C3%BC"`},
		{"/./*", `write "/*"`},
		{"/api/../..", `climbs above the root`},
		{"/a%2Fb", `encoded slash`},
		{"/a%zz/*", `two hexadecimal digits`},
	} {
		err := ValidatePattern(tc.pattern)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ValidatePattern(%q) = %v, want an error saying %s", tc.pattern, err, tc.want)
		}
	}
}

package transport

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

// FuzzCheckRateLimits sends whatever bytes the fuzzer makes to CheckRateLimits as a binary
// Connect body. Beyond the properties of every fuzz target (no panic, no server error, no key
// outside rl:), a batch that was answered has one result per check, and each error result has
// a code a caller can act on and a message naming its check.
func FuzzCheckRateLimits(f *testing.F) {
	var checks []*quotaflowv1.CheckRateLimitRequest
	for _, m := range rateLimiterSeeds() {
		if c, ok := m.(*quotaflowv1.CheckRateLimitRequest); ok {
			checks = append(checks, c)
			b, err := proto.Marshal(&quotaflowv1.CheckRateLimitsRequest{Checks: []*quotaflowv1.CheckRateLimitRequest{c}})
			if err != nil {
				f.Fatal(err)
			}
			f.Add(byte(len(checks)), b)
		}
	}
	b, err := proto.Marshal(&quotaflowv1.CheckRateLimitsRequest{Checks: checks})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(byte(0), b)
	f.Add(byte(1), []byte{})
	f.Add(byte(0), []byte{0x0a, 0x00, 0x0a, 0x00}) // two empty checks
	env := newFuzzEnv(f, testRules)
	actionable := []connect.Code{connect.CodeInvalidArgument, connect.CodePermissionDenied, connect.CodeUnavailable,
		connect.CodeResourceExhausted, connect.CodeUnauthenticated, connect.CodeFailedPrecondition}
	f.Fuzz(func(t *testing.T, sel byte, body []byte) {
		w := env.post(t, sel, quotaflowv1connect.RateLimiterCheckRateLimitsProcedure, "application/proto", body)
		checkConnect(t, w, body)
		if w.Code != http.StatusOK {
			return
		}
		req, resp := new(quotaflowv1.CheckRateLimitsRequest), new(quotaflowv1.CheckRateLimitsResponse)
		if err := proto.Unmarshal(body, req); err != nil {
			t.Fatalf("input %q was answered, but is no CheckRateLimitsRequest: %v", body, err)
		}
		if err := proto.Unmarshal(w.Body.Bytes(), resp); err != nil {
			t.Fatalf("input %q: the answer is no CheckRateLimitsResponse: %v", body, err)
		}
		if len(resp.Results) != len(req.Checks) {
			t.Fatalf("input %q: %d results for %d checks", body, len(resp.Results), len(req.Checks))
		}
		for i, r := range resp.Results {
			switch {
			case r.GetResponse() != nil:
			case r.GetError() != nil:
				e := r.GetError()
				if !slices.Contains(actionable, connect.Code(e.Code)) || !strings.HasPrefix(e.Message, fmt.Sprintf("checks[%d]", i)) {
					t.Fatalf("input %q: checks[%d] failed with code %d %q; want an actionable code and a message naming checks[%d]", body, i, e.Code, e.Message, i)
				}
			default:
				t.Fatalf("input %q: checks[%d] has neither a response nor an error", body, i)
			}
		}
	})
}

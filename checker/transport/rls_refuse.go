package transport

import (
	"encoding/json"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// badEndpoint is a descriptor whose endpoint (its path or endpoint entry) cannot be checked.
//
// The path is the one part of an Envoy descriptor the client writes, and Envoy's ratelimit
// filter cannot tell an error answer from an outage: with failure_mode_deny false (the
// fail-open setting) it serves the request unchecked. So a path quotaflow refuses (over 1024
// bytes, an escaped slash, a bad escape, ...) is answered as a denial that says why
// (rlsRefusal), never as an error, or a client would get past its limits by sending one. The
// other entries come from the gateway's own configuration and authentication: their errors
// stay InvalidArgument, for the operator to see.
type badEndpoint struct {
	desc int   // the descriptor's index
	err  error // the FieldError naming the entry
}

func (e *badEndpoint) Error() string { return e.err.Error() }
func (e *badEndpoint) Unwrap() error { return e.err }

// rlsRefusal is the answer to a request of n descriptors refused for e: OVER_LIMIT, charging
// nothing (no descriptor was checked: UNKNOWN, the refused one OVER_LIMIT), with the error
// Envoy answers the client with as the body of its 429.
func rlsRefusal(n int, e *badEndpoint) *ratelimitv3.RateLimitResponse {
	resp := &ratelimitv3.RateLimitResponse{
		OverallCode: ratelimitv3.RateLimitResponse_OVER_LIMIT,
		Statuses:    make([]*ratelimitv3.RateLimitResponse_DescriptorStatus, n),
	}
	for i := range resp.Statuses {
		resp.Statuses[i] = &ratelimitv3.RateLimitResponse_DescriptorStatus{Code: ratelimitv3.RateLimitResponse_UNKNOWN}
	}
	resp.Statuses[e.desc].Code = ratelimitv3.RateLimitResponse_OVER_LIMIT
	body, _ := json.Marshal(map[string]string{"error": "invalid_argument", "message": e.Error()}) // strings always marshal
	resp.RawBody = append(body, '\n')
	return resp
}

package transport

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/auth"
	"github.com/quotaflow/quotaflow/internal/field"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// MaxBatchChecks bounds CheckRateLimits: a batch is decided in one call, so its size bounds
// the work one request can ask for.
const MaxBatchChecks = 1000

// CheckRateLimits implements quotaflow.v1.RateLimiter.
func (s *Server) CheckRateLimits(ctx context.Context, req *connect.Request[quotaflowv1.CheckRateLimitsRequest]) (*connect.Response[quotaflowv1.CheckRateLimitsResponse], error) {
	return connectResponse(s.checkRateLimits(ctx, req.Msg))
}

// checkRateLimits decides each check of a batch on its own, all of them in one
// Engine.CheckAll. Only what concerns the whole call is an RPC error (a caller without the
// check permission, a batch over MaxBatchChecks); a check's own error, a tier its caller may
// not assert included, is that check's result.
func (s *Server) checkRateLimits(ctx context.Context, req *quotaflowv1.CheckRateLimitsRequest) (*quotaflowv1.CheckRateLimitsResponse, error) {
	if err := s.authorize(ctx, auth.Check, "CheckRateLimits"); err != nil {
		return nil, err
	}
	checks := req.GetChecks()
	if len(checks) > MaxBatchChecks {
		return nil, connect.NewError(connect.CodeInvalidArgument,
			fmt.Errorf("checks[%d]: a batch holds at most %d checks, got %d", MaxBatchChecks, MaxBatchChecks, len(checks)))
	}
	results := make([]*quotaflowv1.CheckRateLimitsResult, len(checks))
	field := func(i int) string { return "checks[" + strconv.Itoa(i) + "]" }
	// The valid checks go to the engine together; at[k] is the index in checks of qs[k].
	qs := make([]*checker.Query, 0, len(checks))
	at := make([]int, 0, len(checks))
	now := time.Now()
	for i, c := range checks {
		if c.GetTier() != "" {
			if err := s.authorize(ctx, auth.AssertTier, field(i)+".tier"); err != nil {
				results[i] = errorResult(field(i), err)
				continue
			}
		}
		q, err := checkQuery(c, now)
		if err != nil {
			results[i] = errorResult(field(i), s.rpcError(err))
			continue
		}
		qs, at = append(qs, q), append(at, i)
	}
	outs, errs := s.engine.CheckAll(ctx, qs)
	for k, out := range outs {
		i := at[k]
		if errs != nil && errs[k] != nil {
			results[i] = errorResult(field(i), s.rpcError(errs[k]))
			continue
		}
		results[i] = &quotaflowv1.CheckRateLimitsResult{Result: &quotaflowv1.CheckRateLimitsResult_Response{Response: render(qs[k], out)}}
	}
	return &quotaflowv1.CheckRateLimitsResponse{Results: results}, nil
}

// errorResult is the result of check name (checks[i]) that failed with err, a Connect error
// from authorize or rpcError: its code, and a message naming checks[i].<field> when the error
// is about a field.
func errorResult(name string, err error) *quotaflowv1.CheckRateLimitsResult {
	code, msg := connect.CodeUnknown, err.Error()
	if ce := new(connect.Error); errors.As(err, &ce) {
		code, msg = ce.Code(), ce.Message()
	}
	e := &quotaflowv1.CheckError{Code: int32(code), Message: name + ": " + msg}
	var fe *field.Error
	switch {
	case errors.As(err, &fe):
		e.Field = name + "." + fe.Field
		e.Message = name + "." + fe.Error()
	case code == connect.CodePermissionDenied:
		// authorize names the field itself (checks[i].tier).
		e.Field, e.Message = name+".tier", msg
	}
	return &quotaflowv1.CheckRateLimitsResult{Result: &quotaflowv1.CheckRateLimitsResult_Error{Error: e}}
}

package transport

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/auth"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// MaxBatchChecks bounds CheckRateLimits: a batch is decided in one call, so its size bounds
// the work one request can ask for.
const MaxBatchChecks = 1000

// batchWorkers is how many checks of one batch are decided at once. Each check waits on one
// Redis round trip; a few in flight hide that latency without letting one batch take the
// whole Redis connection pool.
const batchWorkers = 16

// CheckRateLimits implements quotaflow.v1.RateLimiter.
func (s *Server) CheckRateLimits(ctx context.Context, req *connect.Request[quotaflowv1.CheckRateLimitsRequest]) (*connect.Response[quotaflowv1.CheckRateLimitsResponse], error) {
	return connectResponse(s.checkRateLimits(ctx, req.Msg))
}

// checkRateLimits decides each check of a batch on its own. Only what concerns the whole call
// is an RPC error (a caller without the check permission, a batch over MaxBatchChecks); a
// check's own error, a tier its caller may not assert included, is that check's result.
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
	decideOne := func(i int) {
		field := "checks[" + strconv.Itoa(i) + "]"
		if checks[i].GetTier() != "" {
			if err := s.authorize(ctx, auth.AssertTier, field+".tier"); err != nil {
				results[i] = errorResult(field, err)
				return
			}
		}
		resp, err := s.decide(ctx, checks[i])
		if err != nil {
			results[i] = errorResult(field, err)
			return
		}
		results[i] = &quotaflowv1.CheckRateLimitsResult{Result: &quotaflowv1.CheckRateLimitsResult_Response{Response: resp}}
	}
	if len(checks) == 1 {
		decideOne(0)
	} else {
		next := make(chan int)
		var wg sync.WaitGroup
		for range min(len(checks), batchWorkers) {
			wg.Go(func() {
				for i := range next {
					decideOne(i)
				}
			})
		}
		for i := range checks {
			next <- i
		}
		close(next)
		wg.Wait()
	}
	return &quotaflowv1.CheckRateLimitsResponse{Results: results}, nil
}

// errorResult is the result of check field (checks[i]) that failed with err, a Connect error
// from authorize or rpcError: its code, and a message naming checks[i].<field> when the error
// is about a field.
func errorResult(field string, err error) *quotaflowv1.CheckRateLimitsResult {
	code, msg := connect.CodeUnknown, err.Error()
	if ce := new(connect.Error); errors.As(err, &ce) {
		code, msg = ce.Code(), ce.Message()
	}
	e := &quotaflowv1.CheckError{Code: int32(code), Message: field + ": " + msg}
	var fe *checker.FieldError
	switch {
	case errors.As(err, &fe):
		e.Field = field + "." + fe.Field
		e.Message = field + "." + fe.Error()
	case code == connect.CodePermissionDenied:
		// authorize names the field itself (checks[i].tier).
		e.Field, e.Message = field+".tier", msg
	}
	return &quotaflowv1.CheckRateLimitsResult{Result: &quotaflowv1.CheckRateLimitsResult_Error{Error: e}}
}

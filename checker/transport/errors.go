package transport

import (
	"context"
	"errors"
	"net/http"

	"connectrpc.com/connect"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/field"
)

// rpcError maps an engine error to its Connect code: a broken request is InvalidArgument, no
// rules or no store Unavailable, a caller that gave up Canceled or DeadlineExceeded. Anything
// else is a failure of the store that no fail mode covers (a script error): Unavailable, and
// logged, since the caller only learns that the check failed.
func (s *Server) rpcError(err error) error {
	var fe *field.Error
	switch {
	case errors.As(err, &fe):
		return connect.NewError(connect.CodeInvalidArgument, err)
	case errors.Is(err, rules.ErrNotFound):
		// An entitlement the rules do not declare (GetBalance, RecordUsage).
		return connect.NewError(connect.CodeNotFound, err)
	case errors.Is(err, checker.ErrNoRules), errors.Is(err, checker.ErrUnavailable):
		return connect.NewError(connect.CodeUnavailable, err)
	case errors.Is(err, context.Canceled):
		return connect.NewError(connect.CodeCanceled, err)
	case errors.Is(err, context.DeadlineExceeded):
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	}
	s.log.Error("check failed", "err", err)
	return connect.NewError(connect.CodeUnavailable, err)
}

// grpcError turns a Connect error into a gRPC status; the codes are the same numbers.
func grpcError(err error) error {
	if ce := new(connect.Error); errors.As(err, &ce) {
		return status.Error(codes.Code(ce.Code()), ce.Message())
	}
	return status.Error(codes.Unknown, err.Error())
}

// httpStatus maps an engine error to an HTTP status and the error code of a JSON body. An
// idempotency key reused for another request is 409: the request is well-formed, it clashes
// with an earlier one. Connect and gRPC answer it as the FieldError it also is:
// InvalidArgument, naming idempotency_key.
func httpStatus(err error) (int, string) {
	if errors.Is(err, checker.ErrIdempotencyConflict) {
		return http.StatusConflict, "conflict"
	}
	var fe *field.Error
	if errors.As(err, &fe) {
		return http.StatusBadRequest, "invalid_argument"
	}
	return http.StatusServiceUnavailable, "unavailable"
}

// leaseError maps the outcomes of a lease's release or renewal: an id not issued to the caller
// is PermissionDenied, one that holds nothing NotFound, an expired one FailedPrecondition, the
// rest as a check's errors.
func (s *Server) leaseError(err error) error {
	switch {
	case errors.Is(err, checker.ErrIDNotIssued):
		return connect.NewError(connect.CodePermissionDenied, err)
	case errors.Is(err, checker.ErrLeaseNotHeld):
		return connect.NewError(connect.CodeNotFound, err)
	case errors.Is(err, checker.ErrLeaseExpired):
		return connect.NewError(connect.CodeFailedPrecondition, err)
	}
	return s.rpcError(err)
}

// reservationError maps the outcomes of a settle or cancel: an id not issued to the caller is
// PermissionDenied, an unknown or expired reservation NotFound, a settled one
// FailedPrecondition, the rest as a check's errors.
func (s *Server) reservationError(err error) error {
	switch {
	case errors.Is(err, checker.ErrIDNotIssued):
		return connect.NewError(connect.CodePermissionDenied, err)
	case errors.Is(err, checker.ErrReservationUnknown):
		return connect.NewError(connect.CodeNotFound, err)
	case errors.Is(err, checker.ErrReservationSettled):
		return connect.NewError(connect.CodeFailedPrecondition, err)
	}
	return s.rpcError(err)
}

package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/field"
	"github.com/quotaflow/quotaflow/internal/ratelimitheader"
)

// Error is the body of every error the API answers, and what Client returns for one.
type Error struct {
	// Status is the HTTP status (not in the body).
	Status int `json:"-"`
	// Code names the kind of error: invalid_argument, unauthenticated, permission_denied,
	// not_found, already_exists, failed_precondition, rate_limited, unavailable.
	Code string `json:"error"`
	// Field names the request's field that broke a rule, if one did.
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
	// Problems lists every problem of a refused rules document.
	Problems []string `json:"problems,omitempty"`
	// RetryAfter is how long a rate-limited token must wait (the Retry-After header).
	RetryAfter time.Duration `json:"-"`
}

// Error implements error: the message, the status and code, the field, and each problem when
// there are several.
func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s (HTTP %d %s", e.Message, e.Status, e.Code)
	if e.Field != "" {
		fmt.Fprintf(&b, ", field %s", e.Field)
	}
	b.WriteString(")")
	// A single problem is the message already.
	if len(e.Problems) > 1 {
		for _, p := range e.Problems {
			b.WriteString("\n  " + p)
		}
	}
	return b.String()
}

func badField(field, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Code: "invalid_argument", Field: field,
		Message: field + ": " + fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) *Error {
	return &Error{Status: http.StatusNotFound, Code: "not_found", Message: fmt.Sprintf(format, args...)}
}

// writeAPIError renders err: the API's own errors as they say, the store's by kind, and
// anything else (the store unreachable) as 503.
func writeAPIError(w http.ResponseWriter, err error) {
	var (
		ae *Error
		fe *field.Error
		ve *rules.ValidationError
		me *http.MaxBytesError
		re *rules.RemovalError
	)
	switch {
	case errors.As(err, &ae):
	case errors.As(err, &fe):
		ae = badField(fe.Field, "%s", fe.Msg)
	case errors.As(err, &ve):
		// The problems are listed once, in Problems; the message names a single one, or
		// how many there are.
		msg := fmt.Sprintf("%d problems", len(ve.Problems))
		if len(ve.Problems) == 1 {
			msg = ve.Problems[0]
		}
		ae = &Error{Status: http.StatusBadRequest, Code: "invalid_argument", Problems: ve.Problems,
			Message: "refused, nothing was changed: " + msg}
	case errors.As(err, &re):
		ae = &Error{Status: http.StatusConflict, Code: "failed_precondition", Field: "prune", Problems: re.Removed, Message: re.Error()}
	case errors.As(err, &me):
		ae = &Error{Status: http.StatusRequestEntityTooLarge, Code: "invalid_argument", Field: "body",
			Message: fmt.Sprintf("body: larger than %d bytes", me.Limit)}
	case errors.Is(err, rules.ErrNotFound):
		ae = notFound("%v", err)
	case errors.Is(err, rules.ErrExists):
		ae = &Error{Status: http.StatusConflict, Code: "already_exists", Message: err.Error()}
	case errors.Is(err, rules.ErrNotSeeded):
		ae = &Error{Status: http.StatusServiceUnavailable, Code: "unavailable", Message: err.Error()}
	case errors.Is(err, context.Canceled):
		return // the caller went away
	default:
		ae = &Error{Status: http.StatusServiceUnavailable, Code: "unavailable", Message: "rule store: " + err.Error()}
	}
	if ae.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(ratelimitheader.CeilSeconds(ae.RetryAfter.Milliseconds()), 10))
	}
	writeJSON(w, ae.Status, ae)
}

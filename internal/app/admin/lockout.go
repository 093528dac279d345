package admin

import (
	"errors"
	"net/http"

	"github.com/quotaflow/quotaflow/checker/auth"
)

// lockedOut answers a call refused by the Lockout (auth.LockedOutError): 429 with Retry-After.
func lockedOut(err error) error {
	le := new(auth.LockedOutError)
	if !errors.As(err, &le) {
		return err
	}
	return &Error{Status: http.StatusTooManyRequests, Code: "rate_limited", RetryAfter: le.RetryAfter, Message: le.Error()}
}

package admin

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/quotaflow/quotaflow/checker"
)

// The failed authentications of one source address are counted in a token bucket of the
// checkers' shared store: past AuthFailuresPerMinute, every call from the address is refused
// with 429 before its token is even looked at, so that a guess cannot be told right or wrong.

// source is the address a call comes from: the connection's (the admin API believes no
// forwarded header).
func source(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

func (a *API) failures(src string) checker.Allowance {
	return checker.Allowance{Namespace: "adminauth", ID: src, Name: "failures", PerMinute: a.authFailures}
}

// lockedOut refuses a call from an address whose failed authentications are over the limit.
func (a *API) lockedOut(ctx context.Context, src string) error {
	res, err := a.engine.Left(ctx, a.failures(src))
	if err != nil || res.Allowed {
		return nil // the store cannot tell: the token check still stands
	}
	a.log.Warn("admin: call refused, too many failed authentications from its address", "source", src, "retry_after", res.RetryAfter)
	return &Error{Status: http.StatusTooManyRequests, Code: "rate_limited", RetryAfter: res.RetryAfter,
		Message: fmt.Sprintf("too many failed authentications from %s (more than %d per minute); retry after %s",
			src, a.authFailures, res.RetryAfter.Round(time.Millisecond))}
}

// failed counts a failed authentication of src and logs it.
func (a *API) failed(ctx context.Context, src string, err error) {
	a.log.Warn("admin: authentication failed", "source", src, "err", err)
	if _, terr := a.engine.Take(ctx, a.failures(src)); terr != nil {
		a.log.Warn("admin: failed authentication not counted", "source", src, "err", terr)
	}
}

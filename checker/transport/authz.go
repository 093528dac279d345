package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"connectrpc.com/connect"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/auth"
	"github.com/quotaflow/quotaflow/internal/ratelimitheader"
)

// authenticate wraps h so that every request carries who sent it (auth.CallerFrom): HTTP/1.1
// and h2c alike, Connect, gRPC-Web and forward-auth.
func (s *Server) authenticate(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res := s.authenticateCall(r.Context(), r.Header.Get("Authorization"), connState(r), r.RemoteAddr, r.Header.Values)
		h.ServeHTTP(w, r.WithContext(auth.WithResult(r.Context(), res)))
	})
}

// authenticateGRPC is authenticate for a grpc-go call: the authorization metadata and the
// peer's TLS state and address.
func (s *Server) authenticateGRPC(ctx context.Context) context.Context {
	// ValueFromIncomingContext reads one key without copying the whole metadata, as
	// FromIncomingContext does: a copy per call was 5 % of what a check allocates.
	var authorization string
	if v := metadata.ValueFromIncomingContext(ctx, "authorization"); len(v) > 0 {
		authorization = v[0]
	}
	header := func(key string) []string { return metadata.ValueFromIncomingContext(ctx, key) }
	var state *tls.ConnectionState
	var remote string
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			state = &ti.State
		}
		if p.Addr != nil {
			remote = p.Addr.String()
		}
	}
	return auth.WithResult(ctx, s.authenticateCall(ctx, authorization, state, remote, header))
}

// authenticateCall authenticates a call's credentials, counting a failure against its source
// (the connection's address, or the client a trusted proxy names). Credentials from a source
// known to be locked out are refused unread; a call without credentials is no guess and goes
// on as the anonymous caller's.
func (s *Server) authenticateCall(ctx context.Context, authorization string, state *tls.ConnectionState,
	remote string, header func(string) []string) auth.Result {
	presented := authorization != "" || state != nil && len(state.PeerCertificates) > 0
	var src string
	if presented {
		src = s.lock.Source(remote, header)
		if err := s.lock.Known(src); err != nil {
			return auth.Result{Err: err}
		}
	}
	c, err := s.callers.Authenticate(authorization, state)
	if err != nil {
		if src == "" {
			src = s.lock.Source(remote, header)
		}
		if lerr := s.lock.Fail(ctx, src, err); lerr != nil {
			err = lerr
		}
	}
	return auth.Result{Caller: c, Err: err}
}

// CallerName is the name of the caller a request authenticated as ("anonymous" without
// credentials), "" for a call that did not come through Handler or RegisterGRPC: what the
// engine issues reservation and lease ids to (checker.Config.Caller).
func CallerName(ctx context.Context) string {
	if r, ok := auth.ResultFrom(ctx); ok {
		return r.Caller.Name
	}
	return ""
}

var _ checker.CallerFunc = CallerName

// authorize returns nil when the request's caller has p. Otherwise a Connect error:
// Unauthenticated for credentials that name no caller, PermissionDenied for a caller (the
// anonymous one included) that lacks p, naming the field or method (what) that needs it.
// A call that did not come through Handler or RegisterGRPC (an in-process call of a Server
// method) is an anonymous caller's.
func (s *Server) authorize(ctx context.Context, p auth.Permission, what string) error {
	res, ok := auth.ResultFrom(ctx)
	if !ok {
		res.Caller, res.Err = s.callers.Authenticate("", nil)
	}
	c := res.Caller
	switch {
	case errors.Is(res.Err, auth.ErrLockedOut):
		return connect.NewError(connect.CodeResourceExhausted, res.Err)
	case res.Err != nil:
		return connect.NewError(connect.CodeUnauthenticated, res.Err)
	case c.Can(p):
		return nil
	case c.Name == auth.Anonymous:
		return connect.NewError(connect.CodePermissionDenied,
			fmt.Errorf("%s: needs the %s permission, which callers without credentials lack; send the bearer token (Authorization: Bearer <token>) or client certificate of a caller that has it", what, p))
	}
	return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%s: caller %q lacks the %s permission", what, c.Name, p))
}

// authorizeCheck authorizes a check or quota request of method: the check permission, and
// assert-tier when the request names a tier.
func (s *Server) authorizeCheck(ctx context.Context, method, tier string) error {
	if err := s.authorize(ctx, auth.Check, method); err != nil {
		return err
	}
	if tier != "" {
		return s.authorize(ctx, auth.AssertTier, "tier")
	}
	return nil
}

// authStatus is the HTTP status of an authorize error.
func authStatus(err error) (int, string) {
	if ce := new(connect.Error); errors.As(err, &ce) {
		switch ce.Code() {
		case connect.CodePermissionDenied:
			return http.StatusForbidden, "permission_denied"
		case connect.CodeResourceExhausted:
			return http.StatusTooManyRequests, "rate_limited"
		}
	}
	return http.StatusUnauthorized, "unauthenticated"
}

// writeAuthError answers an authorize error as JSON, with Retry-After for a locked-out source.
func writeAuthError(w http.ResponseWriter, err error) {
	status, code := authStatus(err)
	if le := new(auth.LockedOutError); errors.As(err, &le) {
		w.Header().Set("Retry-After", strconv.FormatInt(ratelimitheader.CeilSeconds(ratelimitheader.CeilMillis(le.RetryAfter)), 10))
	}
	writeJSONError(w, status, code, connectMessage(err))
}

// connState is the TLS state of a request: r.TLS, or, on a port split by internal/grpcsplit
// (whose connections net/http does not see as *tls.Conn), the state ConnContext stored.
func connState(r *http.Request) *tls.ConnectionState {
	if r.TLS != nil {
		return r.TLS
	}
	if st, ok := r.Context().Value(tlsStateKey{}).(*tls.ConnectionState); ok {
		return st
	}
	return nil
}

type tlsStateKey struct{}

// connectMessage is a Connect error's message without the code prefix, for JSON bodies.
func connectMessage(err error) string {
	if ce := new(connect.Error); errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}

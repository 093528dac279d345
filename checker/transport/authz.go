package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"

	"connectrpc.com/connect"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/quotaflow/quotaflow/checker/auth"
)

// authenticate wraps h so that every request carries who sent it (auth.CallerFrom): HTTP/1.1
// and h2c alike, Connect, gRPC-Web and forward-auth.
func (s *Server) authenticate(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := s.callers.Authenticate(r.Header.Get("Authorization"), connState(r))
		h.ServeHTTP(w, r.WithContext(auth.WithResult(r.Context(), auth.Result{Caller: c, Err: err})))
	})
}

// authenticateGRPC is authenticate for a grpc-go call: the authorization metadata and the
// peer's TLS state.
func (s *Server) authenticateGRPC(ctx context.Context) context.Context {
	var authorization string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("authorization"); len(v) > 0 {
			authorization = v[0]
		}
	}
	var state *tls.ConnectionState
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			state = &ti.State
		}
	}
	c, err := s.callers.Authenticate(authorization, state)
	return auth.WithResult(ctx, auth.Result{Caller: c, Err: err})
}

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
	if ce := new(connect.Error); errors.As(err, &ce) && ce.Code() == connect.CodePermissionDenied {
		return http.StatusForbidden, "permission_denied"
	}
	return http.StatusUnauthorized, "unauthenticated"
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

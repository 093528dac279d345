// Package bearer is the Bearer scheme of the Authorization header (RFC 6750), both ways: the
// checker's callers and the admin API read tokens with Token, and every client of quotaflow
// sends them with Header or Interceptor, so that the two sides cannot spell it differently.
package bearer

import (
	"context"
	"strings"

	"connectrpc.com/connect"
)

// Token returns the token of an Authorization header's value: the scheme "Bearer" in any case,
// a space, then the token, surrounding white space ignored. ok is false for another scheme, no
// token, or an empty value; callers answer that as unauthenticated, naming the form wanted.
func Token(authorization string) (token string, ok bool) {
	scheme, tok, found := strings.Cut(authorization, " ")
	tok = strings.TrimSpace(tok)
	if !found || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return "", false
	}
	return tok, true
}

// Header returns the Authorization header's value that carries token.
func Header(token string) string { return "Bearer " + token }

// Interceptor sets the Authorization header of every unary call to carry token.
func Interceptor(token string) connect.UnaryInterceptorFunc {
	value := Header(token)
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("Authorization", value)
			return next(ctx, req)
		}
	}
}

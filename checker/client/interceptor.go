package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// RPCRequestFunc returns the check of an incoming RPC of procedure ("/pkg.Service/Method"):
// its subjects from ctx (what authentication stored) or header. A Request without subjects is
// not checked; an empty Endpoint means the procedure.
type RPCRequestFunc func(ctx context.Context, procedure string, header http.Header) Request

// checkRPC decides an incoming RPC: denied is nil when it may go ahead, and admitted then the
// decision whose lease (if any) releaseAfter frees once the call is done. An admitted call
// returns after the wait its decision gave (Decision.Delay); err is ctx's when it ended first.
func (c *Client) checkRPC(ctx context.Context, f RPCRequestFunc, procedure string, header http.Header) (admitted, denied *Decision, err error) {
	req := f(ctx, procedure, header)
	if len(req.Subjects) == 0 {
		return nil, nil, nil
	}
	if req.Endpoint == "" {
		req.Endpoint = procedure
	}
	d, err := c.Check(ctx, req)
	if err != nil {
		if ctx.Err() == nil {
			c.log.Error("rate limit check failed, call let through", "procedure", procedure, "err", err)
		}
		return nil, nil, nil
	}
	if !d.Allowed {
		return nil, &d, nil
	}
	if err := d.Wait(ctx); err != nil {
		c.releaseAfter(&d)
		return nil, nil, err
	}
	return &d, nil, nil
}

func deniedMessage(d *Decision) string {
	return fmt.Sprintf("rate limit exceeded, retry after %d seconds", ceilSeconds(d.RetryAfter))
}

// connectDenied is a denial as a Connect error: ResourceExhausted with google.rpc.RetryInfo,
// and the rate limit headers of SetHeaders as its metadata.
func connectDenied(d *Decision) error {
	err := connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%s", deniedMessage(d)))
	if detail, derr := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(d.RetryAfter)}); derr == nil {
		err.AddDetail(detail)
	}
	SetHeaders(err.Meta(), *d, time.Now())
	return err
}

// connectContextError is the error of a call whose context ended while it waited its slot.
func connectContextError(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	}
	return connect.NewError(connect.CodeCanceled, err)
}

// ConnectInterceptor checks each call a connect-go handler serves (unary calls, and streams
// when they open) and answers a denied one with ResourceExhausted carrying
// google.rpc.RetryInfo. It does nothing to outgoing calls.
func (c *Client) ConnectInterceptor(f RPCRequestFunc) connect.Interceptor {
	return &connectInterceptor{c: c, f: f}
}

type connectInterceptor struct {
	c *Client
	f RPCRequestFunc
}

func (i *connectInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		admitted, denied, err := i.c.checkRPC(ctx, i.f, req.Spec().Procedure, req.Header())
		if err != nil {
			return nil, connectContextError(err)
		}
		if denied != nil {
			return nil, connectDenied(denied)
		}
		defer i.c.releaseAfter(admitted)
		return next(ctx, req)
	}
}

func (i *connectInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i *connectInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		admitted, denied, err := i.c.checkRPC(ctx, i.f, conn.Spec().Procedure, conn.RequestHeader())
		if err != nil {
			return connectContextError(err)
		}
		if denied != nil {
			return connectDenied(denied)
		}
		defer i.c.releaseAfter(admitted)
		return next(ctx, conn)
	}
}

// grpcDenied is a denial as a gRPC status: ResourceExhausted with google.rpc.RetryInfo.
func grpcDenied(d *Decision) error {
	st := status.New(codes.ResourceExhausted, deniedMessage(d))
	if withInfo, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d.RetryAfter)}); err == nil {
		st = withInfo
	}
	return st.Err()
}

// grpcHeader is the incoming metadata of ctx as an http.Header.
func grpcHeader(ctx context.Context) http.Header {
	h := http.Header{}
	md, _ := metadata.FromIncomingContext(ctx)
	for k, vs := range md {
		for _, v := range vs {
			h.Add(k, v)
		}
	}
	return h
}

// UnaryServerInterceptor checks each unary call a grpc-go server serves and answers a denied
// one with ResourceExhausted carrying google.rpc.RetryInfo.
func (c *Client) UnaryServerInterceptor(f RPCRequestFunc) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		admitted, denied, err := c.checkRPC(ctx, f, info.FullMethod, grpcHeader(ctx))
		if err != nil {
			return nil, status.FromContextError(err).Err()
		}
		if denied != nil {
			return nil, grpcDenied(denied)
		}
		defer c.releaseAfter(admitted)
		return handler(ctx, req)
	}
}

// StreamServerInterceptor checks each stream a grpc-go server serves when it opens, as
// UnaryServerInterceptor checks unary calls.
func (c *Client) StreamServerInterceptor(f RPCRequestFunc) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		admitted, denied, err := c.checkRPC(ss.Context(), f, info.FullMethod, grpcHeader(ss.Context()))
		if err != nil {
			return status.FromContextError(err).Err()
		}
		if denied != nil {
			return grpcDenied(denied)
		}
		defer c.releaseAfter(admitted)
		return handler(srv, ss)
	}
}

package loadgen

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"connectrpc.com/connect"
	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotaflow/quotaflow/checker/client"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// dimensions maps a Dimension to the RPC's dimension and the RLS descriptor key.
var dimensions = map[Dimension]struct {
	dim    quotaflowv1.Dimension
	rlsKey string
}{
	DimensionUser:   {quotaflowv1.Dimension_DIMENSION_USER, "user_id"},
	DimensionIP:     {quotaflowv1.Dimension_DIMENSION_IP, "remote_address"},
	DimensionAPIKey: {quotaflowv1.Dimension_DIMENSION_API_KEY, "api_key"},
}

// call sends the checks of one RPC, one per subject in ids (one unless Config.Batch), and
// counts their answers; err is why the others got no answer. Each worker gets its own, so
// that it may reuse its request.
type call func(ctx context.Context, ids []string) (answers, error)

// answers counts the answers of one call. Of the allowed and denied, degraded were answered
// by the checker's fail modes (Redis did not answer in time), degradedDenied denied so: a
// bench that pushes Redis past its timeout measures those, not the limits. Only quotaflow's
// own protocols (Connect, gRPC) say so; RLS and Gubernator answers do not.
type answers struct{ allowed, denied, degraded, degradedDenied int }

// add counts one check's answer.
func (a *answers) add(allowed, degraded bool) {
	switch {
	case allowed:
		a.allowed++
	default:
		a.denied++
	}
	if degraded {
		a.degraded++
		if !allowed {
			a.degradedDenied++
		}
	}
}

// single adapts a call of one check, which answers whether it was allowed and degraded.
func single(one func(ctx context.Context, id string) (allowed, degraded bool, err error)) call {
	return func(ctx context.Context, ids []string) (answers, error) {
		var a answers
		allowed, degraded, err := one(ctx, ids[0])
		if err == nil {
			a.add(allowed, degraded)
		}
		return a, err
	}
}

// batchCounts counts the answers of a CheckRateLimits; err is the first check's error.
func batchCounts(results []*quotaflowv1.CheckRateLimitsResult, want int) (a answers, err error) {
	for _, r := range results {
		if r.GetResponse() == nil {
			if err == nil {
				err = fmt.Errorf("CheckRateLimits: %s", r.GetError().GetMessage())
			}
			continue
		}
		a.add(r.GetResponse().Allowed, r.GetResponse().Degraded)
	}
	if len(results) != want && err == nil {
		err = fmt.Errorf("CheckRateLimits: %d results for %d checks", len(results), want)
	}
	return a, err
}

// batchRequest is a CheckRateLimits request of n checks of dim on endpoint, whose identifiers
// fill sets before each call.
func batchRequest(dim quotaflowv1.Dimension, endpoint, entitlement string, n int) (req *quotaflowv1.CheckRateLimitsRequest, fill func(ids []string)) {
	req = &quotaflowv1.CheckRateLimitsRequest{Checks: make([]*quotaflowv1.CheckRateLimitRequest, n)}
	for i := range req.Checks {
		req.Checks[i] = &quotaflowv1.CheckRateLimitRequest{Dimension: dim, Endpoint: endpoint, Entitlement: entitlement}
	}
	return req, func(ids []string) {
		for i, id := range ids {
			req.Checks[i].Identifier = id
		}
	}
}

// newTarget returns a maker of per-worker calls for cfg's protocol and a function releasing the
// connections. cfg must be valid.
func newTarget(cfg *Config) (newCall func() call, closeFn func(), err error) {
	u, err := url.Parse(cfg.Target)
	if err != nil {
		return nil, nil, &ConfigError{Field: "Target", Msg: err.Error(), Err: err}
	}
	if cfg.Protocol == ProtocolConnect {
		return connectTarget(cfg)
	}
	// grpc, rls and gubernator: grpc-go clients on one HTTP/2 connection, as Envoy and gRPC
	// services call.
	conn, err := grpcConn(u)
	if err != nil {
		return nil, nil, &ConfigError{Field: "Target", Msg: err.Error(), Err: err}
	}
	closeConn := func() { conn.Close() }
	switch cfg.Protocol {
	case ProtocolGRPC:
		return grpcCalls(cfg, quotaflowv1.NewRateLimiterClient(conn)), closeConn, nil
	case ProtocolGubernator:
		return gubernatorCalls(cfg, conn), closeConn, nil
	}
	return rlsCalls(cfg, ratelimitv3.NewRateLimitServiceClient(conn)), closeConn, nil
}

// connectTarget is newTarget for ProtocolConnect: Connect over HTTP/1.1, as a web service
// behind a gateway calls.
func connectTarget(cfg *Config) (newCall func() call, closeFn func(), err error) {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: cfg.Timeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        cfg.Concurrency,
		MaxIdleConnsPerHost: cfg.Concurrency,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		Protocols:           new(http.Protocols),
	}
	tr.Protocols.SetHTTP1(true)
	// Responses are not compressed: the generator and the checker share the CPU, and
	// gateways do not compress these small messages either.
	rpc := client.NewRPC(strings.TrimSuffix(cfg.Target, "/"), client.RPCConfig{HTTPClient: &http.Client{Transport: tr},
		Options: []connect.ClientOption{connect.WithAcceptCompression("gzip", nil, nil)}})
	dim := dimensions[cfg.Dimension].dim
	return func() call {
		if cfg.Batch > 1 {
			req, fill := batchRequest(dim, cfg.Endpoint, cfg.Entitlement, cfg.Batch)
			return func(ctx context.Context, ids []string) (answers, error) {
				fill(ids)
				resp, err := rpc.CheckRateLimits(ctx, connect.NewRequest(req))
				if err != nil {
					return answers{}, err
				}
				return batchCounts(resp.Msg.Results, len(ids))
			}
		}
		msg := &quotaflowv1.CheckRateLimitRequest{Dimension: dim, Endpoint: cfg.Endpoint, Entitlement: cfg.Entitlement}
		return single(func(ctx context.Context, id string) (bool, bool, error) {
			msg.Identifier = id
			resp, err := rpc.CheckRateLimit(ctx, connect.NewRequest(msg))
			if err != nil {
				return false, false, err
			}
			return resp.Msg.Allowed, resp.Msg.Degraded, nil
		})
	}, tr.CloseIdleConnections, nil
}

// grpcConn is one HTTP/2 connection to u's host, at its scheme's port when it names none,
// over TLS for https.
func grpcConn(u *url.URL) (*grpc.ClientConn, error) {
	host := u.Host
	if u.Port() == "" {
		port := "80"
		if u.Scheme == "https" {
			port = "443"
		}
		host = net.JoinHostPort(u.Hostname(), port)
	}
	creds := insecure.NewCredentials()
	if u.Scheme == "https" {
		creds = credentials.NewTLS(&tls.Config{ServerName: u.Hostname()})
	}
	return grpc.NewClient(host, grpc.WithTransportCredentials(creds))
}

// grpcCalls makes the calls of ProtocolGRPC: CheckRateLimit, or CheckRateLimits of a batch.
func grpcCalls(cfg *Config, rpc quotaflowv1.RateLimiterClient) func() call {
	dim := dimensions[cfg.Dimension].dim
	return func() call {
		if cfg.Batch > 1 {
			req, fill := batchRequest(dim, cfg.Endpoint, cfg.Entitlement, cfg.Batch)
			return func(ctx context.Context, ids []string) (answers, error) {
				fill(ids)
				resp, err := rpc.CheckRateLimits(ctx, req)
				if err != nil {
					return answers{}, err
				}
				return batchCounts(resp.Results, len(ids))
			}
		}
		msg := &quotaflowv1.CheckRateLimitRequest{Dimension: dim, Endpoint: cfg.Endpoint, Entitlement: cfg.Entitlement}
		return single(func(ctx context.Context, id string) (bool, bool, error) {
			msg.Identifier = id
			resp, err := rpc.CheckRateLimit(ctx, msg)
			if err != nil {
				return false, false, err
			}
			return resp.Allowed, resp.Degraded, nil
		})
	}
}

// gubernatorCalls makes the calls of ProtocolGubernator, whose answers say nothing of
// degradation.
func gubernatorCalls(cfg *Config, conn *grpc.ClientConn) func() call {
	return func() call {
		one := gubernatorCall(conn, cfg.Endpoint)
		return single(func(ctx context.Context, id string) (bool, bool, error) {
			allowed, err := one(ctx, id)
			return allowed, false, err
		})
	}
}

// rlsCalls makes the calls of ProtocolRLS: ShouldRateLimit of one descriptor, the subject and
// the endpoint's path.
func rlsCalls(cfg *Config, rls ratelimitv3.RateLimitServiceClient) func() call {
	rlsKey := dimensions[cfg.Dimension].rlsKey
	return func() call {
		subject := &rlcommonv3.RateLimitDescriptor_Entry{Key: rlsKey}
		req := &ratelimitv3.RateLimitRequest{Domain: cfg.Domain, Descriptors: []*rlcommonv3.RateLimitDescriptor{{
			Entries: []*rlcommonv3.RateLimitDescriptor_Entry{subject, {Key: "path", Value: cfg.Endpoint}},
		}}}
		return single(func(ctx context.Context, id string) (bool, bool, error) {
			subject.Value = id
			resp, err := rls.ShouldRateLimit(ctx, req)
			if err != nil {
				return false, false, err
			}
			switch resp.OverallCode {
			case ratelimitv3.RateLimitResponse_OK:
				return true, false, nil
			case ratelimitv3.RateLimitResponse_OVER_LIMIT:
				return false, false, nil
			}
			return false, false, fmt.Errorf("ShouldRateLimit: overall code %s", resp.OverallCode)
		})
	}
}

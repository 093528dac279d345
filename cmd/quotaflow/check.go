package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/quotaflow/quotaflow/checker/client"
	"github.com/quotaflow/quotaflow/internal/app/report"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

// deniedError is a check that was answered "no" (exit status 3), so scripts can branch on it.
type deniedError struct{ retryAfter int64 }

func (e deniedError) Error() string {
	return fmt.Sprintf("denied: retry after %ds", e.retryAfter)
}

func runCheck(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("check", `Asks a checker whether a request may go ahead, and prints the decision and every evaluated
limit. Name at least one subject (--user, --ip, --api-key, --custom). Exit status: 0 allowed, 3 denied,
1 on an error, 2 on a bad command line.`, stderr)
	var rf rpcFlags
	rf.register(fs)
	var (
		user, ip, apiKey, endpoint, tier, idem string
		custom                                 []string
		cost, estimate                         int64
		peek, asJSON                           bool
		reserveTTL                             time.Duration
	)
	fs.StringVar(&user, "user", "", "user id subject")
	fs.StringVar(&ip, "ip", "", "client IP subject")
	fs.StringVar(&apiKey, "api-key", "", "API key subject")
	fs.Func("custom", "a custom dimension's value, `name=value` (tenant=acme); repeat it for several, in order", func(v string) error {
		if name, value, ok := strings.Cut(v, "="); !ok || name == "" || value == "" {
			return fmt.Errorf("want name=value (tenant=acme), got %q", v)
		}
		custom = append(custom, v)
		return nil
	})
	fs.StringVar(&endpoint, "endpoint", "", "endpoint being called, e.g. /api/v1/orders (required)")
	fs.Int64Var(&cost, "cost", 1, "units the call consumes")
	fs.StringVar(&tier, "tier", "", "tier to check under (default: the subjects' configured tier); needs a caller token with the assert-tier permission")
	fs.StringVar(&idem, "idempotency-key", "", "makes a retry of an allowed check replay it, uncharged, for 5 minutes (a denied check is decided afresh)")
	fs.BoolVar(&peek, "peek", false, "report the remaining quota without consuming (GetRemainingQuota)")
	fs.Int64Var(&estimate, "estimate", 0, "reserve this many units instead of --cost, settled later with quotaflow settle (Reserve)")
	fs.DurationVar(&reserveTTL, "reserve-ttl", 0, "how long a reservation waits for its settle before its estimate stands (0: the checker's 5m)")
	fs.BoolVar(&asJSON, "json", false, "print the response as JSON")
	if err := fs.parse(args, getenv); err != nil {
		return err
	}
	var subjects []*quotaflowv1.Subject
	for _, s := range []struct {
		dim quotaflowv1.Dimension
		id  string
	}{{quotaflowv1.Dimension_DIMENSION_USER, user}, {quotaflowv1.Dimension_DIMENSION_IP, ip}, {quotaflowv1.Dimension_DIMENSION_API_KEY, apiKey}} {
		if s.id != "" {
			subjects = append(subjects, &quotaflowv1.Subject{Dimension: s.dim, Identifier: s.id})
		}
	}
	for _, c := range custom {
		name, value, _ := strings.Cut(c, "=")
		subjects = append(subjects, &quotaflowv1.Subject{CustomDimension: name, Identifier: value})
	}
	if len(subjects) == 0 {
		return usageError{errors.New("name a subject: --user, --ip, --api-key or --custom")}
	}
	if endpoint == "" {
		return usageError{errors.New("--endpoint is required")}
	}
	if estimate != 0 && (cost != 1 || peek || idem != "") {
		return usageError{errors.New("--estimate: a reservation's cost is its estimate; leave out --cost, --peek and --idempotency-key")}
	}
	if reserveTTL != 0 && estimate == 0 {
		return usageError{errors.New("--reserve-ttl: only with --estimate")}
	}
	rpc, err := rf.client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, rf.timeout)
	defer cancel()
	var (
		msg     proto.Message
		summary report.Decision
	)
	switch {
	case estimate != 0:
		resp, err := rpc.Reserve(ctx, connect.NewRequest(&quotaflowv1.ReserveRequest{
			Check: &quotaflowv1.CheckRateLimitRequest{Subjects: subjects, Endpoint: endpoint, Tier: tier,
				Timestamp: time.Now().UnixMilli()},
			Estimate: estimate, TtlMs: reserveTTL.Milliseconds()}))
		if err != nil {
			return fmt.Errorf("Reserve: %w", err)
		}
		msg, summary = resp.Msg, report.ReserveDecision(resp.Msg)
	case peek:
		resp, err := rpc.GetRemainingQuota(ctx, connect.NewRequest(&quotaflowv1.GetRemainingQuotaRequest{
			Subjects: subjects, Endpoint: endpoint, Cost: cost, Tier: tier}))
		if err != nil {
			return fmt.Errorf("GetRemainingQuota: %w", err)
		}
		msg, summary = resp.Msg, report.QuotaDecision(resp.Msg)
	default:
		resp, err := rpc.CheckRateLimit(ctx, connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
			Subjects: subjects, Endpoint: endpoint, Cost: cost, Tier: tier, IdempotencyKey: idem,
			Timestamp: time.Now().UnixMilli()}))
		if err != nil {
			return fmt.Errorf("CheckRateLimit: %w", err)
		}
		msg, summary = resp.Msg, report.CheckDecision(resp.Msg)
	}
	if asJSON {
		b, err := protojson.MarshalOptions{Multiline: true, EmitUnpopulated: true}.Marshal(msg)
		if err != nil {
			return fmt.Errorf("encode response: %w", err)
		}
		fmt.Fprintln(stdout, string(b))
	} else if err := summary.Write(stdout); err != nil {
		return err
	}
	if !summary.Allowed {
		return deniedError{summary.RetryAfter}
	}
	return nil
}

// checkProtocols are the values of --protocol.
var checkProtocols = map[string]client.Protocol{"connect": client.Connect, "grpc": client.GRPC, "grpcweb": client.GRPCWeb}

// newClient makes a RateLimiter client speaking protocol; gRPC uses cleartext HTTP/2.
func newClient(target, protocol, token string) (quotaflowv1connect.RateLimiterClient, error) {
	p, ok := checkProtocols[protocol]
	if !ok {
		return nil, usageError{fmt.Errorf("--protocol: want connect, grpc or grpcweb, got %q", protocol)}
	}
	if !strings.HasPrefix(target, "http://") && !strings.HasPrefix(target, "https://") {
		return nil, usageError{fmt.Errorf("--target: want an http:// or https:// URL, got %q", target)}
	}
	// Connect and gRPC-Web keep the default client (HTTP/1.1, HTTP/2 over TLS); gRPC needs
	// HTTP/2, which the client builder's provides.
	hc := http.DefaultClient
	if p == client.GRPC {
		hc = nil
	}
	return client.NewRPC(target, client.RPCConfig{Protocol: p, HTTPClient: hc, Token: token}), nil
}

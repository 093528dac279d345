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
	var f checkFlags
	f.register(fs)
	if err := fs.parse(args, getenv); err != nil {
		return err
	}
	subjects := f.subjects()
	if err := f.validate(subjects); err != nil {
		return usageError{err}
	}
	rpc, err := rf.client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, rf.timeout)
	defer cancel()
	msg, summary, err := f.ask(ctx, rpc, subjects)
	if err != nil {
		return err
	}
	if f.asJSON {
		b, err := report.ProtoJSON(msg)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, b)
	} else if err := summary.Write(stdout); err != nil {
		return err
	}
	if !summary.Allowed {
		return deniedError{summary.RetryAfter}
	}
	return nil
}

// checkFlags say what check asks: of which subjects, on which endpoint, in which call.
type checkFlags struct {
	user, ip, apiKey, endpoint, tier, idem string
	custom                                 []string
	cost, estimate                         int64
	peek, asJSON                           bool
	reserveTTL                             time.Duration
}

func (f *checkFlags) register(fs *flagSet) {
	fs.StringVar(&f.user, "user", "", "user id subject")
	fs.StringVar(&f.ip, "ip", "", "client IP subject")
	fs.StringVar(&f.apiKey, "api-key", "", "API key subject")
	fs.Func("custom", "a custom dimension's value, `name=value` (tenant=acme); repeat it for several, in order", func(v string) error {
		if name, value, ok := strings.Cut(v, "="); !ok || name == "" || value == "" {
			return fmt.Errorf("want name=value (tenant=acme), got %q", v)
		}
		f.custom = append(f.custom, v)
		return nil
	})
	fs.StringVar(&f.endpoint, "endpoint", "", "endpoint being called, e.g. /api/v1/orders (required)")
	fs.Int64Var(&f.cost, "cost", 1, "units the call consumes")
	fs.StringVar(&f.tier, "tier", "", "tier to check under (default: the subjects' configured tier); needs a caller token with the assert-tier permission")
	fs.StringVar(&f.idem, "idempotency-key", "", "makes a retry of an allowed check replay it, uncharged, for 5 minutes (a denied check is decided afresh)")
	fs.BoolVar(&f.peek, "peek", false, "report the remaining quota without consuming (GetRemainingQuota)")
	fs.Int64Var(&f.estimate, "estimate", 0, "reserve this many units instead of --cost, settled later with quotaflow settle (Reserve)")
	fs.DurationVar(&f.reserveTTL, "reserve-ttl", 0, "how long a reservation waits for its settle before its estimate stands (0: the checker's 5m)")
	fs.BoolVar(&f.asJSON, "json", false, "print the response as JSON")
}

// subjects are the subjects the flags name: user, IP, API key, then the custom ones in order.
func (f *checkFlags) subjects() []*quotaflowv1.Subject {
	var subjects []*quotaflowv1.Subject
	for _, s := range []struct {
		dim quotaflowv1.Dimension
		id  string
	}{{quotaflowv1.Dimension_DIMENSION_USER, f.user}, {quotaflowv1.Dimension_DIMENSION_IP, f.ip}, {quotaflowv1.Dimension_DIMENSION_API_KEY, f.apiKey}} {
		if s.id != "" {
			subjects = append(subjects, &quotaflowv1.Subject{Dimension: s.dim, Identifier: s.id})
		}
	}
	for _, c := range f.custom {
		name, value, _ := strings.Cut(c, "=")
		subjects = append(subjects, &quotaflowv1.Subject{CustomDimension: name, Identifier: value})
	}
	return subjects
}

// validate refuses a check of nobody, of no endpoint, or mixing a reservation with the flags
// of a plain check.
func (f *checkFlags) validate(subjects []*quotaflowv1.Subject) error {
	switch {
	case len(subjects) == 0:
		return errors.New("name a subject: --user, --ip, --api-key or --custom")
	case f.endpoint == "":
		return errors.New("--endpoint is required")
	case f.estimate != 0 && (f.cost != 1 || f.peek || f.idem != ""):
		return errors.New("--estimate: a reservation's cost is its estimate; leave out --cost, --peek and --idempotency-key")
	case f.reserveTTL != 0 && f.estimate == 0:
		return errors.New("--reserve-ttl: only with --estimate")
	}
	return nil
}

// ask makes the call the flags choose (Reserve, GetRemainingQuota or CheckRateLimit) and
// returns its response and decision.
func (f *checkFlags) ask(ctx context.Context, rpc quotaflowv1connect.RateLimiterClient, subjects []*quotaflowv1.Subject) (proto.Message, report.Decision, error) {
	switch {
	case f.estimate != 0:
		resp, err := rpc.Reserve(ctx, connect.NewRequest(&quotaflowv1.ReserveRequest{
			Check: &quotaflowv1.CheckRateLimitRequest{Subjects: subjects, Endpoint: f.endpoint, Tier: f.tier,
				Timestamp: time.Now().UnixMilli()},
			Estimate: f.estimate, TtlMs: f.reserveTTL.Milliseconds()}))
		if err != nil {
			return nil, report.Decision{}, fmt.Errorf("Reserve: %w", err)
		}
		return resp.Msg, report.ReserveDecision(resp.Msg), nil
	case f.peek:
		resp, err := rpc.GetRemainingQuota(ctx, connect.NewRequest(&quotaflowv1.GetRemainingQuotaRequest{
			Subjects: subjects, Endpoint: f.endpoint, Cost: f.cost, Tier: f.tier}))
		if err != nil {
			return nil, report.Decision{}, fmt.Errorf("GetRemainingQuota: %w", err)
		}
		return resp.Msg, report.QuotaDecision(resp.Msg), nil
	}
	resp, err := rpc.CheckRateLimit(ctx, connect.NewRequest(&quotaflowv1.CheckRateLimitRequest{
		Subjects: subjects, Endpoint: f.endpoint, Cost: f.cost, Tier: f.tier, IdempotencyKey: f.idem,
		Timestamp: time.Now().UnixMilli()}))
	if err != nil {
		return nil, report.Decision{}, fmt.Errorf("CheckRateLimit: %w", err)
	}
	return resp.Msg, report.CheckDecision(resp.Msg), nil
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

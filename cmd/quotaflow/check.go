package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/quotaflow/quotaflow/checker/client"
	"github.com/quotaflow/quotaflow/internal/app/report"
	"github.com/quotaflow/quotaflow/internal/cli"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

func runCheck(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("check", help("check"), stderr)
	var rf rpcFlags
	rf.register(fs)
	var f checkFlags
	f.register(fs)
	if err := fs.Parse(args, getenv); err != nil {
		return err
	}
	if err := f.validate(); err != nil {
		return cli.Usage(err)
	}
	return rf.call(ctx, stdout, func(ctx context.Context, rpc quotaflowv1connect.RateLimiterClient) (string, error) {
		msg, summary, err := f.Ask(ctx, rpc)
		if err != nil {
			return "", err
		}
		var text string
		if f.asJSON {
			text, err = report.ProtoJSON(msg)
		} else {
			var out strings.Builder
			err = summary.Write(&out)
			text = strings.TrimSuffix(out.String(), "\n")
		}
		if err == nil && !summary.Allowed {
			err = denied(summary.RetryAfter)
		}
		return text, err
	})
}

// denied is a check that was answered "no" (exit status 3), so scripts can branch on it; the
// answer is printed already.
func denied(retryAfter int64) error {
	return cli.Status{Code: 3, Err: fmt.Errorf("denied: retry after %ds", retryAfter), Shown: true}
}

// checkFlags say what check asks: of which subjects, on which endpoint, in which call.
type checkFlags struct {
	report.Check
	asJSON bool
}

func (f *checkFlags) register(fs *cli.FlagSet) {
	fs.StringVar(&f.User, "user", "", "user id subject")
	fs.StringVar(&f.IP, "ip", "", "client IP subject")
	fs.StringVar(&f.APIKey, "api-key", "", "API key subject")
	fs.Func("custom", "a custom dimension's value, `name=value` (tenant=acme); repeat it for several, in order", func(v string) error {
		if name, value, ok := strings.Cut(v, "="); !ok || name == "" || value == "" {
			return fmt.Errorf("want name=value (tenant=acme), got %q", v)
		}
		f.Custom = append(f.Custom, v)
		return nil
	})
	fs.StringVar(&f.Endpoint, "endpoint", "", "endpoint being called, e.g. /api/v1/orders (required)")
	fs.Int64Var(&f.Cost, "cost", 1, "units the call consumes")
	fs.StringVar(&f.Tier, "tier", "", "tier to check under (default: the subjects' configured tier); needs a caller token with the assert-tier permission")
	fs.StringVar(&f.IdempotencyKey, "idempotency-key", "", "makes a retry of an allowed check replay it, uncharged, for 5 minutes (a denied check is decided afresh)")
	fs.BoolVar(&f.Peek, "peek", false, "report the remaining quota without consuming (GetRemainingQuota)")
	fs.Int64Var(&f.Estimate, "estimate", 0, "reserve this many units instead of --cost, settled later with quotaflow settle (Reserve)")
	fs.DurationVar(&f.ReserveTTL, "reserve-ttl", 0, "how long a reservation waits for its settle before its estimate stands (0: the checker's 5m)")
	fs.BoolVar(&f.asJSON, "json", false, "print the response as JSON")
}

// validate refuses a check of nobody, of no endpoint, or mixing a reservation with the flags
// of a plain check.
func (f *checkFlags) validate() error {
	switch {
	case len(f.Subjects()) == 0:
		return errors.New("name a subject: --user, --ip, --api-key or --custom")
	case f.Endpoint == "":
		return errors.New("--endpoint is required")
	case f.Estimate != 0 && (f.Cost != 1 || f.Peek || f.IdempotencyKey != ""):
		return errors.New("--estimate: a reservation's cost is its estimate; leave out --cost, --peek and --idempotency-key")
	case f.ReserveTTL != 0 && f.Estimate == 0:
		return errors.New("--reserve-ttl: only with --estimate")
	}
	return nil
}

// newClient makes a RateLimiter client speaking protocol; gRPC uses cleartext HTTP/2.
func newClient(target string, p client.Protocol, token string) (quotaflowv1connect.RateLimiterClient, error) {
	if !strings.HasPrefix(target, "http://") && !strings.HasPrefix(target, "https://") {
		return nil, cli.Usagef("--target: want an http:// or https:// URL, got %q", target)
	}
	// Connect and gRPC-Web keep the default client (HTTP/1.1, HTTP/2 over TLS); gRPC needs
	// HTTP/2, which the client builder's provides.
	hc := http.DefaultClient
	if p == client.GRPC {
		hc = nil
	}
	return client.NewRPC(target, client.RPCConfig{Protocol: p, HTTPClient: hc, Token: token}), nil
}

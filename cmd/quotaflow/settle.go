package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/quotaflow/quotaflow/checker/client"
	"github.com/quotaflow/quotaflow/internal/app/report"
	"github.com/quotaflow/quotaflow/internal/cli"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

// rpcFlags are the flags of the commands that call the check API once: where, how, as whom.
type rpcFlags struct {
	target, token string
	protocol      client.Protocol
	timeout       time.Duration
}

func (f *rpcFlags) register(fs *cli.FlagSet) {
	fs.StringVar(&f.target, "target", "http://127.0.0.1:8080", "checker base `URL`")
	fs.FromEnv("target")
	fs.TextVar(&f.protocol, "protocol", client.Connect, "wire `protocol`: connect, grpc or grpcweb")
	fs.StringVar(&f.token, "token", "", "bearer `token` of a caller of the check API (--callers-file), or an admin write token")
	fs.FromEnvAs("token", "QUOTAFLOW_CALLER_TOKEN")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Second, "deadline of the call")
}

// call makes one call of the check API within --timeout and prints the text it returns, also
// with an error (a denial).
func (f *rpcFlags) call(ctx context.Context, stdout io.Writer, call func(context.Context, quotaflowv1connect.RateLimiterClient) (string, error)) error {
	rpc, err := newClient(f.target, f.protocol, f.token)
	if err != nil {
		return err
	}
	ctx, stop := context.WithTimeout(ctx, f.timeout)
	defer stop()
	text, err := call(ctx, rpc)
	if text != "" {
		fmt.Fprintln(stdout, text)
	}
	return err
}

func runSettle(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("settle", help("settle"), stderr)
	var rf rpcFlags
	rf.register(fs)
	var (
		id     string
		actual int64
		cancel bool
	)
	fs.StringVar(&id, "id", "", "the reservation's id (required)")
	fs.Int64Var(&actual, "actual", -1, "units the work took, 0 or more (required unless --cancel)")
	fs.BoolVar(&cancel, "cancel", false, "refund the whole estimate instead")
	if err := fs.Parse(args, getenv); err != nil {
		return err
	}
	switch {
	case id == "":
		return cli.Usagef("--id is required")
	case cancel && actual != -1:
		return cli.Usagef("--cancel refunds the whole estimate: leave out --actual")
	case !cancel && actual < 0:
		return cli.Usagef("--actual: want the units the work took, 0 or more (or --cancel)")
	}
	return rf.call(ctx, stdout, func(ctx context.Context, rpc quotaflowv1connect.RateLimiterClient) (string, error) {
		return report.Settle(ctx, rpc, id, actual, cancel)
	})
}

func runRelease(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("release", help("release"), stderr)
	var rf rpcFlags
	rf.register(fs)
	var (
		id    string
		renew bool
	)
	fs.StringVar(&id, "lease", "", "the lease's id (required)")
	fs.BoolVar(&renew, "renew", false, "extend the lease instead of releasing it")
	if err := fs.Parse(args, getenv); err != nil {
		return err
	}
	if id == "" {
		return cli.Usagef("--lease is required")
	}
	return rf.call(ctx, stdout, func(ctx context.Context, rpc quotaflowv1connect.RateLimiterClient) (string, error) {
		return report.Release(ctx, rpc, id, renew)
	})
}

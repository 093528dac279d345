package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/quotaflow/quotaflow/internal/app/report"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

// rpcFlags are the flags of the commands that call the check API once: where, how, as whom.
type rpcFlags struct {
	target, protocol, token string
	timeout                 time.Duration
}

func (f *rpcFlags) register(fs *flagSet) {
	fs.StringVar(&f.target, "target", "http://127.0.0.1:8080", "checker base `URL`")
	fs.fromEnv("target")
	fs.StringVar(&f.protocol, "protocol", "connect", "wire protocol: connect, grpc or grpcweb")
	fs.StringVar(&f.token, "token", "", "bearer `token` of a caller of the check API (--callers-file), or an admin write token")
	fs.fromEnvAs("token", "QUOTAFLOW_CALLER_TOKEN")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Second, "deadline of the call")
}

func (f *rpcFlags) client() (quotaflowv1connect.RateLimiterClient, error) {
	return newClient(f.target, f.protocol, f.token)
}

func runSettle(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("settle", help("settle"), stderr)
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
	if err := fs.parse(args, getenv); err != nil {
		return err
	}
	switch {
	case id == "":
		return usageError{errors.New("--id is required")}
	case cancel && actual != -1:
		return usageError{errors.New("--cancel refunds the whole estimate: leave out --actual")}
	case !cancel && actual < 0:
		return usageError{errors.New("--actual: want the units the work took, 0 or more (or --cancel)")}
	}
	rpc, err := rf.client()
	if err != nil {
		return err
	}
	ctx, stop := context.WithTimeout(ctx, rf.timeout)
	defer stop()
	line, err := report.Settle(ctx, rpc, id, actual, cancel)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, line)
	return nil
}

func runRelease(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("release", help("release"), stderr)
	var rf rpcFlags
	rf.register(fs)
	var (
		id    string
		renew bool
	)
	fs.StringVar(&id, "lease", "", "the lease's id (required)")
	fs.BoolVar(&renew, "renew", false, "extend the lease instead of releasing it")
	if err := fs.parse(args, getenv); err != nil {
		return err
	}
	if id == "" {
		return usageError{errors.New("--lease is required")}
	}
	rpc, err := rf.client()
	if err != nil {
		return err
	}
	ctx, stop := context.WithTimeout(ctx, rf.timeout)
	defer stop()
	line, err := report.Release(ctx, rpc, id, renew)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, line)
	return nil
}

package transport

import (
	"context"
	"testing"

	"connectrpc.com/connect"
	"connectrpc.com/grpcreflect"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/auth"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
)

// TestHideReflection: with Config.HideReflection neither stack describes the services, to a
// gRPC client (grpc-go's side of the port) or a gRPC-Web or Connect one (connect-go's);
// without it both do.
func TestHideReflection(t *testing.T) {
	t.Parallel()
	callers := new(auth.Registry)
	if err := callers.Load([]byte("anonymous: {permissions: [check]}\n")); err != nil {
		t.Fatal(err)
	}
	rdb := redisSrv.UniversalClient()
	t.Cleanup(func() { rdb.Close() })
	engine := checker.New(checker.Config{Redis: rdb, Rules: mustRules(t, testRules), Logger: checkertest.Logger(), RedisTimeout: loadedTimeout})
	t.Cleanup(func() { engine.Close() })
	for _, hide := range []bool{false, true} {
		srv := New(engine, Config{Callers: callers, HideReflection: hide, Logger: checkertest.Logger()})
		url := serve(t, srv, srv.Handler())
		for protocol, opts := range map[string][]connect.ClientOption{
			"grpc":    {connect.WithGRPC()},
			"grpcweb": {connect.WithGRPCWeb()},
			"connect": nil,
		} {
			hc := h2cClient()
			t.Cleanup(hc.CloseIdleConnections)
			stream := grpcreflect.NewClient(hc, url, opts...).NewStream(context.Background())
			names, err := stream.ListServices()
			stream.Close()
			switch {
			case hide && connect.CodeOf(err) != connect.CodeUnimplemented:
				t.Errorf("HideReflection, %s: ListServices = %v, %v; want Unimplemented", protocol, names, err)
			case !hide && (err != nil || len(names) == 0):
				t.Errorf("reflection on, %s: ListServices = %v, %v; want the services", protocol, names, err)
			}
		}
	}
}

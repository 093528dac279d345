package loadgen

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
)

// gubernatorRequest is what the fake gubernator read of a GetRateLimitsReq's one request,
// field by field as gubernator.proto numbers them.
type gubernatorRequest struct {
	requests                int
	name, key               string
	hits, limit, durationMS uint64
}

// fakeGubernator serves pb.gubernator.V1/GetRateLimits: keys starting with "deny-" are
// OVER_LIMIT, "error-" an error, others UNDER_LIMIT. It keeps the last request it read.
type fakeGubernator struct {
	mu   sync.Mutex
	last gubernatorRequest
}

func (f *fakeGubernator) getRateLimits(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
	var b []byte
	if err := dec(&b); err != nil {
		return nil, err
	}
	var r gubernatorRequest
	err := eachField(b, func(num protowire.Number, _ uint64, v []byte) {
		if num != 1 {
			return
		}
		r.requests++
		_ = eachField(v, func(num protowire.Number, n uint64, v []byte) {
			switch num {
			case 1:
				r.name = string(v)
			case 2:
				r.key = string(v)
			case 3:
				r.hits = n
			case 4:
				r.limit = n
			case 5:
				r.durationMS = n
			}
		})
	})
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.last = r
	f.mu.Unlock()
	var item []byte
	switch {
	case strings.HasPrefix(r.key, "deny-"):
		item = protowire.AppendVarint(protowire.AppendTag(item, 1, protowire.VarintType), 1)
	case strings.HasPrefix(r.key, "error-"):
		item = protowire.AppendString(protowire.AppendTag(item, 5, protowire.BytesType), "no such limit")
	default:
		item = protowire.AppendVarint(protowire.AppendTag(item, 3, protowire.VarintType), 42) // remaining
	}
	resp := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), item)
	return &resp, nil
}

// startGubernator serves f over gRPC and returns its URL.
func startGubernator(t *testing.T, f *fakeGubernator) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}))
	gs.RegisterService(&grpc.ServiceDesc{
		ServiceName: "pb.gubernator.V1",
		HandlerType: (*any)(nil),
		Methods:     []grpc.MethodDesc{{MethodName: "GetRateLimits", Handler: f.getRateLimits}},
	}, f)
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)
	return "http://" + ln.Addr().String()
}

// TestRunGubernator: ProtocolGubernator sends one GetRateLimits request per check, named after
// the endpoint, keyed by the subject, one hit of a limit no benchmark reaches; it reads
// UNDER_LIMIT as allowed, OVER_LIMIT as denied and an error reply as an error.
func TestRunGubernator(t *testing.T) {
	t.Parallel()
	f := &fakeGubernator{}
	url := startGubernator(t, f)
	tests := []struct {
		name                          string
		cfg                           Config
		wantAllowed, wantDenied, errs bool
	}{
		{"closed allowed", Config{Concurrency: 4, KeyPrefix: "ok-"}, true, false, false},
		{"open denied", Config{Rate: 200, KeyPrefix: "deny-", Endpoint: "/one"}, false, true, false},
		{"errors", Config{Concurrency: 2, KeyPrefix: "error-"}, false, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Target, tt.cfg.Protocol, tt.cfg.Duration = url, ProtocolGubernator, 300*time.Millisecond
			rep, err := Run(context.Background(), tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Checks == 0 || (rep.Allowed > 0) != tt.wantAllowed || (rep.Denied > 0) != tt.wantDenied || (rep.Errors > 0) != tt.errs {
				t.Errorf("report %+v: want allowed %v, denied %v, errors %v", rep, tt.wantAllowed, tt.wantDenied, tt.errs)
			}
		})
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	want := gubernatorRequest{requests: 1, name: "/api/v1/orders", hits: 1, limit: 1_000_000_000, durationMS: 1000}
	got := f.last
	if !strings.HasPrefix(got.key, "error-") {
		t.Errorf("last key %q: want an error- subject", got.key)
	}
	got.key = ""
	if got != want {
		t.Errorf("last request %+v, want %+v", got, want)
	}
}

// TestParseGubernatorResponse: a reply must hold exactly one response.
func TestParseGubernatorResponse(t *testing.T) {
	t.Parallel()
	one := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), nil)
	for _, tt := range []struct {
		name    string
		b       []byte
		allowed bool
		err     bool
	}{
		{"one under limit", one, true, false},
		{"none", nil, false, true},
		{"two", append(append([]byte(nil), one...), one...), false, true},
		{"truncated", one[:1], false, true},
	} {
		allowed, err := parseGubernatorResponse(tt.b)
		if allowed != tt.allowed || (err != nil) != tt.err {
			t.Errorf("%s: got %v, %v; want %v, error %v", tt.name, allowed, err, tt.allowed, tt.err)
		}
	}
}

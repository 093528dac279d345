package transport

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/auth"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

const reserveRules = `
default_tier: free
tiers: {free: {}}
rules:
  - {id: tokens, dimension: user, endpoint: /llm, algorithm: fixed_window, limit: 100, window: 1h}
`

// TestReservationRPCs: over Connect, gRPC and gRPC-Web, Reserve charges the estimate and
// answers an id; Settle charges the difference, once (a second is FailedPrecondition); Cancel
// refunds; an unknown id is NotFound; bad fields are InvalidArgument naming them.
func TestReservationRPCs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, checker.Config{Rules: mustRules(t, reserveRules)})
	for _, protocol := range []string{"connect", "grpc", "grpcweb"} {
		t.Run(protocol, func(t *testing.T) {
			c := e.client(protocol)
			ctx := context.Background()
			check := &quotaflowv1.CheckRateLimitRequest{Identifier: id(t, "u"), Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/llm"}
			reserve := func(estimate int64) *quotaflowv1.ReserveResponse {
				t.Helper()
				resp, err := c.Reserve(ctx, connect.NewRequest(&quotaflowv1.ReserveRequest{Check: check, Estimate: estimate}))
				if err != nil {
					t.Fatal(err)
				}
				return resp.Msg
			}
			r := reserve(60)
			if !r.Result.Allowed || r.ReservationId == "" || r.Result.Remaining != 40 || r.ExpiresAtMs == 0 {
				t.Fatalf("Reserve 60 of 100: %v; want allowed, an id, 40 left", r)
			}
			if d := reserve(50); d.Result.Allowed || d.ReservationId != "" {
				t.Fatalf("Reserve 50 of the 40 left: %v; want denied, no id", d)
			}
			st, err := c.Settle(ctx, connect.NewRequest(&quotaflowv1.SettleRequest{ReservationId: r.ReservationId, Actual: 20}))
			if err != nil || st.Msg.Estimate != 60 || st.Msg.Remaining != 80 || st.Msg.Overage || st.Msg.DecisionId == "" {
				t.Fatalf("Settle at 20: %v, %v; want estimate 60, 80 left", st, err)
			}
			_, err = c.Settle(ctx, connect.NewRequest(&quotaflowv1.SettleRequest{ReservationId: r.ReservationId, Actual: 20}))
			if connect.CodeOf(err) != connect.CodeFailedPrecondition {
				t.Errorf("second Settle: %v, want FailedPrecondition", err)
			}
			r = reserve(80)
			cr, err := c.Cancel(ctx, connect.NewRequest(&quotaflowv1.CancelRequest{ReservationId: r.ReservationId}))
			if err != nil || cr.Msg.Estimate != 80 || cr.Msg.Remaining != 80 {
				t.Fatalf("Cancel: %v, %v; want 80 refunded, 80 left", cr, err)
			}
			forged := "AAAAAAAAAAAAAAAAAAAAAA" + r.ReservationId[22:]
			_, err = c.Settle(ctx, connect.NewRequest(&quotaflowv1.SettleRequest{ReservationId: forged, Actual: 1}))
			if ce := new(connect.Error); !errors.As(err, &ce) || ce.Code() != connect.CodePermissionDenied || !strings.HasPrefix(ce.Message(), "reservation_id: ") {
				t.Errorf("Settle of a forged id: %v, want PermissionDenied naming reservation_id", err)
			}
			for _, tc := range []struct {
				name, field string
				call        func() error
			}{
				{"zero estimate", "estimate", func() error {
					_, err := c.Reserve(ctx, connect.NewRequest(&quotaflowv1.ReserveRequest{Check: check, Estimate: 0}))
					return err
				}},
				{"a cost", "check.cost", func() error {
					withCost := &quotaflowv1.CheckRateLimitRequest{Identifier: check.Identifier, Dimension: check.Dimension, Endpoint: "/llm", Cost: 3}
					_, err := c.Reserve(ctx, connect.NewRequest(&quotaflowv1.ReserveRequest{Check: withCost, Estimate: 3}))
					return err
				}},
				{"a long TTL", "ttl_ms", func() error {
					_, err := c.Reserve(ctx, connect.NewRequest(&quotaflowv1.ReserveRequest{Check: check, Estimate: 1, TtlMs: 90_000_000}))
					return err
				}},
				{"negative actual", "actual", func() error {
					_, err := c.Settle(ctx, connect.NewRequest(&quotaflowv1.SettleRequest{ReservationId: r.ReservationId, Actual: -1}))
					return err
				}},
				{"unknown id", "reservation_id", func() error {
					_, err := c.Cancel(ctx, connect.NewRequest(&quotaflowv1.CancelRequest{ReservationId: "nope"}))
					return err
				}},
			} {
				err := tc.call()
				if ce := new(connect.Error); !errors.As(err, &ce) || ce.Code() != connect.CodeInvalidArgument || !strings.Contains(ce.Message(), tc.field+":") {
					t.Errorf("%s: %v, want InvalidArgument naming %s", tc.name, err, tc.field)
				}
			}
		})
	}
}

// TestReservationJSON: Reserve and Settle over plain HTTP/JSON (the Connect protocol as curl
// speaks it), as docs/quotas.md ("Reserve and settle") shows.
func TestReservationJSON(t *testing.T) {
	t.Parallel()
	e := newEnv(t, checker.Config{Rules: mustRules(t, reserveRules)})
	post := func(method, body string, out any) int {
		t.Helper()
		resp, err := http.Post(e.url+"/quotaflow.v1.RateLimiter/"+method, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode
	}
	var r struct {
		Result        struct{ Allowed bool }
		ReservationID string `json:"reservationId"`
	}
	var bad struct{ Code, Message string }
	if code := post("Reserve", `{"check":{"identifier":"`+id(t, "u")+`","dimension":"DIMENSION_USER","endpoint":"/llm"},"estimate":"4000"}`, &bad); code != http.StatusBadRequest || !strings.HasPrefix(bad.Message, "estimate:") {
		t.Fatalf("Reserve of 4000 of 100: %d %+v, want 400 naming estimate", code, bad)
	}
	post("Reserve", `{"check":{"identifier":"`+id(t, "u")+`","dimension":"DIMENSION_USER","endpoint":"/llm"},"estimate":"40"}`, &r)
	var st struct {
		Estimate, Actual, Remaining string
		Overage                     bool
	}
	if code := post("Settle", `{"reservationId":"`+r.ReservationID+`","actual":"75"}`, &st); code != 200 || st.Estimate != "40" || st.Remaining != "25" {
		t.Fatalf("Settle at 75: %d %+v, want estimate 40, 25 left", code, st)
	}
	var fail struct{ Code string }
	if code := post("Settle", `{"reservationId":"`+r.ReservationID+`","actual":"75"}`, &fail); code != http.StatusBadRequest || fail.Code != "failed_precondition" {
		t.Errorf("second Settle: %d %+v, want 400 failed_precondition", code, fail)
	}
}

// TestIDsBoundToCaller: a reservation's and a lease's ids work for the caller that got them
// only: another caller's settle, cancel, release or renewal is PermissionDenied naming the id's
// field, over every protocol, and changes nothing.
func TestIDsBoundToCaller(t *testing.T) {
	t.Parallel()
	tokenA, tokenB := "caller-a-token-0123456789", "caller-b-token-0123456789"
	reg := new(auth.Registry)
	if err := reg.Load([]byte("callers:\n  - {name: a, token: " + tokenA + ", permissions: [check]}\n  - {name: b, token: " + tokenB + ", permissions: [check]}\n")); err != nil {
		t.Fatal(err)
	}
	e := newEnvWith(t, checker.Config{Caller: CallerName, Rules: mustRules(t, reserveRules+
		"  - {id: inflight, dimension: user, endpoint: /llm, algorithm: concurrency, limit: 5, window: 30s}\n")}, Config{Callers: reg})
	for _, protocol := range []string{"connect", "grpc", "grpcweb"} {
		t.Run(protocol, func(t *testing.T) {
			t.Parallel()
			c := e.client(protocol)
			ctx := context.Background()
			check := &quotaflowv1.CheckRateLimitRequest{Identifier: id(t, "u"), Dimension: quotaflowv1.Dimension_DIMENSION_USER, Endpoint: "/llm"}
			resp, err := c.Reserve(ctx, withToken(connect.NewRequest(&quotaflowv1.ReserveRequest{Check: check, Estimate: 30}), tokenA))
			if err != nil || resp.Msg.ReservationId == "" || resp.Msg.Result.LeaseId == "" {
				t.Fatalf("A's reserve: %v, %v; want a reservation and a lease", resp, err)
			}
			rid, lid := resp.Msg.ReservationId, resp.Msg.Result.LeaseId
			for name, call := range map[string]func() error{
				"settle": func() error {
					_, err := c.Settle(ctx, withToken(connect.NewRequest(&quotaflowv1.SettleRequest{ReservationId: rid, Actual: 1}), tokenB))
					return err
				},
				"cancel": func() error {
					_, err := c.Cancel(ctx, withToken(connect.NewRequest(&quotaflowv1.CancelRequest{ReservationId: rid}), tokenB))
					return err
				},
				"release": func() error {
					_, err := c.ReleaseLease(ctx, withToken(connect.NewRequest(&quotaflowv1.ReleaseLeaseRequest{LeaseId: lid}), tokenB))
					return err
				},
				"renew": func() error {
					_, err := c.RenewLease(ctx, withToken(connect.NewRequest(&quotaflowv1.RenewLeaseRequest{LeaseId: lid}), tokenB))
					return err
				},
			} {
				if err := call(); connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "_id: ") {
					t.Errorf("B's %s of A's id: %v, want PermissionDenied naming the id", name, err)
				}
			}
			st, err := c.Settle(ctx, withToken(connect.NewRequest(&quotaflowv1.SettleRequest{ReservationId: rid, Actual: 10}), tokenA))
			if err != nil || st.Msg.Estimate != 30 {
				t.Errorf("A's settle: %v, %v", st, err)
			}
			if _, err := c.ReleaseLease(ctx, withToken(connect.NewRequest(&quotaflowv1.ReleaseLeaseRequest{LeaseId: lid}), tokenA)); err != nil {
				t.Errorf("A's release: %v", err)
			}
		})
	}
}

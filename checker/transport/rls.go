package transport

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"connectrpc.com/connect"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/auth"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/calendar"
	"github.com/quotaflow/quotaflow/internal/field"
	"github.com/quotaflow/quotaflow/internal/ratelimitheader"
)

// RLSServiceName is Envoy's rate limit service, served by RLSHandler. Name it to the gRPC
// reflector so that grpcurl can call it without proto files.
const RLSServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// RLSProcedure is the one method of RLSServiceName.
const RLSProcedure = "/" + RLSServiceName + "/ShouldRateLimit"

// Bounds on ShouldRateLimit requests, beyond those of every check. A request's size is bounded
// by Config.MaxRequestBytes, as every message's.
const (
	MaxRLSDescriptors = 64
	MaxRLSEntries     = 64
)

// The descriptor entry keys quotaflow reads as its own. Every other key is an entry of the
// descriptor's custom dimensions, which only descriptor rules match, so the descriptors of an
// existing Envoy configuration may carry entries meant for other services.
var rlsKeys = map[string]rlsKey{
	"user_id":        rlsUser,
	"user":           rlsUser,
	"remote_address": rlsIP, // Envoy's remote_address action
	"ip":             rlsIP,
	"api_key":        rlsAPIKey,
	"path":           rlsEndpoint, // e.g. a request_headers action on :path
	"endpoint":       rlsEndpoint,
	"tier":           rlsTier,
}

type rlsKey uint8

const (
	rlsUser rlsKey = iota + 1
	rlsIP
	rlsAPIKey
	rlsEndpoint
	rlsTier
)

// RLSHandler serves Envoy's rate limit service v3 (envoy.service.ratelimit.v3.RateLimitService,
// method ShouldRateLimit) over gRPC, gRPC-Web and Connect, so that Envoy's
// envoy.filters.http.ratelimit filter (and anything else speaking RLS) can use quotaflow as its
// rate limit service. It returns the path to mount the handler on, as generated Connect
// handlers do: mux.Handle(s.RLSHandler()).
//
// Each descriptor of a request is one quotaflow check, decided and published like any other:
//
//   - entries user_id or user name the user subject, remote_address or ip the IP subject,
//     api_key the API key subject; a descriptor must name at least one subject, at most one of
//     each dimension. Global rules apply as to every check.
//   - path or endpoint is the endpoint, without its query string; a descriptor without one is
//     checked against "/" + the request's domain ("/quotaflow" for domain quotaflow; "/" when
//     the domain is empty), so that rules can tell descriptors of different domains apart.
//   - tier overrides the subjects' configured tier, as the tier field of CheckRateLimit does,
//     and only from a caller with the assert-tier permission.
//   - the entries of every other key, in order, are the descriptor's custom dimensions: a
//     descriptor subject (checker.DescriptorSubject), which descriptor rules match
//     (dimension: tenant; dimension: descriptor with a descriptor path). A descriptor naming
//     only such entries is checked against them alone.
//   - the cost is the descriptor's hits_addend when set, else the request's hits_addend;
//     0 means 1. is_negative_hits is refused (quotaflow does not refill buckets on request), and
//     a descriptor's limit override is ignored: quotaflow's rules decide.
//
// A descriptor's status is OVER_LIMIT when its check is denied; the response's overall code is
// OVER_LIMIT when any is. Descriptors are decided one after the other and independently: one
// that is over its limit does not refund the others (as in Envoy's reference service), and a
// global rule matching the endpoints of several descriptors is charged once per descriptor.
// The status reports the check's deciding limit: current_limit its rule's limit per window
// (see rlsRate), limit_remaining what is left of its capacity, duration_until_reset how long
// until it is fully available again. A check where no rule, or only shadow rules, matched is
// OK with no current_limit. The response adds X-RateLimit-Limit, X-RateLimit-Remaining and
// X-RateLimit-Reset (seconds until reset) of the most restrictive descriptor, and Retry-After
// when over the limit.
//
// Requests that cannot be checked are refused with InvalidArgument naming the field, as
// "descriptors[1].entries: no subject (user_id, remote_address or api_key)", except for a path
// that cannot be checked: the client wrote it, so it is answered OVER_LIMIT with the error as
// the body (badEndpoint says why).
func (s *Server) RLSHandler() (string, http.Handler) {
	method := ratelimitv3.File_envoy_service_ratelimit_v3_rls_proto.Services().
		ByName("RateLimitService").Methods().ByName("ShouldRateLimit")
	h := connect.NewUnaryHandler(RLSProcedure, s.ShouldRateLimit,
		append(s.handlerOptions(), connect.WithSchema(method))...)
	return "/" + RLSServiceName + "/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != RLSProcedure {
			http.NotFound(w, r) // gRPC clients see Unimplemented
			return
		}
		h.ServeHTTP(w, r)
	})
}

// rlsQuery is one descriptor as a check, with where its tier and cost came from, so that an
// error about them names the request's field. Field names are only made on errors.
type rlsQuery struct {
	checker.Query
	desc      int  // index of the descriptor
	tierEntry int  // index of the tier entry; -1 for none
	ownCost   bool // the cost is the descriptor's hits_addend, not the request's
}

func (q *rlsQuery) field(suffix string) string {
	return fmt.Sprintf("descriptors[%d]%s", q.desc, suffix)
}

func (q *rlsQuery) tierField() string {
	if q.tierEntry < 0 {
		return q.field(".entries")
	}
	return q.field(fmt.Sprintf(".entries[%d].value", q.tierEntry))
}

func (q *rlsQuery) costField() string {
	if q.ownCost {
		return q.field(".hits_addend")
	}
	return "hits_addend"
}

// rename turns a FieldError about the check into one about the RLS request.
func (q *rlsQuery) rename(err error) error {
	var fe *field.Error
	if !errors.As(err, &fe) {
		return err
	}
	switch fe.Field {
	case "tier":
		return &field.Error{Field: q.tierField(), Msg: fe.Msg}
	case "cost":
		return &field.Error{Field: q.costField(), Msg: fe.Msg}
	}
	return &field.Error{Field: q.field("." + fe.Field), Msg: fe.Msg}
}

// ShouldRateLimit implements envoy.service.ratelimit.v3.RateLimitService; see RLSHandler.
func (s *Server) ShouldRateLimit(ctx context.Context, req *connect.Request[ratelimitv3.RateLimitRequest]) (*connect.Response[ratelimitv3.RateLimitResponse], error) {
	resp, err := s.shouldRateLimit(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

// shouldRateLimit serves ShouldRateLimit for both RPC stacks; its errors are Connect errors.
func (s *Server) shouldRateLimit(ctx context.Context, req *ratelimitv3.RateLimitRequest) (*ratelimitv3.RateLimitResponse, error) {
	if err := s.authorize(ctx, auth.Check, "ShouldRateLimit"); err != nil {
		return nil, err
	}
	if set := s.engine.Rules(); set != nil && req.GetDomain() != "" && len(req.GetDescriptors()) > 0 && len(req.GetDescriptors()) <= MaxRLSDescriptors {
		if ep, err := field.Endpoint("/"+req.GetDomain(), checker.MaxEndpointLen); err == nil && set.DescriptorDomain(ep) {
			return s.envoyRateLimit(ctx, req, set, ep)
		}
	}
	qs, err := rlsQueries(req)
	if be := (*badEndpoint)(nil); errors.As(err, &be) {
		return rlsRefusal(len(req.GetDescriptors()), be), nil
	}
	if err != nil {
		return nil, s.rpcError(err)
	}
	for i := range qs {
		if qs[i].Tier != "" {
			if err := s.authorize(ctx, auth.AssertTier, qs[i].tierField()); err != nil {
				return nil, err
			}
		}
	}
	// An unknown tier fails before anything is charged (decide would find it too, but only
	// after the descriptors before it were charged).
	if set := s.engine.Rules(); set != nil {
		for i := range qs {
			if t := qs[i].Tier; t != "" && !set.HasTier(t) {
				return nil, s.rpcError(field.Errorf(qs[i].tierField(), "%q is not a configured tier", t))
			}
		}
	}
	resp := &ratelimitv3.RateLimitResponse{
		OverallCode: ratelimitv3.RateLimitResponse_OK,
		Statuses:    make([]*ratelimitv3.RateLimitResponse_DescriptorStatus, len(qs)),
	}
	var (
		worst    *checker.LimitOutcome // the most restrictive descriptor's deciding limit
		worstOut *checker.Outcome
	)
	members := map[string]bool{} // the user and key pairs whose org a descriptor counted against
	for i := range qs {
		qs[i].SkipGlobal = i > 0 // one Envoy request counts once against global rules
		// ... and once against its org: the org of a descriptor's user and key is counted by
		// the first descriptor naming them.
		m := orgMember(&qs[i].Query)
		qs[i].SkipOrg = members[m]
		members[m] = true
		out, err := s.engine.Check(ctx, &qs[i].Query)
		if err != nil {
			return nil, s.rpcError(qs[i].rename(err))
		}
		st := &ratelimitv3.RateLimitResponse_DescriptorStatus{Code: ratelimitv3.RateLimitResponse_OK}
		if !out.Allowed {
			st.Code = ratelimitv3.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = ratelimitv3.RateLimitResponse_OVER_LIMIT
		}
		resp.Statuses[i] = st
		l := out.DecidingLimit()
		if l == nil || l.Rule.Shadow {
			continue // no enforced limit: nothing to report, shadow rules stay invisible
		}
		st.CurrentLimit = rlsRate(l)
		st.LimitRemaining = clampUint32(l.Result.Remaining)
		st.DurationUntilReset = durationpb.New(max(0, l.Result.ResetAt.Sub(out.Now)))
		if worst == nil || moreRestrictive(out, l, worstOut, worst) {
			worst, worstOut = l, out
		}
	}
	if worst != nil {
		resp.ResponseHeadersToAdd = rlsHeaders(worstOut, worst)
	}
	return resp, nil
}

// moreRestrictive reports whether limit a (of outcome ao) restricts more than limit b: a
// denial over an allowance, then the longer wait among denials, else the fewer remaining and
// then the smaller capacity (Envoy's own choice for its X-RateLimit headers).
func moreRestrictive(ao *checker.Outcome, a *checker.LimitOutcome, bo *checker.Outcome, b *checker.LimitOutcome) bool {
	switch {
	case ao.Allowed != bo.Allowed:
		return !ao.Allowed
	case !ao.Allowed:
		return a.Result.RetryAfter > b.Result.RetryAfter
	case a.Result.Remaining != b.Result.Remaining:
		return a.Result.Remaining < b.Result.Remaining
	}
	return a.Limit.Capacity() < b.Limit.Capacity()
}

// rlsHeaders are the response headers Envoy adds to the response to the client.
func rlsHeaders(out *checker.Outcome, l *checker.LimitOutcome) []*corev3.HeaderValue {
	reset := ratelimitheader.CeilSeconds(ratelimitheader.CeilMillis(max(0, l.Result.ResetAt.Sub(out.Now))))
	h := []*corev3.HeaderValue{
		{Key: "X-RateLimit-Limit", Value: strconv.FormatInt(l.Limit.Capacity(), 10)},
		{Key: "X-RateLimit-Remaining", Value: strconv.FormatInt(max(0, l.Result.Remaining), 10)},
		{Key: "X-RateLimit-Reset", Value: strconv.FormatInt(reset, 10)},
	}
	if !out.Allowed {
		h = append(h, &corev3.HeaderValue{Key: "Retry-After", Value: strconv.FormatInt(ratelimitheader.CeilSeconds(ratelimitheader.CeilMillis(l.Result.RetryAfter)), 10)})
	}
	return h
}

// orgMember names whose org a query counts against: its user and its API key.
func orgMember(q *checker.Query) string {
	var user, key string
	for _, sub := range q.Subjects {
		switch sub.Dimension {
		case rules.DimensionUser:
			user = sub.ID
		case rules.DimensionAPIKey:
			key = sub.ID
		}
	}
	return user + "\x00" + key
}

// rlsUnits are the units current_limit is expressed in, largest first.
var rlsUnits = []struct {
	d    time.Duration
	unit ratelimitv3.RateLimitResponse_RateLimit_Unit
}{
	{24 * time.Hour, ratelimitv3.RateLimitResponse_RateLimit_DAY},
	{time.Hour, ratelimitv3.RateLimitResponse_RateLimit_HOUR},
	{time.Minute, ratelimitv3.RateLimitResponse_RateLimit_MINUTE},
	{time.Second, ratelimitv3.RateLimitResponse_RateLimit_SECOND},
}

// rlsCalendarUnits are Envoy's units of the calendar windows, whose periods are Envoy's DAY,
// WEEK, MONTH and YEAR (the reference service's are calendar ones too).
var rlsCalendarUnits = [...]ratelimitv3.RateLimitResponse_RateLimit_Unit{
	calendar.Day:   ratelimitv3.RateLimitResponse_RateLimit_DAY,
	calendar.Week:  ratelimitv3.RateLimitResponse_RateLimit_WEEK,
	calendar.Month: ratelimitv3.RateLimitResponse_RateLimit_MONTH,
	calendar.Year:  ratelimitv3.RateLimitResponse_RateLimit_YEAR,
}

// rlsRate expresses a limit as Envoy's current_limit, named by its rule id. A window of exactly
// one second, minute, hour or day is that unit; a whole multiple of one is the largest such
// unit with unit_multiplier (10s: SECOND ×10, 2h: HOUR ×2, 7d: DAY ×7), which states the rule
// exactly. A window that is not a whole number of seconds (200ms) cannot be stated in Envoy's
// units: it is given as the same rate per SECOND, rounded to the nearest whole number and at
// least 1 (2 per 200ms: 10 per SECOND).
func rlsRate(l *checker.LimitOutcome) *ratelimitv3.RateLimitResponse_RateLimit {
	rl := &ratelimitv3.RateLimitResponse_RateLimit{Name: l.Rule.ID}
	if u := l.Rule.Calendar.Unit; u.Valid() {
		rl.Unit, rl.RequestsPerUnit = rlsCalendarUnits[u], clampUint32(l.Limit.Limit)
		return rl
	}
	w := l.Limit.Window
	for _, u := range rlsUnits {
		if w >= u.d && w%u.d == 0 {
			rl.Unit, rl.RequestsPerUnit = u.unit, clampUint32(l.Limit.Limit)
			if n := w / u.d; n != 1 {
				rl.UnitMultiplier = wrapperspb.UInt32(uint32(n))
			}
			return rl
		}
	}
	perSecond := math.Round(float64(l.Limit.Limit) * float64(time.Second) / float64(w))
	rl.Unit, rl.RequestsPerUnit = ratelimitv3.RateLimitResponse_RateLimit_SECOND, uint32(min(max(perSecond, 1), math.MaxUint32))
	return rl
}

func clampUint32(n int64) uint32 {
	return uint32(min(max(n, 0), math.MaxUint32))
}

// rlsQueries validates a request and turns each descriptor into a check.
func rlsQueries(r *ratelimitv3.RateLimitRequest) ([]rlsQuery, error) {
	domain := r.GetDomain()
	if domain != "" {
		if err := field.Text(domain, checker.MaxEndpointLen-1); err != nil {
			return nil, field.Wrap("domain", err)
		}
	}
	ds := r.GetDescriptors()
	switch {
	case len(ds) == 0:
		return nil, field.Errorf("descriptors", "required: at least one descriptor")
	case len(ds) > MaxRLSDescriptors:
		return nil, field.Errorf("descriptors", "at most %d descriptors, got %d", MaxRLSDescriptors, len(ds))
	}
	qs := make([]rlsQuery, len(ds))
	for i, d := range ds {
		if err := rlsDescriptor(&qs[i], i, d, domain, r.GetHitsAddend()); err != nil {
			return nil, err
		}
	}
	return qs, nil
}

func rlsDescriptor(q *rlsQuery, i int, d *rlcommonv3.RateLimitDescriptor, domain string, hits uint32) error {
	q.desc, q.tierEntry = i, -1
	entries := d.GetEntries()
	switch {
	case len(entries) == 0:
		return field.Errorf(q.field(".entries"), "required: at least one entry naming a subject (user_id, remote_address or api_key)")
	case len(entries) > MaxRLSEntries:
		return field.Errorf(q.field(".entries"), "at most %d entries, got %d", MaxRLSEntries, len(entries))
	}
	q.Subjects = make([]checker.Subject, 0, 3)
	endpointSet := false
	var custom []rules.Entry // the entries of other keys: the descriptor's custom dimensions
	for j, e := range entries {
		kind, ok := rlsKeys[e.GetKey()]
		switch {
		case !ok:
			if err := rlsCustom(&custom, q, j, e); err != nil {
				return err
			}
		case kind == rlsEndpoint:
			if endpointSet {
				return q.entryError(j, ".key", "a second endpoint (path or endpoint) in one descriptor")
			}
			ep, err := field.Endpoint(e.GetValue(), checker.MaxEndpointLen)
			if err != nil {
				return &badEndpoint{desc: i, err: q.entryError(j, ".value", "%s", err)}
			}
			q.Endpoint, endpointSet = ep, true
		default:
			if err := q.subjectEntry(j, kind, e.GetValue()); err != nil {
				return err
			}
		}
	}
	if custom != nil {
		q.Subjects = append(q.Subjects, checker.DescriptorSubject(custom))
	}
	if len(q.Subjects) == 0 {
		return field.Errorf(q.field(".entries"), "no subject (user_id, remote_address, api_key, or another key: a custom dimension)")
	}
	if !endpointSet {
		// The domain names the endpoint: "/" + domain, in normal form like any other.
		ep, err := field.Endpoint("/"+domain, checker.MaxEndpointLen)
		if err != nil {
			return field.Wrap("domain", err)
		}
		q.Endpoint = ep
	}
	return q.hits(d, hits)
}

// entryError is a problem of the field suffix of entry j of the query's descriptor.
func (q *rlsQuery) entryError(j int, suffix, format string, args ...any) error {
	return field.Errorf(q.field(fmt.Sprintf(".entries[%d]%s", j, suffix)), format, args...)
}

// subjectEntry reads entry j, of a key that names a tier or a subject, with value v.
func (q *rlsQuery) subjectEntry(j int, kind rlsKey, v string) error {
	if err := field.Text(v, checker.MaxIdentifierLen); err != nil {
		return q.entryError(j, ".value", "%s", err)
	}
	if kind == rlsTier {
		if q.tierEntry >= 0 {
			return q.entryError(j, ".key", "a second tier in one descriptor")
		}
		q.Tier, q.tierEntry = v, j
		return nil
	}
	dim := rules.DimensionUser
	switch kind {
	case rlsIP:
		dim = rules.DimensionIP
	case rlsAPIKey:
		dim = rules.DimensionAPIKey
	}
	for _, s := range q.Subjects {
		if s.Dimension == dim {
			return q.entryError(j, ".key", "a second %s subject in one descriptor; name one of each dimension", dim)
		}
	}
	q.Subjects = append(q.Subjects, checker.Subject{Dimension: dim, ID: v})
	return nil
}

// hits sets the query's cost from the descriptor's hits_addend, else the request's hits.
func (q *rlsQuery) hits(d *rlcommonv3.RateLimitDescriptor, hits uint32) error {
	if d.GetIsNegativeHits() {
		return field.Errorf(q.field(".is_negative_hits"), "not supported: quotaflow does not refill buckets on request")
	}
	cost := uint64(hits)
	if h := d.GetHitsAddend(); h != nil {
		cost, q.ownCost = h.GetValue(), true
	}
	// A hits_addend past the largest int64 is past MaxCost too: field.Cost refuses it as that.
	var err error
	if q.Cost, err = field.Cost(int64(min(cost, math.MaxInt64)), checker.MaxCost); err != nil {
		return field.Wrap(q.costField(), err)
	}
	return nil
}

// rlsCustom adds entry j, of a key quotaflow does not read itself, to the descriptor's custom
// dimensions: descriptor rules match them (dimension: tenant, or a descriptor's path).
func rlsCustom(custom *[]rules.Entry, q *rlsQuery, j int, e *rlcommonv3.RateLimitDescriptor_Entry) error {
	if len(*custom) == rules.MaxDescriptorEntries {
		return field.Errorf(q.field(".entries"), "at most %d entries of custom dimensions (keys other than quotaflow's own)", rules.MaxDescriptorEntries)
	}
	if err := field.Text(e.GetKey(), checker.MaxIdentifierLen); err != nil {
		return field.Wrap(q.field(fmt.Sprintf(".entries[%d].key", j)), err)
	}
	if v := e.GetValue(); v != "" {
		if err := field.Text(v, checker.MaxIdentifierLen); err != nil {
			return field.Wrap(q.field(fmt.Sprintf(".entries[%d].value", j)), err)
		}
	}
	*custom = append(*custom, rules.Entry{Key: e.GetKey(), Value: e.GetValue()})
	return nil
}

// grpcRLS serves Envoy's rate limit service on grpc-go.
type grpcRLS struct {
	s *Server
}

func (g grpcRLS) ShouldRateLimit(ctx context.Context, req *ratelimitv3.RateLimitRequest) (*ratelimitv3.RateLimitResponse, error) {
	resp, err := g.s.shouldRateLimit(g.s.authenticateGRPC(ctx), req)
	if err != nil {
		return nil, grpcError(err)
	}
	return resp, nil
}

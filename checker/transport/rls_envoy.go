package transport

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/field"
)

// The response headers of a descriptor domain: envoyproxy/ratelimit's default names for them
// (LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER).
const (
	envoyLimitHeader     = "RateLimit-Limit"
	envoyRemainingHeader = "RateLimit-Remaining"
	envoyResetHeader     = "RateLimit-Reset"
)

// envoyUnits are the reference service's units, by the window that is one of each (its
// UnitToDivider: a month is 30 days, a year 365).
var envoyUnits = map[time.Duration]ratelimitv3.RateLimitResponse_RateLimit_Unit{
	time.Second:          ratelimitv3.RateLimitResponse_RateLimit_SECOND,
	time.Minute:          ratelimitv3.RateLimitResponse_RateLimit_MINUTE,
	time.Hour:            ratelimitv3.RateLimitResponse_RateLimit_HOUR,
	24 * time.Hour:       ratelimitv3.RateLimitResponse_RateLimit_DAY,
	7 * 24 * time.Hour:   ratelimitv3.RateLimitResponse_RateLimit_WEEK,
	30 * 24 * time.Hour:  ratelimitv3.RateLimitResponse_RateLimit_MONTH,
	365 * 24 * time.Hour: ratelimitv3.RateLimitResponse_RateLimit_YEAR,
}

// envoyDescriptor is one descriptor of a request to a descriptor domain.
type envoyDescriptor struct {
	sub  checker.Subject
	rule *rules.Rule // nil: no limit applies
	hits uint64
}

// envoyRateLimit answers a request to a descriptor domain (rules.Set.DescriptorDomain: an
// imported envoyproxy/ratelimit configuration) as the reference service does: every entry of
// a descriptor is an entry (none names a user or a path), the descriptor matches one rule or
// none, rules that other matched rules replace are not checked, an unlimited rule answers OK
// with no limit, a shadow rule's denial answers OK (a quota mode rule's too, without its reset),
// a hits_addend of 0 checks without counting, and a counted rule (count_denied) counts every
// hit. Only the descriptor rules
// apply: global and org rules do not count these checks.
func (s *Server) envoyRateLimit(ctx context.Context, req *ratelimitv3.RateLimitRequest, set *rules.Set, endpoint string) (*ratelimitv3.RateLimitResponse, error) {
	ds, err := envoyDescriptors(req, set, endpoint)
	if err != nil {
		return nil, s.rpcError(err)
	}
	resp := &ratelimitv3.RateLimitResponse{
		OverallCode: ratelimitv3.RateLimitResponse_OK,
		Statuses:    make([]*ratelimitv3.RateLimitResponse_DescriptorStatus, len(ds)),
	}
	var headers *ratelimitv3.RateLimitResponse_DescriptorStatus // the reference's "minimum descriptor"
	minRemaining := uint32(math.MaxUint32)
	for i := range ds {
		d := &ds[i]
		switch {
		case d.rule == nil:
			resp.Statuses[i] = &ratelimitv3.RateLimitResponse_DescriptorStatus{Code: ratelimitv3.RateLimitResponse_OK}
			continue
		case d.rule.Unlimited:
			resp.Statuses[i] = &ratelimitv3.RateLimitResponse_DescriptorStatus{Code: ratelimitv3.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}
			continue
		}
		st, hdr, over, err := s.envoyCheck(ctx, d, endpoint)
		if err != nil {
			return nil, s.rpcError(renameField(err, fmt.Sprintf("descriptors[%d]", i)))
		}
		resp.Statuses[i] = st
		if hdr.CurrentLimit != nil && hdr.LimitRemaining < minRemaining {
			headers, minRemaining = hdr, hdr.LimitRemaining
		}
		if over {
			resp.OverallCode, headers, minRemaining = ratelimitv3.RateLimitResponse_OVER_LIMIT, st, 0
		}
	}
	if headers != nil {
		resp.ResponseHeadersToAdd = []*corev3.HeaderValue{
			{Key: envoyLimitHeader, Value: strconv.FormatUint(uint64(headers.CurrentLimit.RequestsPerUnit), 10)},
			{Key: envoyRemainingHeader, Value: strconv.FormatUint(uint64(headers.LimitRemaining), 10)},
			{Key: envoyResetHeader, Value: strconv.FormatInt(headers.GetDurationUntilReset().GetSeconds(), 10)},
		}
	}
	return resp, nil
}

// envoyCheck checks one descriptor against its rule and reports its status, the status the
// response's headers consider (the same but in quota mode, whose status drops its reset), and
// whether it is over the limit (and not in shadow or quota mode).
func (s *Server) envoyCheck(ctx context.Context, d *envoyDescriptor, endpoint string) (st, hdr *ratelimitv3.RateLimitResponse_DescriptorStatus, over bool, err error) {
	q := checker.Query{Subjects: []checker.Subject{d.sub}, Endpoint: endpoint, Cost: int64(d.hits), SkipGlobal: true, SkipOrg: true, WholeDescriptor: true}
	check := s.engine.Check
	if d.hits == 0 {
		// The reference's check without a hit: over when the count is already past the limit.
		q.Cost, check = 1, s.engine.Peek
	}
	out, err := check(ctx, &q)
	if err != nil {
		return nil, nil, false, err
	}
	st = &ratelimitv3.RateLimitResponse_DescriptorStatus{Code: ratelimitv3.RateLimitResponse_OK}
	var l *checker.LimitOutcome
	for j := range out.Limits {
		if out.Limits[j].Rule == d.rule {
			l = &out.Limits[j]
		}
	}
	if l == nil {
		return st, st, false, nil // the rules changed under the request: it matched none
	}
	over = !l.Result.Allowed
	if d.hits == 0 {
		over = l.Result.Used > l.Limit.Limit
	}
	st.CurrentLimit = envoyRate(l)
	st.DurationUntilReset = envoyReset(l, out.Now)
	switch {
	case !over:
		st.LimitRemaining = clampUint32(l.Result.Remaining)
		return st, st, false, nil
	case l.Rule.QuotaMode:
		// The reference's quota mode: OK with the limit, none remaining and no reset; its
		// headers see the status before that.
		return &ratelimitv3.RateLimitResponse_DescriptorStatus{Code: st.Code, CurrentLimit: st.CurrentLimit}, st, false, nil
	case l.Rule.Shadow:
		return st, st, false, nil // the reference's shadow mode: OK, none remaining
	}
	st.Code = ratelimitv3.RateLimitResponse_OVER_LIMIT
	return st, st, true, nil
}

// envoyRate is a limit as the reference service states it: named by the rule's name (none when
// it has none), in the unit its window is one of, else as rlsRate states any window.
func envoyRate(l *checker.LimitOutcome) *ratelimitv3.RateLimitResponse_RateLimit {
	if u, ok := envoyUnits[l.Limit.Window]; ok && !l.Rule.Calendar.Unit.Valid() {
		return &ratelimitv3.RateLimitResponse_RateLimit{Name: l.Rule.Name, Unit: u, RequestsPerUnit: clampUint32(l.Limit.Limit)}
	}
	rl := rlsRate(l)
	rl.Name = l.Rule.Name
	return rl
}

// envoyReset is how long until the limit's window ends: for a fixed window of whole seconds,
// as the reference computes it from the whole seconds of the clock (its CalculateReset: the
// window minus the seconds into it), else until the limit is fully available again.
func envoyReset(l *checker.LimitOutcome, now time.Time) *durationpb.Duration {
	if w := l.Limit.Window; l.Rule.Algorithm == algorithm.FixedWindow && w%time.Second == 0 && !l.Rule.Calendar.Unit.Valid() {
		sec := int64(w / time.Second)
		return &durationpb.Duration{Seconds: sec - now.Unix()%sec}
	}
	return durationpb.New(max(0, l.Result.ResetAt.Sub(now)))
}

// envoyDescriptors validates a descriptor domain's request and finds each descriptor's rule,
// leaving out those another matched rule replaces.
func envoyDescriptors(req *ratelimitv3.RateLimitRequest, set *rules.Set, endpoint string) ([]envoyDescriptor, error) {
	in := req.GetDescriptors()
	ds := make([]envoyDescriptor, len(in))
	replaced := map[string]bool{}
	tier := set.DefaultTier()
	for i, d := range in {
		where := fmt.Sprintf("descriptors[%d]", i)
		if d.GetIsNegativeHits() {
			return nil, field.Errorf(where+".is_negative_hits", "not supported: quotaflow does not refill buckets on request")
		}
		if d.GetLimit() != nil {
			return nil, field.Errorf(where+".limit", "not honoured: a request cannot set its own limit (the rules decide)")
		}
		es := d.GetEntries()
		if len(es) > rules.MaxDescriptorEntries {
			return nil, field.Errorf(where+".entries", "at most %d entries, got %d", rules.MaxDescriptorEntries, len(es))
		}
		entries := make([]rules.Entry, len(es))
		for j, e := range es {
			if err := field.Text(e.GetKey(), checker.MaxIdentifierLen); err != nil {
				return nil, field.Wrap(fmt.Sprintf("%s.entries[%d].key", where, j), err)
			}
			if v := e.GetValue(); v != "" {
				if err := field.Text(v, checker.MaxIdentifierLen); err != nil {
					return nil, field.Wrap(fmt.Sprintf("%s.entries[%d].value", where, j), err)
				}
			}
			entries[j] = rules.Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		ds[i].hits = uint64(max(req.GetHitsAddend(), 1))
		if h := d.GetHitsAddend(); h != nil {
			ds[i].hits = h.GetValue()
		}
		if ds[i].hits > checker.MaxCost {
			return nil, field.Errorf(where+".hits_addend", "%d is more than %d", ds[i].hits, checker.MaxCost)
		}
		if len(entries) == 0 {
			continue // no entry reaches a rule
		}
		ds[i].sub = checker.DescriptorSubject(entries)
		if r, _ := set.MatchDescriptor(tier, endpoint, entries); r != nil {
			ds[i].rule = r
			for _, name := range r.Replaces {
				replaced[name] = true
			}
		}
	}
	for i := range ds {
		if r := ds[i].rule; r != nil && r.Name != "" && replaced[r.Name] {
			ds[i].rule = nil
		}
	}
	return ds, nil
}

// renameField puts a check's FieldError under the descriptor it came from.
func renameField(err error, prefix string) error {
	if fe := (*field.Error)(nil); errors.As(err, &fe) {
		return &field.Error{Field: prefix + "." + fe.Field, Msg: fe.Msg, Err: fe.Err}
	}
	return err
}

package transport

import (
	"fmt"
	"time"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/outcomepb"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/field"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// The translation of quotaflow.v1's requests into the engine's queries. Each field is
// validated here, by package field's rules (the engine's own), so that an error names the
// message's field: the engine validates a Query again, in its own terms.

// checkQuery validates a CheckRateLimit request; now is the server's clock, which the
// request's timestamp may not be more than MaxClockSkew from.
func checkQuery(r *quotaflowv1.CheckRateLimitRequest, now time.Time) (*checker.Query, error) {
	q := &checker.Query{Tier: r.GetTier(), IdempotencyKey: r.GetIdempotencyKey(), Timestamp: r.GetTimestamp()}
	if err := parseCommon(q, subjectFields{r.GetIdentifier(), r.GetDimension(), r.GetSubjects()}, r.GetEndpoint(), r.GetCost()); err != nil {
		return nil, err
	}
	if err := parseEntitlement(q, r.GetEntitlement()); err != nil {
		return nil, err
	}
	if q.IdempotencyKey != "" {
		if err := field.Text(q.IdempotencyKey, checker.MaxIdempotentLen); err != nil {
			return nil, field.Wrap("idempotency_key", err)
		}
	}
	if q.Timestamp != 0 {
		if skew := time.UnixMilli(q.Timestamp).Sub(now); skew > checker.MaxClockSkew || skew < -checker.MaxClockSkew {
			return nil, field.Errorf("timestamp", "%d (unix ms) is more than %s from the server's clock", q.Timestamp, checker.MaxClockSkew)
		}
	}
	return q, nil
}

// quotaQuery validates a GetRemainingQuota request.
func quotaQuery(r *quotaflowv1.GetRemainingQuotaRequest) (*checker.Query, error) {
	q := &checker.Query{Tier: r.GetTier()}
	if err := parseCommon(q, subjectFields{r.GetIdentifier(), r.GetDimension(), r.GetSubjects()}, r.GetEndpoint(), r.GetCost()); err != nil {
		return nil, err
	}
	if err := parseEntitlement(q, r.GetEntitlement()); err != nil {
		return nil, err
	}
	return q, nil
}

// parseEntitlement validates the entitlement a check names, empty for none: an id, as the
// rules write them; whether it is declared is the engine's to say, with the rules in force.
func parseEntitlement(q *checker.Query, id string) error {
	if id == "" {
		return nil
	}
	if err := field.Text(id, checker.MaxEntitlementLen); err != nil {
		return field.Wrap("entitlement", err)
	}
	q.Entitlement = id
	return nil
}

// resetRequest validates a ResetLimit request. The global dimension names the global subject,
// whatever the identifier.
func resetRequest(r *quotaflowv1.ResetLimitRequest) (checker.ResetRequest, error) {
	rr := checker.ResetRequest{Endpoint: r.GetEndpoint(), RuleID: r.GetRuleId()}
	if r.GetCustomDimension() != "" {
		e, err := customEntry("", &quotaflowv1.Subject{Dimension: r.GetDimension(), Identifier: r.GetIdentifier(), CustomDimension: r.GetCustomDimension()})
		if err != nil {
			return rr, err
		}
		rr.Subject = checker.DescriptorSubject([]rules.Entry{e})
		return rr, nil
	}
	switch r.GetDimension() {
	case quotaflowv1.Dimension_DIMENSION_GLOBAL:
		rr.Subject.Dimension = rules.DimensionGlobal
		return rr, nil
	case quotaflowv1.Dimension_DIMENSION_ORG:
		if err := field.Text(r.GetIdentifier(), checker.MaxIdentifierLen); err != nil {
			return rr, field.Wrap("identifier", err)
		}
		rr.Subject = checker.Subject{Dimension: rules.DimensionOrg, ID: r.GetIdentifier()}
		return rr, nil
	}
	d, err := checkSubject("", r.GetDimension(), r.GetIdentifier())
	if err != nil {
		return rr, err
	}
	rr.Subject = checker.Subject{Dimension: d, ID: r.GetIdentifier()}
	return rr, nil
}

// subjectFields are the subject-naming fields shared by the check and quota requests.
type subjectFields struct {
	identifier string
	dimension  quotaflowv1.Dimension
	subjects   []*quotaflowv1.Subject
}

// parseSubjects validates the request's subjects: the top-level identifier/dimension pair and
// the subjects list, at most one of each dimension.
func parseSubjects(f subjectFields, dst []checker.Subject) ([]checker.Subject, error) {
	add := func(prefix string, dim quotaflowv1.Dimension, id string) error {
		d, err := checkSubject(prefix, dim, id)
		if err != nil {
			return err
		}
		for _, s := range dst {
			if s.Dimension == d {
				return field.Errorf(prefix+"dimension", "the request names two %s subjects; name one of each dimension", d)
			}
		}
		dst = append(dst, checker.Subject{Dimension: d, ID: id})
		return nil
	}
	if f.identifier != "" || f.dimension != quotaflowv1.Dimension_DIMENSION_UNSPECIFIED || len(f.subjects) == 0 {
		if err := add("", f.dimension, f.identifier); err != nil {
			return nil, err
		}
	}
	var custom []rules.Entry
	for i, s := range f.subjects {
		prefix := fmt.Sprintf("subjects[%d].", i)
		if s.GetCustomDimension() != "" {
			e, err := customEntry(prefix, s)
			if err != nil {
				return nil, err
			}
			if len(custom) == rules.MaxDescriptorEntries {
				return nil, field.Errorf(prefix+"custom_dimension", "at most %d custom dimensions in one request", rules.MaxDescriptorEntries)
			}
			custom = append(custom, e)
			continue
		}
		if err := add(prefix, s.GetDimension(), s.GetIdentifier()); err != nil {
			return nil, err
		}
	}
	if custom != nil {
		dst = append(dst, checker.DescriptorSubject(custom))
	}
	return dst, nil
}

// customEntry validates a subject naming a custom dimension: its entry of the request's
// descriptor.
func customEntry(prefix string, s *quotaflowv1.Subject) (rules.Entry, error) {
	switch d := s.GetDimension(); d {
	case quotaflowv1.Dimension_DIMENSION_UNSPECIFIED, quotaflowv1.Dimension_DIMENSION_DESCRIPTOR:
	default:
		return rules.Entry{}, field.Errorf(prefix+"dimension", "%s with a custom_dimension: leave dimension unset", d)
	}
	if err := field.Text(s.GetCustomDimension(), checker.MaxIdentifierLen); err != nil {
		return rules.Entry{}, field.Wrap(prefix+"custom_dimension", err)
	}
	if err := field.Text(s.GetIdentifier(), checker.MaxIdentifierLen); err != nil {
		return rules.Entry{}, field.Wrap(prefix+"identifier", err)
	}
	return rules.Entry{Key: s.GetCustomDimension(), Value: s.GetIdentifier()}, nil
}

func checkSubject(prefix string, dim quotaflowv1.Dimension, id string) (rules.Dimension, error) {
	if err := field.Text(id, checker.MaxIdentifierLen); err != nil {
		return 0, field.Wrap(prefix+"identifier", err)
	}
	switch dim {
	case quotaflowv1.Dimension_DIMENSION_USER, quotaflowv1.Dimension_DIMENSION_IP, quotaflowv1.Dimension_DIMENSION_API_KEY:
		d, _ := outcomepb.RulesDimension(dim)
		return d, nil
	case quotaflowv1.Dimension_DIMENSION_UNSPECIFIED:
		return 0, field.Errorf(prefix+"dimension", "required: DIMENSION_USER, DIMENSION_IP or DIMENSION_API_KEY")
	case quotaflowv1.Dimension_DIMENSION_GLOBAL:
		return 0, field.Errorf(prefix+"dimension", "DIMENSION_GLOBAL cannot be named: global rules apply to every request")
	case quotaflowv1.Dimension_DIMENSION_ORG:
		return 0, field.Errorf(prefix+"dimension", "DIMENSION_ORG cannot be named in a check: a check counts against its user's (else its API key's) org")
	case quotaflowv1.Dimension_DIMENSION_DESCRIPTOR:
		return 0, field.Errorf(prefix+"custom_dimension", "required with DIMENSION_DESCRIPTOR: name the custom dimension (tenant) in subjects")
	}
	return 0, field.Errorf(prefix+"dimension", "unknown dimension %d", int32(dim))
}

// parseCommon validates what check and quota requests share: subjects, endpoint, cost.
func parseCommon(q *checker.Query, subjects subjectFields, endpoint string, cost int64) error {
	var err error
	if q.Subjects, err = parseSubjects(subjects, make([]checker.Subject, 0, 3)); err != nil {
		return err
	}
	if q.Endpoint, err = field.Endpoint(endpoint, checker.MaxEndpointLen); err != nil {
		return field.Wrap("endpoint", err)
	}
	if q.Cost, err = field.Cost(cost, checker.MaxCost); err != nil {
		return field.Wrap("cost", err)
	}
	return nil
}

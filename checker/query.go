package checker

import (
	"fmt"
	"time"
	"unicode/utf8"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"

	"github.com/quotaflow/quotaflow/internal/rules"
)

// Bounds on check requests.
const (
	MaxIdentifierLen = rules.MaxIdentifierLen
	MaxEndpointLen   = rules.MaxEndpointLen
	MaxIdempotentLen = 256
	MaxCost          = 1_000_000
	// MaxClockSkew is how far a client timestamp may be from the server's clock.
	MaxClockSkew = 24 * time.Hour
)

// FieldError is a request that broke a rule; the RPC layer answers it with InvalidArgument
// (HTTP 400).
type FieldError struct {
	Field string
	Msg   string
}

// Error implements error.
func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

type subject struct {
	dim rules.Dimension
	id  string
}

// query is a validated check, whatever transport it came from.
type query struct {
	subjects  []subject
	endpoint  string
	cost      int64
	timestamp int64 // client clock, unix ms; 0 if unknown
	idemKey   string
	tier      string
	// skipGlobal leaves the global rules out: an incoming request checked as several queries
	// (Envoy's descriptors) counts once against them, with its first query.
	skipGlobal bool
}

// subjectFields are the subject-naming fields shared by the check and quota requests.
type subjectFields struct {
	identifier string
	dimension  quotaflowv1.Dimension
	subjects   []*quotaflowv1.Subject
}

// parseSubjects validates the request's subjects: the top-level identifier/dimension pair and
// the subjects list, at most one of each dimension.
func parseSubjects(f subjectFields, dst []subject) ([]subject, error) {
	add := func(field string, dim quotaflowv1.Dimension, id string) error {
		d, err := checkSubject(field, dim, id)
		if err != nil {
			return err
		}
		for _, s := range dst {
			if s.dim == d {
				return fieldErr(field+"dimension", "the request names two %s subjects; name one of each dimension", d)
			}
		}
		dst = append(dst, subject{d, id})
		return nil
	}
	if f.identifier != "" || f.dimension != quotaflowv1.Dimension_DIMENSION_UNSPECIFIED || len(f.subjects) == 0 {
		if err := add("", f.dimension, f.identifier); err != nil {
			return nil, err
		}
	}
	for i, s := range f.subjects {
		if err := add(fmt.Sprintf("subjects[%d].", i), s.GetDimension(), s.GetIdentifier()); err != nil {
			return nil, err
		}
	}
	return dst, nil
}

func checkSubject(prefix string, dim quotaflowv1.Dimension, id string) (rules.Dimension, error) {
	if err := checkText(prefix+"identifier", id, MaxIdentifierLen); err != nil {
		return 0, err
	}
	switch dim {
	case quotaflowv1.Dimension_DIMENSION_USER:
		return rules.DimensionUser, nil
	case quotaflowv1.Dimension_DIMENSION_IP:
		return rules.DimensionIP, nil
	case quotaflowv1.Dimension_DIMENSION_API_KEY:
		return rules.DimensionAPIKey, nil
	case quotaflowv1.Dimension_DIMENSION_UNSPECIFIED:
		return 0, fieldErr(prefix+"dimension", "required: DIMENSION_USER, DIMENSION_IP or DIMENSION_API_KEY")
	case quotaflowv1.Dimension_DIMENSION_GLOBAL:
		return 0, fieldErr(prefix+"dimension", "DIMENSION_GLOBAL cannot be named: global rules apply to every request")
	}
	return 0, fieldErr(prefix+"dimension", "unknown dimension %d", int32(dim))
}

func checkText(field, s string, max int) error {
	switch {
	case s == "":
		return fieldErr(field, "required")
	case len(s) > max:
		return fieldErr(field, "must be at most %d bytes, got %d", max, len(s))
	case !utf8.ValidString(s):
		return fieldErr(field, "must be valid UTF-8")
	}
	return nil
}

func checkCost(cost int64) (int64, error) {
	switch {
	case cost == 0:
		return 1, nil
	case cost < 0:
		return 0, fieldErr("cost", "must not be negative, got %d", cost)
	case cost > MaxCost:
		return 0, fieldErr("cost", "must be at most %d, got %d", MaxCost, cost)
	}
	return cost, nil
}

// parseCommon validates what check and quota requests share: subjects, endpoint, cost.
func parseCommon(q *query, subjects subjectFields, cost int64) error {
	var err error
	if q.subjects, err = parseSubjects(subjects, make([]subject, 0, 3)); err != nil {
		return err
	}
	if err := checkText("endpoint", q.endpoint, MaxEndpointLen); err != nil {
		return err
	}
	q.cost, err = checkCost(cost)
	return err
}

func newCheckQuery(r *quotaflowv1.CheckRateLimitRequest, now time.Time) (*query, error) {
	q := &query{tier: r.GetTier(), idemKey: r.GetIdempotencyKey(), timestamp: r.GetTimestamp(), endpoint: r.GetEndpoint()}
	if err := parseCommon(q, subjectFields{r.GetIdentifier(), r.GetDimension(), r.GetSubjects()}, r.GetCost()); err != nil {
		return nil, err
	}
	if q.idemKey != "" {
		if err := checkText("idempotency_key", q.idemKey, MaxIdempotentLen); err != nil {
			return nil, err
		}
	}
	if q.timestamp != 0 {
		if skew := time.UnixMilli(q.timestamp).Sub(now); skew > MaxClockSkew || skew < -MaxClockSkew {
			return nil, fieldErr("timestamp", "%d (unix ms) is more than %s from the server's clock", q.timestamp, MaxClockSkew)
		}
	}
	return q, nil
}

func newQuotaQuery(r *quotaflowv1.GetRemainingQuotaRequest) (*query, error) {
	q := &query{tier: r.GetTier(), endpoint: r.GetEndpoint()}
	if err := parseCommon(q, subjectFields{r.GetIdentifier(), r.GetDimension(), r.GetSubjects()}, r.GetCost()); err != nil {
		return nil, err
	}
	return q, nil
}

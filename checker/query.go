package checker

import (
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/urlpath"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
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

// FieldError is a request that broke a rule, naming the field; transports answer it with
// InvalidArgument (HTTP 400, or the status of Err where it has one).
type FieldError struct {
	Field string
	Msg   string
	// Err, when set, is the sentinel of the rule broken (ErrIdempotencyConflict), for
	// errors.Is; it is not part of the message, which Field and Msg say in full.
	Err error
}

// Error implements error.
func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// Unwrap returns Err.
func (e *FieldError) Unwrap() error { return e.Err }

// FieldErrorf returns a FieldError about field.
func FieldErrorf(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Subject is who a check counts against: a user, an IP, an API key, or the global subject.
type Subject struct {
	Dimension rules.Dimension
	ID        string
}

var globalSubject = Subject{Dimension: rules.DimensionGlobal, ID: "global"}

// Query is one check, validated, whatever transport it came from: NewCheckQuery and
// NewQuotaQuery build it from the RPC messages; other transports fill it field by field,
// validating each with CheckText and CheckCost so that an error names their own field.
type Query struct {
	// Subjects are the check's subjects, at most one of each dimension; the global subject is
	// added by the engine.
	Subjects []Subject
	// Endpoint is the called endpoint that rules' patterns match: a path, its query ignored.
	// Check and Peek match its normal form (NormalizeEndpoint), which decisions report and
	// idempotency keys bind; they leave the Query as it is.
	Endpoint string
	// Cost is the units the check consumes, 1 to MaxCost.
	Cost int64
	// Timestamp is the client's clock (unix ms), for the reported skew; 0 when unknown.
	Timestamp int64
	// IdempotencyKey makes a retried check replay its first decision.
	IdempotencyKey string
	// Tier names the tier to check under; empty means the user's configured tier.
	Tier string
	// SkipGlobal leaves the global rules out: an incoming request checked as several queries
	// (Envoy's descriptors) counts once against them, with its first query.
	SkipGlobal bool
}

// CheckText reports a text field that is empty, longer than max bytes or not UTF-8.
func CheckText(field, s string, max int) error {
	switch {
	case s == "":
		return FieldErrorf(field, "required")
	case len(s) > max:
		return FieldErrorf(field, "must be at most %d bytes, got %d", max, len(s))
	case !utf8.ValidString(s):
		return FieldErrorf(field, "must be valid UTF-8")
	}
	return nil
}

// NormalizeEndpoint validates an endpoint and returns its normal form (urlpath.Normalize): the
// path without its query, at most MaxEndpointLen bytes of UTF-8, with every spelling of one
// path (case, escapes, dot and empty segments, a trailing slash, ";" parameters) made one, so
// that none reaches another bucket than the path's own. Errors name field and say what the
// path broke: not absolute, an encoded slash, a backslash, a control character, a bad escape,
// ".." above the root. Transports call it with the name of their own field; the engine calls
// it again on every query (a no-op on a normal path, which is returned without allocating).
func NormalizeEndpoint(field, ep string) (string, error) {
	ep = urlpath.Path(ep)
	if err := CheckText(field, ep, MaxEndpointLen); err != nil {
		return "", err
	}
	norm, err := urlpath.Normalize(ep)
	if err != nil {
		return "", &FieldError{Field: field, Msg: fmt.Sprintf("%q %v", ep, err), Err: err}
	}
	return norm, nil
}

// CheckCost validates a cost and returns it, 0 meaning 1; errors name the field "cost".
func CheckCost(cost int64) (int64, error) {
	switch {
	case cost == 0:
		return 1, nil
	case cost < 0:
		return 0, FieldErrorf("cost", "must not be negative, got %d", cost)
	case cost > MaxCost:
		return 0, FieldErrorf("cost", "must be at most %d, got %d", MaxCost, cost)
	}
	return cost, nil
}

// subjectFields are the subject-naming fields shared by the check and quota requests.
type subjectFields struct {
	identifier string
	dimension  quotaflowv1.Dimension
	subjects   []*quotaflowv1.Subject
}

// parseSubjects validates the request's subjects: the top-level identifier/dimension pair and
// the subjects list, at most one of each dimension.
func parseSubjects(f subjectFields, dst []Subject) ([]Subject, error) {
	add := func(field string, dim quotaflowv1.Dimension, id string) error {
		d, err := checkSubject(field, dim, id)
		if err != nil {
			return err
		}
		for _, s := range dst {
			if s.Dimension == d {
				return FieldErrorf(field+"dimension", "the request names two %s subjects; name one of each dimension", d)
			}
		}
		dst = append(dst, Subject{d, id})
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
	if err := CheckText(prefix+"identifier", id, MaxIdentifierLen); err != nil {
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
		return 0, FieldErrorf(prefix+"dimension", "required: DIMENSION_USER, DIMENSION_IP or DIMENSION_API_KEY")
	case quotaflowv1.Dimension_DIMENSION_GLOBAL:
		return 0, FieldErrorf(prefix+"dimension", "DIMENSION_GLOBAL cannot be named: global rules apply to every request")
	}
	return 0, FieldErrorf(prefix+"dimension", "unknown dimension %d", int32(dim))
}

// parseCommon validates what check and quota requests share: subjects, endpoint, cost.
func parseCommon(q *Query, subjects subjectFields, cost int64) error {
	var err error
	if q.Subjects, err = parseSubjects(subjects, make([]Subject, 0, 3)); err != nil {
		return err
	}
	if q.Endpoint, err = NormalizeEndpoint("endpoint", q.Endpoint); err != nil {
		return err
	}
	q.Cost, err = CheckCost(cost)
	return err
}

// NewCheckQuery validates a CheckRateLimit request; now is the server's clock, which the
// request's timestamp may not be more than MaxClockSkew from.
func NewCheckQuery(r *quotaflowv1.CheckRateLimitRequest, now time.Time) (*Query, error) {
	q := &Query{Tier: r.GetTier(), IdempotencyKey: r.GetIdempotencyKey(), Timestamp: r.GetTimestamp(), Endpoint: r.GetEndpoint()}
	if err := parseCommon(q, subjectFields{r.GetIdentifier(), r.GetDimension(), r.GetSubjects()}, r.GetCost()); err != nil {
		return nil, err
	}
	if q.IdempotencyKey != "" {
		if err := CheckText("idempotency_key", q.IdempotencyKey, MaxIdempotentLen); err != nil {
			return nil, err
		}
	}
	if q.Timestamp != 0 {
		if skew := time.UnixMilli(q.Timestamp).Sub(now); skew > MaxClockSkew || skew < -MaxClockSkew {
			return nil, FieldErrorf("timestamp", "%d (unix ms) is more than %s from the server's clock", q.Timestamp, MaxClockSkew)
		}
	}
	return q, nil
}

// NewQuotaQuery validates a GetRemainingQuota request.
func NewQuotaQuery(r *quotaflowv1.GetRemainingQuotaRequest) (*Query, error) {
	q := &Query{Tier: r.GetTier(), Endpoint: r.GetEndpoint()}
	if err := parseCommon(q, subjectFields{r.GetIdentifier(), r.GetDimension(), r.GetSubjects()}, r.GetCost()); err != nil {
		return nil, err
	}
	return q, nil
}

package checker

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/field"
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

// FieldError is a request that broke a rule, naming the field: the one error of bad input
// (field.Error), named here for programs that embed the engine. The engine names a Query's
// fields as the quotaflow.v1 messages do (subjects[1].identifier, endpoint, cost,
// idempotency_key, tier); a transport that validates what it translates first names its own
// (a header, a descriptor entry).
type FieldError = field.Error

// Subject is who a check counts against: a user, an IP, an API key, the global subject, or a
// descriptor (DescriptorSubject).
type Subject struct {
	Dimension rules.Dimension
	// ID identifies the subject in its dimension; a descriptor's is its entries written out
	// (DescriptorSubject), which decisions report.
	ID string
	// Entries are a descriptor subject's entries, which rules match (rules.DimensionDescriptor).
	Entries []rules.Entry
}

// DescriptorSubject returns the subject of a descriptor, a custom dimension's value
// ({"tenant", "acme"}) or an Envoy descriptor's entries. Its ID writes the entries as
// key=value, joined by ",", with "%", "," and "=" escaped (%XX) in keys and values, so that
// two descriptors never share one.
func DescriptorSubject(entries []rules.Entry) Subject {
	var b strings.Builder
	for i, e := range entries {
		if i > 0 {
			b.WriteByte(',')
		}
		escapeEntry(&b, e.Key)
		b.WriteByte('=')
		escapeEntry(&b, e.Value)
	}
	return Subject{Dimension: rules.DimensionDescriptor, ID: b.String(), Entries: entries}
}

func escapeEntry(b *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%', ',', '=':
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&15])
		default:
			b.WriteByte(c)
		}
	}
}

var globalSubject = Subject{Dimension: rules.DimensionGlobal, ID: "global"}

// Query is one check, whatever transport it came from. Check and Peek validate it and return a
// FieldError naming what it broke.
type Query struct {
	// Subjects are the check's subjects, at most one of each of the user, ip and apikey
	// dimensions, each identified by 1 to MaxIdentifierLen bytes of UTF-8; the global subject
	// is added by the engine.
	Subjects []Subject
	// Endpoint is the called endpoint that rules' patterns match: a path, its query ignored.
	// Check and Peek match its normal form, in which every spelling of one path (case,
	// escapes, dot and empty segments, a trailing slash, ";" parameters) is one, and which
	// decisions report and idempotency keys bind; they leave the Query as it is.
	Endpoint string
	// Cost is the units the check consumes, 1 to MaxCost; 0 means 1.
	Cost int64
	// Timestamp is the client's clock (unix ms), for the reported skew; 0 when unknown.
	Timestamp int64
	// IdempotencyKey makes a retried check replay its first decision; at most
	// MaxIdempotentLen bytes.
	IdempotencyKey string
	// Tier names the tier to check under; empty means the user's configured tier.
	Tier string
	// Entitlement names an entitlement whose balance the check burns by its cost, beside those
	// its endpoint burns (rules.Entitlement.Endpoints); empty for none. The check must name a
	// subject that holds it.
	Entitlement string
	// SkipGlobal leaves the global rules out, and the entitlements the endpoint burns: an
	// incoming request checked as several queries (Envoy's descriptors) counts once against
	// them, with its first query.
	SkipGlobal bool
	// SkipOrg leaves the org rules out: a query of an incoming request whose org an earlier
	// query of it counted against already (Envoy's descriptors naming the same user and key).
	SkipOrg bool
	// WholeDescriptor matches a descriptor subject as Envoy's reference service does, the
	// whole descriptor against one rule, and not each of its entries against the rules of its
	// custom dimension too (descriptorMatches): an imported Envoy domain's requests.
	WholeDescriptor bool
	// Reserve makes the check a reservation: Cost is an estimate, charged now and settled
	// later at the actual cost (Engine.Settle), or standing once Reserve (the reservation's
	// TTL, up to MaxReservationTTL) has passed. 0 is a plain check.
	Reserve time.Duration
}

// normalQuery validates q and returns it in normal form: its endpoint normalized, a cost of 0
// made 1. It returns q itself when q already is (every query from a transport, which
// validated it first), else a copy: q is the caller's, which may check it from several
// goroutines.
//
// A transport's query is thus validated twice, and that stays: the transport validates first
// with the same rules (package field) to name the field as its caller wrote it (a header, a
// descriptor entry, checks[3].subjects[1]); the engine validates again because a program that
// embeds it passes Queries no transport saw, and nothing a caller sets can tell the engine that
// its query was checked. The second pass allocates nothing on a query already normal.
func normalQuery(q *Query) (*Query, error) {
	for i, s := range q.Subjects {
		if err := checkSubject(s, i); err != nil {
			return nil, err
		}
		for _, o := range q.Subjects[:i] {
			if o.Dimension == s.Dimension {
				return nil, field.Errorf(subjectField(i, "dimension"), "the query names two %s subjects; name one of each dimension", s.Dimension)
			}
		}
	}
	ep, err := field.Endpoint(q.Endpoint, MaxEndpointLen)
	if err != nil {
		return nil, field.Wrap("endpoint", err)
	}
	cost, err := field.Cost(q.Cost, MaxCost)
	if err != nil {
		return nil, field.Wrap("cost", err)
	}
	if q.IdempotencyKey != "" {
		if err := field.Text(q.IdempotencyKey, MaxIdempotentLen); err != nil {
			return nil, field.Wrap("idempotency_key", err)
		}
	}
	if q.Entitlement != "" && len(q.Entitlement) > MaxEntitlementLen {
		return nil, field.Errorf("entitlement", "want an entitlement's id, 1 to %d bytes", MaxEntitlementLen)
	}
	if q.Reserve != 0 {
		if q.Reserve < time.Millisecond || q.Reserve > MaxReservationTTL {
			return nil, field.Errorf("ttl_ms", "%d is no reservation TTL: want 1 to %d ms", q.Reserve.Milliseconds(), MaxReservationTTL.Milliseconds())
		}
		if q.IdempotencyKey != "" {
			return nil, field.Errorf("idempotency_key", "a reservation cannot carry one: its id already makes its settle happen once")
		}
	}
	if ep == q.Endpoint && cost == q.Cost {
		return q, nil
	}
	normal := *q
	normal.Endpoint, normal.Cost = ep, cost
	return &normal, nil
}

// checkSubject validates the subject at index i of a query's subjects (-1: a reset's).
func checkSubject(s Subject, i int) error {
	switch s.Dimension {
	case rules.DimensionUser, rules.DimensionIP, rules.DimensionAPIKey:
	case rules.DimensionDescriptor:
		return checkDescriptor(s, i)
	case rules.DimensionGlobal:
		return field.Errorf(subjectField(i, "dimension"), "the global subject cannot be named: global rules apply to every request")
	case rules.DimensionOrg:
		if i >= 0 {
			return field.Errorf(subjectField(i, "dimension"), "an org cannot be named in a check: a check counts against its user's (else its API key's) org")
		}
	default:
		return field.Errorf(subjectField(i, "dimension"), "unknown dimension %d: want user, ip, apikey or descriptor", s.Dimension)
	}
	if err := field.Text(s.ID, MaxIdentifierLen); err != nil {
		return field.Wrap(subjectField(i, "identifier"), err)
	}
	return nil
}

// checkDescriptor validates the descriptor subject at index i of a query's subjects.
func checkDescriptor(s Subject, i int) error {
	if len(s.Entries) == 0 || len(s.Entries) > rules.MaxDescriptorEntries {
		return field.Errorf(subjectField(i, "entries"), "want 1 to %d entries, got %d", rules.MaxDescriptorEntries, len(s.Entries))
	}
	for j, e := range s.Entries {
		if err := field.Text(e.Key, MaxIdentifierLen); err != nil {
			return field.Wrap(subjectField(i, fmt.Sprintf("entries[%d].key", j)), err)
		}
		// A value may be empty (Envoy sends what its actions produce), never invalid text.
		if e.Value != "" {
			if err := field.Text(e.Value, MaxIdentifierLen); err != nil {
				return field.Wrap(subjectField(i, fmt.Sprintf("entries[%d].value", j)), err)
			}
		}
	}
	if want := DescriptorSubject(s.Entries).ID; s.ID != want {
		return field.Errorf(subjectField(i, "identifier"), "a descriptor's identifier is its entries written out (DescriptorSubject): want %q", want)
	}
	return nil
}

// subjectField names a field of the subject at index i (-1: a reset's, which has one).
func subjectField(i int, name string) string {
	if i < 0 {
		return name
	}
	return "subjects[" + strconv.Itoa(i) + "]." + name
}

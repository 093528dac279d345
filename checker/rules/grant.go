package rules

import (
	"regexp"
	"time"
	"unicode/utf8"

	"github.com/quotaflow/quotaflow/internal/field"
)

// A grant gives one subject an amount of an entitlement: a plan's monthly allowance (recurring,
// perhaps rolling part of what is left into the next period), a promotion that expires on 31
// January, a top-up bought yesterday. A subject's balance is the sum of what its grants have
// left; checks burn them by priority, then earliest expiry, then oldest (Grant.Before). A
// voided grant stops counting from that instant; what it already paid for stays paid.

// MaxGrantPriority bounds a grant's priority: lower burns first.
const MaxGrantPriority = 1000

// grantIDRE is what a grant's id may be: it names a field of the subject's balance in Redis
// and a row of the ledger.
var grantIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// Grant is one grant, as the admin API takes and answers it.
type Grant struct {
	// ID is the grant's (the admin API makes one when it is empty).
	ID          string `json:"id"`
	Entitlement string `json:"entitlement"`
	// Dimension and Subject name who holds it: Dimension is the entitlement's (user, apikey,
	// org, or its custom dimension's name; empty takes the entitlement's).
	Dimension string `json:"dimension"`
	Subject   string `json:"subject"`
	Amount    int64  `json:"amount"`
	// Priority orders the burn: 1 first (0 is 1), then earliest expiry, then oldest.
	Priority int `json:"priority,omitempty"`
	// EffectiveAt is when it starts to count (zero: when made); ExpiresAt when it stops (zero:
	// never; for a recurring grant, when the recurrence ends).
	EffectiveAt time.Time `json:"effective_at,omitzero"`
	ExpiresAt   time.Time `json:"expires_at,omitzero"`
	// Recurring grants are issued again at the start of every period of the entitlement;
	// Rollover, for them only, carries what was left (at least Min, at most Max) into the next
	// period as a grant of its own that expires with that period.
	Recurring bool      `json:"recurring,omitempty"`
	Rollover  *Rollover `json:"rollover,omitempty"`
	Reason    string    `json:"reason"`
	// Creator, CreatedAt and VoidedAt are the admin API's to set: who made it, when, and when
	// it was voided.
	Creator   string    `json:"creator,omitempty"`
	CreatedAt time.Time `json:"created_at,omitzero"`
	VoidedAt  time.Time `json:"voided_at,omitzero"`
}

// Rollover is how much of a recurring grant's unused amount a period carries into the next.
type Rollover struct {
	Min int64 `json:"min"`
	Max int64 `json:"max"`
}

// ValidateGrant completes g (its dimension and priority) and reports the first field that
// breaks a rule as a *field.Error naming the field as the admin API spells it. now is when the
// grant is made: it may not start before it (the checks already decided stay decided) nor
// expire by it.
func (s *Set) ValidateGrant(g *Grant, now time.Time) error {
	e, ok := s.Entitlement(g.Entitlement)
	switch {
	case g.ID != "" && !grantIDRE.MatchString(g.ID):
		return field.Errorf("id", "must match %s", grantIDRE)
	case g.Entitlement == "":
		return field.Errorf("entitlement", "required: the entitlement the grant gives an amount of")
	case !ok:
		return field.Errorf("entitlement", "no entitlement has id %q", g.Entitlement)
	}
	want := e.Key
	if want == "" {
		want = e.Dimension.String()
	}
	if g.Dimension == "" {
		g.Dimension = want
	}
	if g.Priority == 0 {
		g.Priority = 1
	}
	switch {
	case g.Dimension != want:
		return field.Errorf("dimension", "entitlement %q is held per %s, not per %s", e.ID, want, g.Dimension)
	case g.Subject == "" || len(g.Subject) > MaxIdentifierLen || !utf8.ValidString(g.Subject):
		return field.Errorf("subject", "required: 1 to %d bytes of valid UTF-8", MaxIdentifierLen)
	case g.Amount < 1 || g.Amount > MaxAmount:
		return field.Errorf("amount", "want a whole number from 1 to %d, got %d", int64(MaxAmount), g.Amount)
	case g.Priority < 1 || g.Priority > MaxGrantPriority:
		return field.Errorf("priority", "want 1 (burned first) to %d, got %d", MaxGrantPriority, g.Priority)
	case !g.EffectiveAt.IsZero() && g.EffectiveAt.Before(now.Add(-time.Minute)):
		return field.Errorf("effective_at", "%s is in the past: a grant counts from when it is made or later", g.EffectiveAt.Format(time.RFC3339))
	case !g.ExpiresAt.IsZero() && !g.ExpiresAt.After(maxTime(now, g.EffectiveAt)):
		return field.Errorf("expires_at", "%s is not after the grant starts", g.ExpiresAt.Format(time.RFC3339))
	case g.Rollover != nil && !g.Recurring:
		return field.Errorf("rollover", "only a recurring grant rolls over into the next period")
	case g.Rollover != nil && (g.Rollover.Min < 0 || g.Rollover.Max < g.Rollover.Min || g.Rollover.Max > g.Amount):
		return field.Errorf("rollover", "want 0 <= min <= max <= amount (%d), got min %d and max %d", g.Amount, g.Rollover.Min, g.Rollover.Max)
	case g.Reason == "":
		return field.Errorf("reason", "required: say why, for the audit")
	case len(g.Reason) > MaxReasonLen || !utf8.ValidString(g.Reason):
		return field.Errorf("reason", "at most %d bytes of valid UTF-8", MaxReasonLen)
	}
	return nil
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// Before reports whether g burns before h: lower priority first, then the one that expires
// first (a grant that never expires last), then the older, then by id (one order always).
func (g *Grant) Before(h *Grant) bool {
	switch {
	case g.Priority != h.Priority:
		return g.Priority < h.Priority
	case !g.ExpiresAt.Equal(h.ExpiresAt):
		return !g.ExpiresAt.IsZero() && (h.ExpiresAt.IsZero() || g.ExpiresAt.Before(h.ExpiresAt))
	case !g.CreatedAt.Equal(h.CreatedAt):
		return g.CreatedAt.Before(h.CreatedAt)
	}
	return g.ID < h.ID
}

package backtest

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/outcomepb"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/field"
	"github.com/quotaflow/quotaflow/internal/stream"
)

// Report is what a backtest found. Checks were allowed or denied "then" (recorded) and
// "now" (replayed under the rules given); newly denied checks were allowed then and would be
// denied now, newly allowed the reverse.
type Report struct {
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
	// Records is how many audit rows were read, the warm-up's included.
	Records int64 `json:"records"`
	// Checks is how many recorded checks of [From, To) were replayed and compared (within the
	// request's subject, tier and rule); Agreed of them got the recorded answer.
	Checks    int64   `json:"checks"`
	Agreed    int64   `json:"agreed"`
	Agreement float64 `json:"agreement"`
	// NewlyDenied and NewlyAllowed are the checks whose answer would change.
	NewlyDenied  int64 `json:"newly_denied"`
	NewlyAllowed int64 `json:"newly_allowed"`
	// Refused are the checks the rules would refuse as invalid (a cost above a limit's
	// capacity), counted among the newly denied when they were allowed.
	Refused int64 `json:"refused"`
	// Skipped counts the rows of [From, To) that are not replayed: idempotent replays (they
	// charged nothing), settles, cancels and lease events, and rows that are no check.
	Skipped Skipped `json:"skipped"`
	// Reasons counts the changed answers by what explains them (Reason*).
	Reasons map[string]int64 `json:"reasons"`
	// Rules is per rule and tier; Subjects the subjects with most changed answers; Hours per
	// hour of [From, To), only those with checks.
	Rules    []RuleRow    `json:"rules"`
	Subjects []SubjectRow `json:"subjects"`
	Hours    []HourRow    `json:"hours"`
	// Elapsed is how long the replay took.
	Elapsed time.Duration `json:"elapsed_ns"`
	// LiveCandidates marks a report of candidate rules' recorded answers (LiveCandidates):
	// "then" is each live rule's answer, "now" its candidate's, both given by Redis.
	LiveCandidates bool `json:"live_candidates,omitempty"`

	req      Request
	subject  *checker.Subject
	ruleRows map[ruleKey]*RuleRow
	hours    map[int64]*HourRow
	top      *topK
	tainted  map[string]bool // subjects whose buckets a settle or lease event changed
	// refunds holds when (µs) a bucket (rule|identifier) was last charged by a check that
	// another of its limits denied, a charge Redis refunded a round trip later.
	refunds map[string]int64
	// diverged holds, per bucket (rule|identifier), the reason of the last changed answer it
	// took part in and until when (µs) the replay's state of it may still differ from Redis's
	// because of it: a later changed answer of the bucket in that time follows from it.
	diverged map[string]divergence
	// instant is the time (µs) of the records being replayed, and pending the changed answers
	// at it that no reason explained yet: the checks of one batch script run share Redis's
	// instant, and the audit does not keep their order, so the denial whose refund explains a
	// change may come after it in the replay (resolve). noted holds the buckets the recorded
	// denials of the instant charged, with the last one's record number.
	instant int64
	pending []pendingChange
	noted   map[string]int64
	plans   map[string]*planned // planned checks, by key
	// planBytes estimates what plans holds; past maxPlanBytes the cache starts again.
	planBytes, maxPlanBytes int64
	key                     []byte          // the key being looked up
	out                     checker.Outcome // the outcome being accounted for, its storage reused
}

// refundWindow is how long after its charge Redis may refund it: a refund is sent once every
// reply of the check's call is in, and runs within the store's batch timeout (a second at
// least), after whatever queue the batcher has, which on a loaded machine can pass a second
// (a CI run that recorded only 65 checks a second left one changed answer unexplained with
// a window of 1 s).
const refundWindow = 5 * time.Second

// Skipped counts rows that are not replayed.
type Skipped struct {
	Replays int64 `json:"replays"`
	Settles int64 `json:"settles"`
	Leases  int64 `json:"leases"`
	// Unreadable are rows whose subjects are not written as quotaflow writes them.
	Unreadable int64 `json:"unreadable"`
	// FailMode are, in a report of live candidates, the candidates' answers given by a fail
	// mode (Redis unreachable), which compare nothing.
	FailMode int64 `json:"fail_mode,omitempty"`
}

// RuleRow is one rule under one tier. Checks counts the checks the rule applied to now or
// decided then; DeniedThen and WouldDeny those it decided denied (the deciding limit is the
// denying one with the longest wait); NewlyDenied the checks it would deny that were allowed,
// NewlyAllowed those it denied that would be allowed.
type RuleRow struct {
	Rule string `json:"rule"`
	// CandidateOf is, in a report of live candidates (LiveCandidates), the live rule the
	// candidate Rule is compared with: its answers are "then", the candidate's "now".
	CandidateOf  string `json:"candidate_of,omitempty"`
	Tier         string `json:"tier"`
	Checks       int64  `json:"checks"`
	DeniedThen   int64  `json:"denied_then"`
	WouldDeny    int64  `json:"would_deny"`
	NewlyDenied  int64  `json:"newly_denied"`
	NewlyAllowed int64  `json:"newly_allowed"`
}

// SubjectRow is a subject's changed answers.
type SubjectRow struct {
	Subject      string `json:"subject"`
	NewlyDenied  int64  `json:"newly_denied"`
	NewlyAllowed int64  `json:"newly_allowed"`
}

// HourRow is one hour's checks and changed answers.
type HourRow struct {
	Hour         time.Time `json:"hour"`
	Checks       int64     `json:"checks"`
	NewlyDenied  int64     `json:"newly_denied"`
	NewlyAllowed int64     `json:"newly_allowed"`
}

// The reasons a replayed answer differs from the recorded one, the first that applies.
const (
	// reasonFailMode: the recorded answer was a fail mode's, Redis unreachable.
	reasonFailMode = "fail_mode"
	// reasonLeased: a leased rule applied, decided from a checker's slice of its budget.
	reasonLeased = "leased"
	// reasonConcurrency: a concurrency rule applied, whose places the replay never releases.
	reasonConcurrency = "concurrency"
	// reasonRules: other rules or limits decided then: the rules given differ from those of
	// the time, or an override applied then.
	reasonRules = "rules_differ"
	// reasonSettled: a bucket of the check had been changed by a reservation's settle or a
	// lease event, which the replay does not apply.
	reasonSettled = "settled"
	// ReasonRefund: a bucket of the check had just been charged by a check that another of
	// its limits denied; Redis refunds such a charge a round trip later, and this check came
	// in between, while the replay refunds at once. The denial may be of the same instant
	// (one batch script run), replayed after this check: the audit does not keep their order.
	ReasonRefund = "refund_window"
	// reasonHistory: none of the above; the buckets' state came from before the replayed
	// history (a window longer than the warm-up). A changed answer in a bucket whose replayed
	// state an earlier changed answer made differ, while a charge lasts in it, gets that
	// earlier answer's reason instead (diverge).
	reasonHistory = "history"
)

type ruleKey struct{ rule, tier string }

func newReport(req Request) *Report {
	top := req.Top
	if top == 0 {
		top = 10
	}
	req.Top = top
	r := &Report{From: req.From, To: req.To, Reasons: map[string]int64{}, req: req,
		ruleRows: map[ruleKey]*RuleRow{}, hours: map[int64]*HourRow{}, top: newTopK(max(64, 10*top)), tainted: map[string]bool{},
		refunds: map[string]int64{}, noted: map[string]int64{}, diverged: map[string]divergence{}, plans: map[string]*planned{}}
	if req.Subject != "" {
		s, _ := parseSubject(req.Subject) // validated
		r.subject = &s
	}
	return r
}

// replay decides rec again and accounts for it.
func (r *Report) replay(rp *checker.Replay, rec *Record) {
	r.Records++
	if rec.TimeUS != r.instant {
		r.resolve()
		r.instant = rec.TimeUS
	}
	at := time.UnixMicro(rec.TimeUS)
	reported := !at.Before(r.From)
	switch {
	case rec.Kind == "recovered":
		// A balance's moves whose check's own decision was lost in a crash: the subject's
		// history has a hole, and no request to replay.
		r.tainted[rec.Subject] = true
		return
	case rec.Kind != "" && rec.Kind != "reserve":
		r.tainted[rec.Subject] = true
		if reported {
			if strings.HasPrefix(rec.Kind, "lease") {
				r.Skipped.Leases++
			} else {
				r.Skipped.Settles++
			}
		}
		return
	case rec.Replayed:
		if reported {
			r.Skipped.Replays++
		}
		return
	}
	q, p, err := r.plan(rp, rec, at)
	var out *checker.Outcome
	if err == nil {
		rp.Decide(at, p, &r.out)
		out = &r.out
	}
	var fe *field.Error
	if err != nil && !errors.As(err, &fe) {
		// A row the replay cannot read as a check (written by hand): counted, not compared.
		if reported {
			r.Skipped.Unreadable++
		}
		return
	}
	if reported && r.selected(q, rec, out) {
		r.compare(rec, out, at)
	}
	r.noteRefunds(rec, out)
}

// noteRefunds remembers the buckets a recorded denial charged in Redis, which Redis refunded a
// round trip later: the limits, allowed in the replay, of the check's requests other than the
// denying one (a request is one subject's enforced or shadow limits; the denying request, the
// subject of the deciding rule, charged nothing). Only recorded denials count: a charge the
// replay alone refunds never happened in Redis.
func (r *Report) noteRefunds(rec *Record, out *checker.Outcome) {
	if out == nil || rec.Allowed || rec.Degraded {
		return
	}
	var denying []string
	for _, l := range out.Limits {
		if l.Rule.ID == rec.Rule && !l.Rule.Shadow {
			denying = append(denying, l.Subject.ID)
		}
	}
	for _, l := range out.Limits {
		if !l.Rule.Shadow && slices.Contains(denying, l.Subject.ID) {
			continue
		}
		k := l.Rule.ID + "|" + l.Subject.ID
		if l.Result.Allowed {
			r.refunds[k] = rec.TimeUS
		}
		// A change of the instant replayed before this denial may be why the replay denies
		// where Redis charged: its buckets are noted whatever the replay answered.
		if len(r.pending) > 0 {
			r.noted[k] = r.Records
		}
	}
	if len(r.refunds) > 1<<16 {
		for k, t := range r.refunds {
			if rec.TimeUS-t > refundWindow.Microseconds() {
				delete(r.refunds, k)
			}
		}
	}
}

// refunded reports whether the bucket rule|id was charged and refunded within refundWindow
// before us.
func (r *Report) refunded(key string, us int64) bool {
	t, ok := r.refunds[key]
	return ok && us-t <= refundWindow.Microseconds()
}

// selected reports whether the request's subject, tier and rule filters keep a check.
func (r *Report) selected(q *checker.Query, rec *Record, out *checker.Outcome) bool {
	if r.subject != nil {
		found := false
		for _, s := range q.Subjects {
			found = found || s.Dimension == r.subject.Dimension && s.ID == r.subject.ID
		}
		if !found {
			return false
		}
	}
	if r.req.Tier != "" && rec.Tier != r.req.Tier && (out == nil || out.Tier != r.req.Tier) {
		return false
	}
	if id := r.req.Rule; id != "" {
		if rec.Rule == id {
			return true
		}
		for _, l := range limitsOf(out) {
			if l.Rule.ID == id {
				return true
			}
		}
		return false
	}
	return true
}

// compare accounts for one replayed check: out is nil when the rules would refuse it.
func (r *Report) compare(rec *Record, out *checker.Outcome, at time.Time) {
	now := out != nil && out.Allowed
	if out == nil {
		r.Refused++
	}
	r.Checks++
	hour := at.Truncate(time.Hour).Unix()
	h := r.hours[hour]
	if h == nil {
		h = &HourRow{Hour: time.Unix(hour, 0).UTC()}
		r.hours[hour] = h
	}
	h.Checks++
	tier := rec.Tier
	if out != nil {
		tier = out.Tier
	}
	r.perRule(rec, out, tier)
	if now == rec.Allowed {
		r.Agreed++
		return
	}
	subject := ""
	if len(rec.Subjects) > 0 {
		subject = rec.Subjects[0]
	}
	if now {
		r.NewlyAllowed++
		h.NewlyAllowed++
		r.top.add(subject, 0, 1)
	} else {
		r.NewlyDenied++
		h.NewlyDenied++
		r.top.add(subject, 1, 0)
	}
	reason := r.reason(rec, out)
	r.Reasons[reason]++
	r.diverge(rec, out, reason)
	if reason == reasonHistory {
		p := pendingChange{record: r.Records}
		for _, l := range limitsOf(out) {
			p.keys = append(p.keys, l.Rule.ID+"|"+l.Subject.ID)
		}
		r.pending = append(r.pending, p)
	}
}

// pendingChange is a changed answer of the instant replayed that no reason explained yet.
type pendingChange struct {
	record int64    // its number among the records
	keys   []string // its buckets
}

// resolve explains again the changed answers of the instant replayed, once all its records
// are: one whose bucket a recorded denial of the same instant charged (and Redis refunded)
// is a refund's, though the replay met the denial after it. Its buckets' divergence follows.
func (r *Report) resolve() {
	for _, p := range r.pending {
		if !slices.ContainsFunc(p.keys, func(k string) bool { return r.noted[k] > p.record }) {
			continue
		}
		if r.Reasons[reasonHistory]--; r.Reasons[reasonHistory] == 0 {
			delete(r.Reasons, reasonHistory)
		}
		r.Reasons[ReasonRefund]++
		for _, k := range p.keys {
			if d, ok := r.diverged[k]; ok && d.reason == reasonHistory {
				d.reason = ReasonRefund
				r.diverged[k] = d
			}
		}
	}
	r.pending = r.pending[:0]
	clear(r.noted)
}

// divergence is why, and until when, a bucket's replayed state may differ from Redis's.
type divergence struct {
	reason string
	until  int64 // µs
}

// diverge notes that the buckets of out, a check whose answer changed for reason, may hold
// another state in the replay than they had in Redis, for as long as a difference of one
// charge lasts in them: a window, or the time the rule takes to refill its capacity. A later
// changed answer of one of them in that time is the same cause's.
func (r *Report) diverge(rec *Record, out *checker.Outcome, reason string) {
	for _, l := range limitsOf(out) {
		span := l.Limit.Window
		if l.Limit.Limit > 0 && l.Limit.Capacity() > l.Limit.Limit {
			span = time.Duration(float64(span) * float64(l.Limit.Capacity()) / float64(l.Limit.Limit))
		}
		r.diverged[l.Rule.ID+"|"+l.Subject.ID] = divergence{reason, rec.TimeUS + span.Microseconds()}
	}
	if len(r.diverged) > 1<<16 {
		for k, d := range r.diverged {
			if d.until < rec.TimeUS {
				delete(r.diverged, k)
			}
		}
	}
}

// perRule accounts for a check under each rule that applied to it now, and under the rule
// that decided it then: a rule's denials, then and now, are the checks it decided denied.
func (r *Report) perRule(rec *Record, out *checker.Outcome, tier string) {
	var seen []*RuleRow // each row counts the check once
	row := func(id, t string) *RuleRow {
		k := ruleKey{id, t}
		rr := r.ruleRows[k]
		if rr == nil {
			rr = &RuleRow{Rule: id, Tier: t}
			r.ruleRows[k] = rr
		}
		if !slices.Contains(seen, rr) {
			seen = append(seen, rr)
			rr.Checks++
		}
		return rr
	}
	now := out != nil && out.Allowed
	if rec.Rule != "" && (r.req.Rule == "" || rec.Rule == r.req.Rule) {
		rr := row(rec.Rule, rec.Tier)
		if !rec.Allowed {
			rr.DeniedThen++
			if now {
				rr.NewlyAllowed++
			}
		}
	}
	for _, l := range limitsOf(out) {
		if r.req.Rule == "" || l.Rule.ID == r.req.Rule {
			row(l.Rule.ID, tier)
		}
	}
	if d := decider(out); d != nil && !out.Allowed && (r.req.Rule == "" || d.Rule.ID == r.req.Rule) {
		rr := row(d.Rule.ID, tier)
		rr.WouldDeny++
		if rec.Allowed {
			rr.NewlyDenied++
		}
	}
}

func decider(out *checker.Outcome) *checker.LimitOutcome {
	if out == nil {
		return nil
	}
	return out.DecidingLimit()
}

// reason explains a changed answer (the Reason constants, the first that applies).
func (r *Report) reason(rec *Record, out *checker.Outcome) string {
	if rec.Degraded {
		return reasonFailMode
	}
	lims := limitsOf(out)
	for _, l := range lims {
		if l.Rule.Allotment > 0 {
			return reasonLeased
		}
		if l.Rule.Algorithm == algorithm.Concurrency {
			return reasonConcurrency
		}
	}
	if out == nil || !sameLimit(rec, lims) {
		return reasonRules
	}
	for _, l := range lims {
		if r.tainted[l.Subject.ID] {
			return reasonSettled
		}
	}
	for _, l := range lims {
		if r.refunded(l.Rule.ID+"|"+l.Subject.ID, rec.TimeUS) {
			return ReasonRefund
		}
	}
	// A bucket whose replayed state an earlier changed answer made differ: the same cause.
	for _, l := range lims {
		if d, ok := r.diverged[l.Rule.ID+"|"+l.Subject.ID]; ok && rec.TimeUS <= d.until {
			return d.reason
		}
	}
	return reasonHistory
}

// sameLimit reports whether the rule that decided rec then was replayed with the limit it had
// then (an override, or a rule changed or given another limit, changes it). The audit's
// limit_value is the deciding limit's capacity: its burst, for the algorithms that have one.
func sameLimit(rec *Record, replayed []checker.LimitOutcome) bool {
	if rec.Rule == "" {
		return true
	}
	for _, l := range replayed {
		if l.Rule.ID == rec.Rule && l.Limit.Capacity() == rec.Limit {
			return true
		}
	}
	return false
}

func limitsOf(out *checker.Outcome) []checker.LimitOutcome {
	if out == nil {
		return nil
	}
	return out.Limits
}

// finish sorts the report's rows.
func (r *Report) finish(elapsed time.Duration) {
	r.resolve()
	r.Elapsed = elapsed
	if r.Checks > 0 {
		r.Agreement = float64(r.Agreed) / float64(r.Checks)
	}
	for _, rr := range r.ruleRows {
		r.Rules = append(r.Rules, *rr)
	}
	sort.Slice(r.Rules, func(i, j int) bool {
		a, b := r.Rules[i], r.Rules[j]
		if ca, cb := a.NewlyDenied+a.NewlyAllowed, b.NewlyDenied+b.NewlyAllowed; ca != cb {
			return ca > cb
		}
		if a.Rule != b.Rule {
			return a.Rule < b.Rule
		}
		return a.Tier < b.Tier
	})
	for _, h := range r.hours {
		r.Hours = append(r.Hours, *h)
	}
	sort.Slice(r.Hours, func(i, j int) bool { return r.Hours[i].Hour.Before(r.Hours[j].Hour) })
	r.Subjects = r.top.rows(r.req.Top)
}

// maxPlans bounds the report's cache of planned checks by number, Config.MaxPlanBytes by size:
// past either, the cache starts again.
const maxPlans = 1 << 18

// planned is a recorded check, parsed and planned.
type planned struct {
	q *checker.Query
	p *checker.Planned
}

// plan parses and plans rec, once per distinct check when the plan holds at any instant: one
// subject's checks repeat, and planning is half of a replay's work. A fail mode's answer never
// reached Redis: it is planned to charge nothing. A query that cannot be planned is returned
// with the error.
func (r *Report) plan(rp *checker.Replay, rec *Record, at time.Time) (*checker.Query, *checker.Planned, error) {
	b := append(r.key[:0], rec.Tier...)
	b = append(b, 0)
	b = append(b, rec.Endpoint...)
	b = strconv.AppendInt(append(b, 0), rec.Cost, 10)
	if rec.Degraded {
		b = append(b, 'd')
	}
	for _, s := range rec.Subjects {
		b = append(append(b, 0), s...)
	}
	r.key = b
	if pl := r.plans[string(b)]; pl != nil { // no string made for a lookup
		return pl.q, pl.p, nil
	}
	q, err := query(rec)
	if err != nil {
		return nil, nil, err
	}
	p, err := rp.Plan(at, q, !rec.Degraded)
	if err != nil || !p.Fixed {
		return q, p, err
	}
	size := int64(len(b) + p.Bytes())
	if len(r.plans) >= maxPlans || r.maxPlanBytes > 0 && r.planBytes+size > r.maxPlanBytes {
		clear(r.plans)
		r.planBytes = 0
	}
	r.plans[string(b)] = &planned{q, p}
	r.planBytes += size
	return q, p, nil
}

// query is the check rec recorded.
func query(rec *Record) (*checker.Query, error) {
	q := &checker.Query{Endpoint: rec.Endpoint, Cost: rec.Cost, Tier: rec.Tier}
	q.Subjects = make([]checker.Subject, 0, len(rec.Subjects))
	for _, s := range rec.Subjects {
		sub, err := parseSubject(s)
		if err != nil {
			return nil, err
		}
		q.Subjects = append(q.Subjects, sub)
	}
	return q, nil
}

// auditDimension is the rules' dimension of an audit's dimension name (stream.DimensionName),
// or of its name in rules files (apikey).
func auditDimension(name string) (rules.Dimension, bool) {
	if pd, ok := stream.ParseDimensionName(name); ok {
		return outcomepb.RulesDimension(pd)
	}
	d, err := rules.ParseDimension(name)
	return d, err == nil
}

// parseSubject reads a subject as the audit writes one, "dimension:identifier".
func parseSubject(s string) (checker.Subject, error) {
	dim, id, ok := strings.Cut(s, ":")
	d, known := auditDimension(dim)
	switch {
	case !ok || id == "":
		return checker.Subject{}, fmt.Errorf("%q: want dimension:identifier (user:alice)", s)
	case !known || d == rules.DimensionGlobal || d == rules.DimensionOrg:
		return checker.Subject{}, fmt.Errorf("%q: unknown dimension %q (want user, ip, api_key or descriptor)", s, dim)
	case d == rules.DimensionDescriptor:
		return checker.ParseDescriptorSubject(id)
	}
	return checker.Subject{Dimension: d, ID: id}, nil
}

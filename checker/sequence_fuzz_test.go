package checker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"unicode/utf8"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
)

// sequenceRules: exact limits on the user (4) and the IP (6) that sequences reach, a shadow
// limit (2) that denies often and must never decide, a global limit nobody reaches (so a check
// spans three slots on a cluster), an endpoint only a global rule counts (the record then
// lives in the global namespace) and one no rule counts. Windows are long: nothing refills
// while a sequence runs.
const sequenceRules = `
rules:
  - {id: user-4, dimension: user, endpoint: /api/*, algorithm: token_bucket, limit: 4, window: 720h}
  - {id: user-shadow-2, dimension: user, endpoint: /api/*, algorithm: sliding_window_log, limit: 2, window: 720h, shadow: true}
  - {id: ip-6, dimension: ip, endpoint: /api/*, algorithm: fixed_window, limit: 6, window: 720h}
  - {id: global-api, dimension: global, endpoint: /api/*, algorithm: token_bucket, limit: 1000000000, window: 1h}
  - {id: global-g, dimension: global, endpoint: /g, algorithm: token_bucket, limit: 1000000000, window: 1h}
`

const (
	sequenceUserLimit = 4
	sequenceIPLimit   = 6
	maxSequence       = 32
)

// sequenceRun numbers the inputs a process runs, so that each has subjects of its own.
var sequenceRun atomic.Int64

// FuzzIdempotencySequence runs sequences of checks with idempotency keys against the real
// Redis (a cluster under make test-cluster) and compares every answer with a model of the
// contract. Byte i of spell, where there is one, sends check i's endpoint in another spelling
// (spelling), which must count, bind and replay as the endpoint itself. Each byte of ops is one
// check: bits 0-1 its subjects ({A}, {A, X}, {B, X}, {X}: two
// users, one IP), bits 2-3 its endpoint (/api/a, /api/b, /g, /other), bit 4 its cost (1 or 2),
// bits 5-7 its key, made from key: key, key+"\x00shadow", key+"%00shadow", "\x00shadow"+key,
// key again, key+"\x00", none, key+"\x00shadow\x00shadow". The model holds
//   - exactness: a check is allowed exactly when every enforced limit has room (never more
//     than the limit, never a wrong denial), the shadow limit never deciding;
//   - replay: a key used again by the same subjects for the same request after an allowed
//     check replays it (allowed, charging nothing); after a denied one, it is decided afresh;
//   - binding: the same subjects with the key for another endpoint or cost are refused with
//     ErrIdempotencyConflict, charging nothing, where the record lives in the same namespace
//     (scope); other subjects with it are another key;
//   - no byte of a key, NUL and marker-like suffixes included, reaches another key's record.
//
// At the end every bucket holds exactly what the model charged.
func FuzzIdempotencySequence(f *testing.F) {
	f.Add([]byte{0x00, 0x00, 0x20, 0x00, 0x20}, "K", []byte{})
	f.Add([]byte{0x01, 0x21, 0x41, 0x61, 0x81, 0xa1, 0xe1, 0x01, 0x21, 0x41}, "K", []byte{})
	f.Add([]byte{0x00, 0x02, 0x03, 0x01, 0x10, 0x04, 0x08, 0x0c, 0x11, 0x12, 0x13, 0x00, 0x00, 0x00, 0x00}, "retry", []byte{})
	f.Add([]byte{0x09, 0x0a, 0x0b, 0x08, 0x29, 0x0a, 0x09, 0x19}, "g", []byte{})
	f.Add([]byte{0x01, 0x02, 0x03, 0x01, 0x02, 0x03, 0x01, 0x02, 0x03, 0x01, 0x02, 0x03, 0x01}, "ip", []byte{})
	f.Add([]byte{0xc0, 0xc0, 0xc1, 0xc0, 0xc0}, "", []byte{})
	f.Add([]byte{0x00, 0x20, 0x40, 0x60, 0xe0, 0x00, 0x20, 0x40, 0x60, 0xe0}, "k%00shadow\x00", []byte{})
	f.Add([]byte{0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x24, 0x09, 0x29}, "spelled", []byte{1, 2, 3, 4, 5, 6, 7, 8, 0})
	e := newEngine(f, Config{Rules: checkertest.Rules(f, sequenceRules)})
	f.Fuzz(func(t *testing.T, ops []byte, key string, spell []byte) {
		if len(ops) > maxSequence {
			ops = ops[:maxSequence]
		}
		key = strings.ToValidUTF8(key, "?")
		if len(key) > MaxIdempotentLen-20 {
			key = key[:MaxIdempotentLen-20]
			for !utf8.ValidString(key) {
				key = key[:len(key)-1]
			}
		}
		run := fmt.Sprint(sequenceRun.Add(1))
		// The IP subject is named like the users: IP(t, …) has 24 bits, which fuzzing exhausts.
		m := newSequenceModel(checkertest.ID(t, "a"+run), checkertest.ID(t, "b"+run), checkertest.ID(t, "x"+run))
		for i, op := range ops {
			q := m.query(op, key)
			want := m.expect(q)
			sent := *q
			if i < len(spell) {
				sent.Endpoint = spelling(q.Endpoint, spell[i])
			}
			out, err := e.Check(context.Background(), &sent)
			what := fmt.Sprintf("check %d (op %#02x, subjects %v, %s, cost %d, key %q)", i, op, q.Subjects, sent.Endpoint, q.Cost, q.IdempotencyKey)
			switch {
			case want.conflict:
				if !errors.Is(err, ErrIdempotencyConflict) {
					t.Fatalf("%s: %+v, %v; want ErrIdempotencyConflict", what, out, err)
				}
				continue
			case err != nil:
				t.Fatalf("%s: %v", what, err)
			case out.Degraded:
				t.Fatalf("%s: degraded", what)
			case out.Allowed != want.allowed || out.Replayed != want.replayed:
				t.Fatalf("%s: allowed %v replayed %v, want %v %v (user use %v, IP use %d)",
					what, out.Allowed, out.Replayed, want.allowed, want.replayed, m.used, m.ipUsed)
			}
			m.commit(q, want)
		}
		m.verify(t, e)
	})
}

// spelling writes endpoint ep as a client might (issue 20, item 3): upper case, a trailing
// slash, doubled slashes, dot segments, a ;parameter, an escaped letter, a query. Every form
// has ep's normal form.
func spelling(ep string, b byte) string {
	switch b % 9 {
	case 1:
		return strings.ToUpper(ep)
	case 2:
		return ep + "/"
	case 3:
		return "/" + ep
	case 4:
		return "/x/.." + ep
	case 5:
		return "/." + ep
	case 6:
		return ep + ";p"
	case 7:
		return fmt.Sprintf("%s%%%02X", ep[:len(ep)-1], ep[len(ep)-1])
	case 8:
		return ep + "?q=1"
	}
	return ep
}

// sequenceModel is what the engine must have done so far.
type sequenceModel struct {
	users   [2]Subject
	ip      Subject
	used    map[string]int64 // user id → units charged on user-4
	ipUsed  int64
	records map[string]sequenceRecord // subjects + key → the allowed request that wrote it
}

type sequenceRecord struct {
	endpoint string
	cost     int64
}

type sequenceWant struct{ allowed, replayed, conflict bool }

func newSequenceModel(a, b, ip string) *sequenceModel {
	return &sequenceModel{
		users:   [2]Subject{{Dimension: rules.DimensionUser, ID: a}, {Dimension: rules.DimensionUser, ID: b}},
		ip:      Subject{Dimension: rules.DimensionIP, ID: ip},
		used:    map[string]int64{},
		records: map[string]sequenceRecord{},
	}
}

// query decodes one op (see FuzzIdempotencySequence).
func (m *sequenceModel) query(op byte, key string) *Query {
	q := &Query{Endpoint: []string{"/api/a", "/api/b", "/g", "/other"}[op>>2&3], Cost: int64(op>>4&1) + 1}
	switch op & 3 {
	case 0:
		q.Subjects = []Subject{m.users[0]}
	case 1:
		q.Subjects = []Subject{m.ip, m.users[0]} // listed in another order than case 0's retry
	case 2:
		q.Subjects = []Subject{m.users[1], m.ip}
	case 3:
		q.Subjects = []Subject{m.ip}
	}
	if k := [...]string{key, key + "\x00shadow", key + "%00shadow", "\x00shadow" + key, key, key + "\x00", "",
		key + "\x00shadow\x00shadow"}[op>>5]; k != "" {
		q.IdempotencyKey = k
	}
	return q
}

// scope names the record a keyed check may find: the namespace it lives in, its subjects (in
// any order) and its key. The namespace is the first subject, by dimension, that has a limit
// at the endpoint, the global subject last: with sequenceRules the user on /api/*, else the
// IP; the global subject on /g. The same key at an endpoint where the record lives elsewhere
// is another key (never a replay, so never a charge missed).
func scope(q *Query) string {
	ids := make([]string, 0, len(q.Subjects))
	anchor := "global"
	for _, s := range q.Subjects {
		ids = append(ids, s.Dimension.String()+"="+s.ID)
		if q.Endpoint != "/g" && (anchor == "global" || s.Dimension == rules.DimensionUser) {
			anchor = s.Dimension.String()
		}
	}
	slices.Sort(ids)
	return anchor + "\x02" + strings.Join(ids, "\x00") + "\x01" + q.IdempotencyKey
}

// expect is the contract's answer to q given the model. /other has no rule: no store call, so
// no record either. /g has only a global rule nobody reaches: always allowed, but its record
// binds its key as any other.
func (m *sequenceModel) expect(q *Query) sequenceWant {
	if q.Endpoint == "/other" {
		return sequenceWant{allowed: true}
	}
	if q.IdempotencyKey != "" {
		if rec, ok := m.records[scope(q)]; ok {
			if rec != (sequenceRecord{q.Endpoint, q.Cost}) {
				return sequenceWant{conflict: true}
			}
			return sequenceWant{allowed: true, replayed: true}
		}
	}
	ok := true
	for _, s := range q.Subjects {
		switch {
		case q.Endpoint == "/g":
		case s.Dimension == rules.DimensionUser:
			ok = ok && m.used[s.ID]+q.Cost <= sequenceUserLimit
		case s.Dimension == rules.DimensionIP:
			ok = ok && m.ipUsed+q.Cost <= sequenceIPLimit
		}
	}
	return sequenceWant{allowed: ok}
}

// commit records what the engine did for q, answered as want.
func (m *sequenceModel) commit(q *Query, want sequenceWant) {
	if !want.allowed || want.replayed || q.Endpoint == "/other" {
		return
	}
	if q.IdempotencyKey != "" {
		m.records[scope(q)] = sequenceRecord{q.Endpoint, q.Cost}
	}
	if q.Endpoint == "/g" {
		return
	}
	for _, s := range q.Subjects {
		switch s.Dimension {
		case rules.DimensionUser:
			m.used[s.ID] += q.Cost
		case rules.DimensionIP:
			m.ipUsed += q.Cost
		}
	}
}

// verify compares every bucket of the sequence with what the model charged.
func (m *sequenceModel) verify(t *testing.T, e *Engine) {
	t.Helper()
	peek, err := e.Peek(context.Background(), &Query{Subjects: []Subject{m.users[0], m.ip}, Endpoint: "/api/a", Cost: 1})
	if err != nil {
		t.Fatal(err)
	}
	peekB, err := e.Peek(context.Background(), &Query{Subjects: []Subject{m.users[1]}, Endpoint: "/api/a", Cost: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range append(peek.Limits, peekB.Limits...) {
		var want int64
		switch l.Rule.ID {
		case "user-4":
			want = m.used[l.Subject.ID]
		case "ip-6":
			want = m.ipUsed
		default:
			continue
		}
		if l.Result.Used != want {
			t.Errorf("%s of %s: %d used, want %d", l.Rule.ID, l.Subject.ID, l.Result.Used, want)
		}
	}
}

package checker

import (
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
)

// callerKey carries the test's caller in a context, as the transport's authentication does.
type callerKey struct{}

func as(caller string) context.Context {
	return context.WithValue(context.Background(), callerKey{}, caller)
}

func testCaller(ctx context.Context) string {
	c, _ := ctx.Value(callerKey{}).(string)
	return c
}

// resign is id with its body changed by edit and its MAC kept: what a caller who edits an id
// sends.
func resign(id string, edit func(body string) string) string {
	i := strings.LastIndexByte(id, '.')
	return edit(id[:i]) + id[i:]
}

// TestReservationIDsSigned: the attacks on reservation ids. A slot list split into parts
// cancelled one by one, a reservation settled by another caller and any altered id are refused
// before any record is read; the reservation then settles once, with one event.
func TestReservationIDsSigned(t *testing.T) {
	t.Parallel()
	sink := &settleSink{}
	e := newEngine(t, Config{Rules: mustRules(t, reserveRules), DisableOverLimitCache: true, Decisions: sink, Caller: testCaller})
	user := checkertest.ID(t, "u")
	out, err := e.Check(as("A"), reserveQuery(user, 50))
	if err != nil || out.Reservation == nil {
		t.Fatalf("reserve: %+v, %v", out, err)
	}
	id := out.Reservation.ID
	body, err := e.ids.verify(as("A"), idKindReservation, "reservation_id", id)
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Split(body, ".")
	raw, _ := base64.RawURLEncoding.DecodeString(f[2])
	tags := strings.Split(string(raw), "\n")
	if len(tags) != 2 {
		t.Fatalf("the reservation has %d slots, want 2 (user and global)", len(tags))
	}
	for _, tag := range tags {
		part := resign(id, func(string) string {
			return f[0] + "." + f[1] + "." + base64.RawURLEncoding.EncodeToString([]byte(tag))
		})
		if _, err := e.Cancel(as("A"), part); !errors.Is(err, ErrIDNotIssued) {
			t.Errorf("cancel of the part %s: %v, want ErrIDNotIssued", tag, err)
		}
	}
	longer := resign(id, func(b string) string { return f[0] + ".99999999999999." + f[2] })
	if _, err := e.Settle(as("A"), longer, 1); !errors.Is(err, ErrIDNotIssued) {
		t.Errorf("settle of an id with its expiry changed: %v, want ErrIDNotIssued", err)
	}
	if _, err := e.Cancel(as("B"), id); !errors.Is(err, ErrIDNotIssued) {
		t.Errorf("cancel by another caller: %v, want ErrIDNotIssued", err)
	}
	if _, err := e.Cancel(as("A"), id[:len(id)-macLen-1]); err == nil {
		t.Error("cancel of an id without its signature succeeded")
	}
	if st, err := e.Cancel(as("A"), id); err != nil || st.Estimate != 50 {
		t.Fatalf("cancel by its caller: %+v, %v", st, err)
	}
	if tk, _ := left(t, e, user); tk != 100 {
		t.Errorf("after the cancel: %d tokens left, want 100 (refunded once)", tk)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.got) != 1 || sink.got[0].Actual-sink.got[0].Estimate != -50 {
		t.Errorf("settle events %+v, want one of -50", sink.got)
	}
}

// TestLeaseIDsSigned: a lease's TTL raised in its id, or the lease used by another caller, is
// refused; its own caller renews and releases it.
func TestLeaseIDsSigned(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Rules: mustRules(t, holdRules), DisableOverLimitCache: true, Caller: testCaller})
	q := &Query{Subjects: []Subject{{Dimension: rules.DimensionUser, ID: checkertest.ID(t, "u")}}, Endpoint: "/gen", Cost: 1}
	out, err := e.Check(as("A"), q)
	if err != nil || out.Lease == nil {
		t.Fatalf("check: %+v, %v", out, err)
	}
	id := out.Lease.ID
	day := resign(id, func(b string) string {
		holder, enc, _ := strings.Cut(b, ".")
		raw, _ := base64.RawURLEncoding.DecodeString(enc)
		_, key, _ := strings.Cut(string(raw), " ")
		return holder + "." + base64.RawURLEncoding.EncodeToString([]byte("86400000 "+key))
	})
	if _, err := e.Renew(as("A"), day); !errors.Is(err, ErrIDNotIssued) {
		t.Errorf("renew with the TTL raised to a day: %v, want ErrIDNotIssued", err)
	}
	if err := e.Release(as("B"), id); !errors.Is(err, ErrIDNotIssued) {
		t.Errorf("release by another caller: %v, want ErrIDNotIssued", err)
	}
	if exp, err := e.Renew(as("A"), id); err != nil || time.Until(exp) > 31*time.Second {
		t.Errorf("renew by its caller: %v, %v; want the rule's 30s", exp, err)
	}
	if err := e.Release(as("A"), id); err != nil {
		t.Errorf("release by its caller: %v", err)
	}
}

// TestIDKeys: checkers sharing no configured key share the one kept in Redis; configured keys
// rotate (the first signs, every one verifies), and a key dropped no longer verifies.
func TestIDKeys(t *testing.T) {
	t.Parallel()
	set := mustRules(t, reserveRules)
	a, b := newEngine(t, Config{Rules: set, DisableOverLimitCache: true}), newEngine(t, Config{Rules: set, DisableOverLimitCache: true})
	reserve := func(e *Engine) string {
		t.Helper()
		out, err := e.Check(context.Background(), reserveQuery(checkertest.ID(t, "u"), 1))
		if err != nil || out.Reservation == nil {
			t.Fatalf("reserve: %+v, %v", out, err)
		}
		return out.Reservation.ID
	}
	if _, err := b.Cancel(context.Background(), reserve(a)); err != nil {
		t.Errorf("a reservation of one checker cancelled by another, both on the key in Redis: %v", err)
	}
	k1, k2 := []byte(strings.Repeat("1", 32)), []byte(strings.Repeat("2", 32))
	old := newEngine(t, Config{Rules: set, DisableOverLimitCache: true, IDKeys: [][]byte{k1}})
	rotated := newEngine(t, Config{Rules: set, DisableOverLimitCache: true, IDKeys: [][]byte{k2, k1}})
	dropped := newEngine(t, Config{Rules: set, DisableOverLimitCache: true, IDKeys: [][]byte{k2}})
	if _, err := rotated.Cancel(context.Background(), reserve(old)); err != nil {
		t.Errorf("an id of the old key on a checker with the new key first: %v", err)
	}
	if _, err := dropped.Cancel(context.Background(), reserve(old)); !errors.Is(err, ErrIDNotIssued) {
		t.Errorf("an id of a dropped key: %v, want ErrIDNotIssued", err)
	}
	if _, err := a.Cancel(context.Background(), reserve(rotated)); !errors.Is(err, ErrIDNotIssued) {
		t.Errorf("an id of a configured key on a checker of the Redis key: %v, want ErrIDNotIssued", err)
	}
}

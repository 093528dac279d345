package bucket

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/quotaflow/quotaflow/internal/calendar"
	"github.com/quotaflow/quotaflow/internal/testbed/redistest"
)

// journalOf returns the entries of the journals whose balance key starts with prefix, by
// decision id, as the sweeper reads them.
func journalOf(t *testing.T, s *Store, prefix string) map[string]JournalEntry {
	t.Helper()
	out := map[string]JournalEntry{}
	err := s.OldJournal(ctxT(t), 0, func(page []JournalEntry) error {
		for _, e := range page {
			if strings.HasPrefix(e.Key, prefix) {
				out[e.ID] = e
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("OldJournal: %v", err)
	}
	return out
}

// TestJournal: every store call that burns a balance journals what it did under the id its
// caller gave, in the same script run: a charge (its moves as its answer reports them), a
// charge refunded whole when another limit denied (nothing left), a settle above and below
// its estimate (burned more; given back), and a use; a charge without a journal argument
// writes none. The sweeper reads the entries with their holder, instant and period, and
// TrimJournal drops them.
func TestJournal(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	now := redisNow(t, s)
	sp := calendar.Period{Unit: calendar.Month}.Around(now)
	prefix := "rl:" + key(t, "")
	bal := func(name, journal string) Limit {
		l := balLimit(prefix+"bl:"+name, 0, sp)
		l.Journal = journal
		put(t, s, l, Grant{ID: "a", Amount: 5, Priority: 1})
		put(t, s, l, Grant{ID: "b", Amount: 40, Priority: 2})
		return l
	}
	want := map[string][]Move{}

	charged := check(t, s, one(bal("charge", JournalArg("d-1", "user:carol")), 7))
	want["d-1"] = charged.Limits[0].Moves()
	if fmt.Sprint(want["d-1"]) != fmt.Sprint([]Move{{Burned, "a", 5}, {Burned, "b", 2}}) {
		t.Fatalf("the charge's moves %v, want 5 of a and 2 of b", want["d-1"])
	}
	check(t, s, one(bal("unjournaled", ""), 3))

	full := lim(key(t, "fw"), algorithm.FixedWindow, 1, time.Hour, 0)
	check(t, s, one(full, 1))
	res, err := s.Check(ctxT(t), []Request{one(bal("refunded", JournalArg("d-2", "user:carol")), 9), one(full, 1)})
	if err != nil || !res[0].Refunded {
		t.Fatalf("a charge another limit denied: %+v, %v; want refunded", res, err)
	}

	l := bal("settled", JournalArg("d-3", "user:carol"))
	for i, tc := range []struct {
		id     string
		actual int64
		moves  []Move
	}{{"d-4", 12, []Move{{Burned, "b", 2}}}, {"d-5", 4, []Move{{GivenBack, "b", 6}}}} {
		rec := fmt.Sprintf("%s:rsv%d", l.Key, i)
		if !reserve(t, s, rec, l, 10) {
			t.Fatal("a reservation denied")
		}
		if _, err := s.Settle(ctxT(t), []string{rec}, tc.actual, JournalArg(tc.id, "")); err != nil {
			t.Fatalf("Settle at %d: %v", tc.actual, err)
		}
		want[tc.id] = tc.moves
	}
	// d-3 is both reservations' charges: the second journaled over the first.
	want["d-3"] = []Move{{Burned, "b", 10}}

	used := bal("used", JournalArg("d-6", "user:carol"))
	u, err := s.UseBalance(ctxT(t), used.Key, used.Key+"#use:x", used, 8, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	want["d-6"] = u.Moves

	got := journalOf(t, s, prefix)
	moves := map[string][]Move{}
	for id, e := range got {
		moves[id] = e.Moves
		if !e.At.After(now.Add(-time.Minute)) || !e.PeriodStart.Equal(sp.Start) || !e.PeriodEnd.Equal(sp.Start.Add(sp.First)) {
			t.Errorf("entry %s: at %v, period %v to %v; want now, %v to %v", id, e.At, e.PeriodStart, e.PeriodEnd, sp.Start, sp.Start.Add(sp.First))
		}
		if wantHolder := map[bool]string{true: "", false: "user:carol"}[id == "d-4" || id == "d-5"]; e.Holder != wantHolder {
			t.Errorf("entry %s: holder %q, want %q", id, e.Holder, wantHolder)
		}
	}
	if !reflect.DeepEqual(moves, want) {
		t.Errorf("journal:\n got %v\nwant %v", moves, want)
	}

	var refs []JournalRef
	for _, e := range got {
		refs = append(refs, e.JournalRef)
	}
	if err := s.TrimJournal(ctxT(t), refs); err != nil {
		t.Fatal(err)
	}
	if left := journalOf(t, s, prefix); len(left) != 0 {
		t.Errorf("after TrimJournal: %v, want nothing", left)
	}
}

// TestJournalAge: the sweeper reads only the entries charged more than its age ago.
func TestJournalAge(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	sp := calendar.Period{Unit: calendar.Month}.Around(redisNow(t, s))
	l := balLimit("rl:"+key(t, "bl:x"), 0, sp)
	l.Journal = JournalArg("d-1", "user:dan")
	put(t, s, l, Grant{ID: "a", Amount: 5})
	check(t, s, one(l, 1))
	found := 0
	if err := s.OldJournal(ctxT(t), time.Hour, func(page []JournalEntry) error {
		for _, e := range page {
			if e.Key == l.Key {
				found++
			}
		}
		return nil
	}); err != nil || found != 0 {
		t.Errorf("entries older than an hour: %d, %v; want none", found, err)
	}
}

// TestClaimSweep: of the checkers asking in one round, one sweeps; the next round is new.
func TestClaimSweep(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	every := 7*time.Hour + time.Duration(time.Now().UnixNano()%1000)*time.Millisecond // a round no other test asks for
	at := time.Now()
	first, err1 := s.ClaimSweep(ctxT(t), "a", every, at)
	second, err2 := s.ClaimSweep(ctxT(t), "b", every, at)
	next, err3 := s.ClaimSweep(ctxT(t), "b", every, at.Add(every))
	if err1 != nil || err2 != nil || err3 != nil || !first || second || !next {
		t.Errorf("claims: %v %v %v (%v %v %v), want the first of a round and the next round's", first, second, next, err1, err2, err3)
	}
}

// TestParseJournal: malformed entries (none is written) are skipped.
func TestParseJournal(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"", "c,1,2,3", "x,1,2,3|||", "c,1,2|||", "c,a,2,3||||", "c,1,2,3|0,a:1|||"} {
		if e, ok := parseJournal("k", "id", v); ok && v != "c,1,2,3|0,a:1|||" {
			t.Errorf("parseJournal(%q) = %+v, want skipped", v, e)
		}
	}
	e, ok := parseJournal("k", "id", "g,5,6,7000000|2,a:3||F1:b|user:x|y")
	if !ok || e.Holder != "user:x|y" || e.At.UnixMicro() != 5 || e.PeriodStart.Unix() != 6 || e.PeriodEnd.Unix() != 7 ||
		fmt.Sprint(e.Moves) != fmt.Sprint([]Move{{OverageBack, "", 2}, {GivenBack, "a", 3}, {Forfeited, "b", 1}}) {
		t.Errorf("parseJournal: %+v, %v", e, ok)
	}
}

// BenchmarkJournalSweep measures a sweep (OldJournal) of a Redis of its own holding 1,000,000
// keys (QUOTAFLOW_MEMBENCH_KEYS), of which 100 are journals of one entry each: the SCAN walks
// them all. It reports the sweep's wall time and Redis's CPU per key of the keyspace. It
// ignores b.N: run it once, with -benchtime=1x.
//
//	go test -run='^$' -bench=JournalSweep -benchtime=1x ./internal/bucket/
func BenchmarkJournalSweep(b *testing.B) {
	keys := 1_000_000
	if v, err := strconv.Atoi(os.Getenv("QUOTAFLOW_MEMBENCH_KEYS")); err == nil && v > 0 {
		keys = v
	}
	rs, err := redistest.Start()
	if err != nil {
		b.Fatal(err)
	}
	defer rs.Close()
	c := rs.Client(0)
	defer c.Close()
	ctx := context.Background()
	pipe := c.Pipeline()
	for i := range keys {
		pipe.Set(ctx, "rl:{u:"+strconv.Itoa(i)+"}:tb:x", "1", 0)
		if i%100_000 == 0 || i == keys-1 {
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	for i := range 100 {
		c.HSet(ctx, "rl:{u:"+strconv.Itoa(i)+"}:bl:tokens"+journalSuffix, "d-"+strconv.Itoa(i), "c,1,2,3|0,a:1|||user:u")
	}
	s := NewStore(c)
	defer s.Close()
	before := commandUsec(b, c, "scan")
	start := time.Now()
	found := 0
	if err := s.OldJournal(ctx, 0, func(page []JournalEntry) error { found += len(page); return nil }); err != nil {
		b.Fatal(err)
	}
	wall := time.Since(start)
	if found != 100 {
		b.Fatalf("found %d entries, want 100", found)
	}
	b.ReportMetric(wall.Seconds(), "sweep-s")
	b.ReportMetric((commandUsec(b, c, "scan")-before)/float64(keys), "redis-µs/key")
}

// commandUsec is the Redis CPU time (µs) spent so far in command name.
func commandUsec(b *testing.B, c *redis.Client, name string) float64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_"+name+":"); ok {
			for _, kv := range strings.Split(rest, ",") {
				if v, ok := strings.CutPrefix(kv, "usec="); ok {
					f, _ := strconv.ParseFloat(v, 64)
					return f
				}
			}
		}
	}
	return 0
}

// TestJournalRefundKeepsPeriod: a charge that brought its balance to a new period and was then
// refunded (another limit denied) leaves in the journal the period's moves alone, as its
// decision reports them: the forfeit and reissue stand, the burn does not.
func TestJournalRefundKeepsPeriod(t *testing.T) {
	t.Parallel()
	before, c := newStore(t)
	now := redisNow(t, before).Truncate(time.Second)
	sp := calendar.Span{Start: now.Add(-23*time.Hour + 30*time.Second), First: 23 * time.Hour, Second: 25 * time.Hour}
	after := NewStoreWithConfig(c, storeConfig(StoreConfig{ClockOffset: sp.First - 29*time.Second}))
	t.Cleanup(func() { after.Close() })
	prefix := "rl:" + key(t, "")
	l := balLimit(prefix+"bl:x", 0, sp)
	put(t, before, l, Grant{ID: "plan", Amount: 10, Priority: 1, Recurring: true})
	check(t, before, one(l, 4))
	full := lim(key(t, "fw"), algorithm.FixedWindow, 1, time.Hour, 0)
	check(t, after, one(full, 1))
	l.Journal = JournalArg("d-1", "user:eve")
	res, err := after.Check(ctxT(t), []Request{one(l, 3), one(full, 1)})
	if err != nil || !res[0].Refunded {
		t.Fatalf("a charge past the boundary another limit denied: %+v, %v; want refunded", res, err)
	}
	got := journalOf(t, after, prefix)["d-1"]
	if want := []Move{{Forfeited, "plan", 6}, {Reissued, "plan", 10}}; fmt.Sprint(got.Moves) != fmt.Sprint(want) {
		t.Errorf("the refunded charge's journal: %v, want the period's moves alone, %v", got.Moves, want)
	}
}

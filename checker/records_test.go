package checker

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
)

// recordRules give a user an exact limit of 3 and a shadow rule beside it, an IP and a global
// limit nobody reaches, and an endpoint only a global rule counts.
const recordRules = `
rules:
  - {id: user-3, dimension: user, endpoint: /api/*, algorithm: fixed_window, limit: 3, window: 1h}
  - {id: user-shadow, dimension: user, endpoint: /api/*, algorithm: token_bucket, limit: 1000, window: 1h, shadow: true}
  - {id: ip-api, dimension: ip, endpoint: /api/*, algorithm: sliding_window_counter, limit: 1000, window: 1h}
  - {id: global-api, dimension: global, endpoint: /api/*, algorithm: gcra, limit: 1000000, window: 1s}
  - {id: global-only, dimension: global, endpoint: /global-only, algorithm: fixed_window, limit: 1000000, window: 1h}
`

func recordQuery(t testing.TB, user, endpoint, key string) *Query {
	return &Query{
		Subjects: []Subject{{Dimension: rules.DimensionUser, ID: user}, {Dimension: rules.DimensionIP, ID: checkertest.IP(t, "ip")}},
		Endpoint: endpoint, Cost: 1, IdempotencyKey: key,
	}
}

// TestIdempotencyKeyNoShadowMarker reproduces item 2 of issue 20: the shadow record of key K
// was the record of key "K\x00shadow" (the marker was appended before escaping, and NUL
// escapes to %00), so that key replayed the shadow decision, allowed, uncharged: 10 of 10
// allowed against a limit of 3. Every key below is used once: each allowed check must be
// charged, whatever bytes its key holds.
func TestIdempotencyKeyNoShadowMarker(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Rules: checkertest.Rules(t, recordRules)})
	user := checkertest.ID(t, "u")
	allowed := 0
	for i := range 10 {
		keys := []string{fmt.Sprintf("k%d", i), fmt.Sprintf("k%d\x00shadow", i)}
		if i%2 == 1 {
			keys[0], keys[1] = keys[1], keys[0] // the marker-like key first
		}
		keys = append(keys, fmt.Sprintf("k%d%%00shadow", i), fmt.Sprintf("k%d\x00shadow\x00shadow", i))
		for _, key := range keys {
			out, err := e.Check(context.Background(), recordQuery(t, user, "/api/x", key))
			if err != nil {
				t.Fatalf("key %q: %v", key, err)
			}
			if out.Replayed {
				t.Errorf("key %q, used once, was replayed", key)
			}
			if out.Allowed {
				allowed++
			}
		}
	}
	if allowed != 3 {
		t.Errorf("%d checks allowed against a limit of 3", allowed)
	}
}

// TestIdempotencyKeyPerSubject reproduces item 6 of issue 20: the global subject's record was
// common to every subject, so user B reusing user A's key was refused (409 through
// forward-auth). A key now belongs to the subjects it came with: B's check is B's own, decided
// and charged, and A's retry still replays. So with only a global rule matching, where the
// record lives in the global namespace.
func TestIdempotencyKeyPerSubject(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Rules: checkertest.Rules(t, recordRules)})
	ctx := context.Background()
	for _, endpoint := range []string{"/api/x", "/global-only"} {
		t.Run(endpoint, func(t *testing.T) {
			t.Parallel()
			key := checkertest.ID(t, "shared-key")
			a, b := checkertest.ID(t, "a"), checkertest.ID(t, "b")
			for _, user := range []string{a, b} {
				out, err := e.Check(ctx, recordQuery(t, user, endpoint, key))
				if err != nil || !out.Allowed || out.Replayed {
					t.Errorf("user %s, key %q: %+v, %v; want allowed, decided afresh", user, key, out, err)
				}
			}
			if out, err := e.Check(ctx, recordQuery(t, a, endpoint, key)); err != nil || !out.Replayed {
				t.Errorf("A's retry: %+v, %v; want replayed", out, err)
			}
			peek, err := e.Peek(ctx, recordQuery(t, b, endpoint, ""))
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range peek.Limits {
				if l.Rule.ID == "user-3" && l.Result.Used != 1 {
					t.Errorf("B's %s: used %d, want 1 (B's own check charged)", l.Rule.ID, l.Result.Used)
				}
			}
		})
	}
}

// TestIdempotencyRecordCost reproduces item 11 of issue 20: a keyed check wrote a record of
// ~526 bytes per subject (enforced and shadow apart) plus one for the global subject, denied
// checks too. Now an allowed check writes one record and a denied one none, each a key of the
// first subject's namespace holding the 16-byte fingerprint for 5 minutes, within 150 bytes
// of MEMORY USAGE. On a Redis of the test's own, so that every key in it is this test's.
func TestIdempotencyRecordCost(t *testing.T) {
	t.Parallel()
	_, rdb := checkertest.OwnRedis(t)
	e := newEngine(t, Config{Redis: rdb, Rules: checkertest.Rules(t, recordRules)})
	ctx := context.Background()
	user := "user-" + strconv.Itoa(123456)
	allowed := 0
	for i := range 8 {
		// A key as long as a request may send: records must not grow with it.
		key := fmt.Sprintf("%d-%s", i, strings.Repeat("x", MaxIdempotentLen-4))
		out, err := e.Check(ctx, recordQuery(t, user, "/api/x", key))
		if err != nil {
			t.Fatal(err)
		}
		if out.Allowed {
			allowed++
		}
	}
	if allowed != 3 {
		t.Fatalf("%d allowed, want 3", allowed)
	}
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var records []string
	for _, k := range keys {
		if strings.Contains(k, ":i:") {
			records = append(records, k)
		}
	}
	if len(records) != allowed {
		t.Errorf("%d records among %q; want %d, one per allowed check", len(records), keys, allowed)
	}
	for _, k := range keys {
		if strings.Contains(k, "idem") {
			t.Errorf("key %q: a record of another form", k)
		}
	}
	for _, k := range records {
		if !strings.HasPrefix(k, "rl:{user:"+user+"}:i:") {
			t.Errorf("record %q is not in the user's namespace", k)
		}
		if v := rdb.Get(ctx, k).Val(); len(v) != 16 {
			t.Errorf("record %q holds %d bytes, want the 16 of the fingerprint", k, len(v))
		}
		if ttl := rdb.PTTL(ctx, k).Val(); ttl <= bucket.IdempotencyTTL-time.Minute || ttl > bucket.IdempotencyTTL {
			t.Errorf("record %q expires in %v, want about %v", k, ttl, bucket.IdempotencyTTL)
		}
		mem, err := rdb.MemoryUsage(ctx, k).Result()
		if err != nil || mem > 150 {
			t.Errorf("record %q: MEMORY USAGE %d (%v), want at most 150 bytes", k, mem, err)
		}
	}
}

// TestIdempotencyPreviousRecords: records the previous version wrote (one per subject, under
// rl:{…}:idem:<escaped key>, a msgpack reply and fingerprint) are never read: a retry that
// spans the upgrade is decided afresh and charged, never replayed from a record this version
// cannot trust nor refused as a conflict.
func TestIdempotencyPreviousRecords(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Rules: checkertest.Rules(t, recordRules)})
	rdb := redisSrv.UniversalClient()
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	user, key := checkertest.ID(t, "u"), "upgrade-key"
	q := recordQuery(t, user, "/api/x", key)
	// An allowed reply of one limit, as the previous script packed it with its fingerprint.
	old := `return redis.call('SET', KEYS[1], cmsgpack.pack({1, '1', 0, 1, 0, 3, '1', '0', ''}, ARGV[1]), 'PX', 300000)`
	for _, sub := range q.Subjects {
		k := "rl:" + subjectTag(sub.Dimension, sub.ID) + ":idem:" + key
		if err := rdb.Eval(ctx, old, []string{k}, "0123456789abcdef0123456789abcdef").Err(); err != nil {
			t.Fatalf("writing a previous record: %v", err)
		}
	}
	out, err := e.Check(ctx, q)
	if err != nil || out.Replayed || !out.Allowed {
		t.Fatalf("check over previous records: %+v, %v; want allowed, decided afresh", out, err)
	}
	if again, err := e.Check(ctx, q); err != nil || !again.Replayed {
		t.Errorf("its retry: %+v, %v; want replayed from this version's record", again, err)
	}
	peek, err := e.Peek(ctx, recordQuery(t, user, "/api/x", ""))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range peek.Limits {
		if l.Rule.ID == "user-3" && l.Result.Used != 1 {
			t.Errorf("%s: used %d, want 1", l.Rule.ID, l.Result.Used)
		}
	}
}

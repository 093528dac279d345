package bucket

import (
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/algorithm"
	"github.com/redis/go-redis/v9"
)

// previousFiles are the check script's files of the version before layouts, in its order:
// testdata/previous holds a copy of its lua/*.lua, a checker of that version for the upgrade
// tests.
var previousFiles = []string{"prelude.lua", "token_bucket.lua", "leaky_bucket.lua", "fixed_window.lua",
	"sliding_window_log.lua", "sliding_window_counter.lua", "gcra.lua", "check.lua"}

// previousStore returns a Store on c that runs the previous version's script.
func previousStore(t *testing.T, c redis.UniversalClient) *Store {
	t.Helper()
	var b strings.Builder
	for _, name := range previousFiles {
		src, err := os.ReadFile(filepath.Join("testdata", "previous", name))
		if err != nil {
			t.Fatalf("the previous version's script: %v", err)
		}
		b.Write(src)
		b.WriteByte('\n')
	}
	sc := &script{Script: redis.NewScript(b.String()), src: b.String()}
	sc.sha = sc.Hash()
	s := NewStoreWithConfig(c, StoreConfig{BatchTimeout: layoutTimeout})
	s.script = sc
	s.b.alone.Store(true) // the previous version had no batch script: every call alone
	t.Cleanup(func() { s.Close() })
	return s
}

// layoutTimeout is the BatchTimeout of the layout tests' Stores: their pairs run a hundred
// subtests at once, and on a loaded CI run under the race detector a batch outlived the
// default second (these tests are about counts, not speed).
const layoutTimeout = 30 * time.Second

// layoutStores returns the checkers of a rolling upgrade, all on c: the previous version
// ("old") and this one in each layout.
func layoutStores(t *testing.T, c redis.UniversalClient) map[string]*Store {
	t.Helper()
	stores := map[string]*Store{"old": previousStore(t, c)}
	for l := range layouts {
		s := NewStoreWithConfig(c, StoreConfig{Layout: l, BatchTimeout: layoutTimeout})
		t.Cleanup(func() { s.Close() })
		stores[l.String()] = s
	}
	return stores
}

// TestLayoutUpgrade: a bucket written by one checker keeps its count when read and charged by
// another, for every algorithm and every pair of the rolling upgrade and of the switch between
// layouts (both ways, but from the shared layout only to the mixed one: LayoutMixed); also
// after a limit change, which keeps the count as Local does. Only a checker of the previous
// version reading a compact bucket is left out: see TestLayoutCompactNotForOld.
func TestLayoutUpgrade(t *testing.T) {
	t.Parallel()
	c := client(t)
	stores := layoutStores(t, c)
	pairs := []struct{ writer, reader string }{
		{"old", "previous"}, {"old", "compact"}, {"previous", "old"},
		{"previous", "compact"}, {"compact", "previous"}, {"compact", "compact"},
		{"old", "shared"}, {"previous", "shared"}, {"compact", "shared"}, {"shared", "shared"},
		{"compact", "mixed"}, {"mixed", "compact"}, {"mixed", "shared"}, {"shared", "mixed"}, {"mixed", "mixed"},
	}
	const L = 10
	for _, a := range allAlgorithms {
		for _, p := range pairs {
			t.Run(a.String()+"/"+p.writer+"-"+p.reader, func(t *testing.T) {
				t.Parallel()
				w, r := stores[p.writer], stores[p.reader]
				l := lim(key(t, "b"), a, L, long, 0)
				if res := check(t, w, one(l, 7)); !res.Allowed {
					t.Fatalf("%s: the first charge of 7 of %d denied", p.writer, L)
				}
				if got := check(t, r, peekReq(l)).Limits[0].Remaining; got != L-7 {
					t.Fatalf("%s after %s: remaining %d, want %d", p.reader, p.writer, got, L-7)
				}
				if res := check(t, r, one(l, L-7)); !res.Allowed || res.Limits[0].Remaining != 0 {
					t.Fatalf("%s after %s: charging the last %d: allowed %v remaining %d, want true 0",
						p.reader, p.writer, L-7, res.Allowed, res.Limits[0].Remaining)
				}
				if res := check(t, r, one(l, 1)); res.Allowed {
					t.Errorf("%s after %s: a unit past the limit allowed", p.reader, p.writer)
				}
				if p.reader == "shared" && p.writer != "shared" && p.writer != "mixed" {
					// The bucket moved into its field at the reader's first charge, where only
					// the mixed and shared layouts look (LayoutMixed).
					if inShared(l) {
						if n := serverOf(t, c, l.Key).Exists(ctxT(t), l.Key).Val(); n != 0 {
							t.Errorf("shared after %s: the bucket's key still exists, want it moved into its field", p.writer)
						}
					}
				} else if p.writer != "old" || p.reader != "compact" { // the writer reads the reader's layout
					if got := check(t, w, peekReq(l)).Limits[0].Remaining; got != 0 {
						t.Errorf("%s after %s: remaining %d, want 0", p.writer, p.reader, got)
					}
				}

				// A limit raised mid-window keeps the count, as in Local.
				l = lim(key(t, "raised"), a, L, long, 0)
				loc := NewLocal(0)
				now := time.Now()
				check(t, w, one(l, 7))
				loc.Check(now, one(l, 7))
				l.Limit = 2 * L
				want := loc.Check(now, peekReq(l)).Limits[0].Remaining
				if got := check(t, r, peekReq(l)).Limits[0].Remaining; got != want {
					t.Errorf("%s after %s, limit raised to %d: remaining %d, want %d", p.reader, p.writer, l.Limit, got, want)
				}
			})
		}
	}
}

// TestLayoutCompactNotForOld shows why LayoutPrevious is the default: a checker of the previous
// version fails the check of a bucket a compact writer wrote, except for the algorithms whose
// compact state it reads (gcra's integer TAT).
func TestLayoutCompactNotForOld(t *testing.T) {
	t.Parallel()
	c := client(t)
	stores := layoutStores(t, c)
	for _, a := range allAlgorithms {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			l := lim(key(t, "b"), a, 10, long, 0)
			check(t, stores["compact"], one(l, 7))
			res, err := stores["old"].Check(ctxT(t), []Request{peekReq(l)})
			switch a {
			case algorithm.FixedWindow, algorithm.TokenBucket:
				if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
					t.Errorf("old checker on a compact bucket: got %v, want a WRONGTYPE error", err)
				}
			default:
				if err != nil || res[0].Limits[0].Remaining != 3 {
					t.Errorf("old checker on a compact bucket: got %v, %v, want remaining 3", res, err)
				}
			}
		})
	}
}

// TestLayoutState: what each layout writes, the state the module headers describe.
func TestLayoutState(t *testing.T) {
	t.Parallel()
	c := client(t)
	stores := layoutStores(t, c)
	now := c.Time(ctxT(t)).Val().UnixMicro()
	const hour = int64(time.Hour / time.Microsecond)
	wid := now / hour
	fwCompact := func(n int64) string { return strconv.FormatInt(n*8+wid%8, 10) }
	tests := []struct {
		name   string
		layout string
		l      Limit
		typ    string // TYPE of the key
		enc    string // OBJECT ENCODING
		value  string // the string's value, when it is known
		expire int64  // PEXPIRETIME, when it is known
	}{
		{"fixed_window previous", "previous", lim("fw", algorithm.FixedWindow, 10, time.Hour, 0), "hash", "listpack", "", (wid + 1) * hour / 1000},
		{"fixed_window compact", "compact", lim("fw", algorithm.FixedWindow, 10, time.Hour, 0), "string", "int", fwCompact(7), (wid + 1) * hour / 1000},
		{"token_bucket previous", "previous", lim("tb", algorithm.TokenBucket, 10, long, 0), "hash", "listpack", "", 0},
		{"token_bucket compact", "compact", lim("tb", algorithm.TokenBucket, 10, long, 0), "string", "embstr", "", 0},
		{"gcra whole µs previous", "previous", lim("gcra", algorithm.GCRA, 10, 10*time.Second, 0), "string", "int", "", 0},
		{"gcra whole µs compact", "compact", lim("gcra", algorithm.GCRA, 10, 10*time.Second, 0), "string", "int", "", 0},
		{"gcra fraction compact", "compact", lim("gcra", algorithm.GCRA, 3, time.Second, 10), "string", "embstr", "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.l.Key = key(t, tt.l.Key)
			if res := check(t, stores[tt.layout], one(tt.l, 7)); !res.Allowed {
				t.Fatalf("charge of 7 denied")
			}
			srv := serverOf(t, c, tt.l.Key)
			ctx := ctxT(t)
			if got := srv.Type(ctx, tt.l.Key).Val(); got != tt.typ {
				t.Errorf("TYPE %s, want %s", got, tt.typ)
			}
			if got := srv.ObjectEncoding(ctx, tt.l.Key).Val(); got != tt.enc {
				t.Errorf("OBJECT ENCODING %s, want %s", got, tt.enc)
			}
			if tt.value != "" {
				if got := srv.Get(ctx, tt.l.Key).Val(); got != tt.value {
					t.Errorf("value %q, want %q (7 * 8 + window id %% 8)", got, tt.value)
				}
			}
			if tt.expire != 0 {
				if got := srv.PExpireTime(ctx, tt.l.Key).Val(); got != time.Duration(tt.expire)*time.Millisecond {
					t.Errorf("PEXPIRETIME %v, want the end of the window, %v", got, time.Duration(tt.expire)*time.Millisecond)
				}
			}
		})
	}
}

// TestLayoutFixedWindowAhead: a compact fixed window ahead of the clock (the clock stepped
// back) keeps its count, whether its low bits name another window (read from its expiry) or
// the current one (8 windows ahead).
func TestLayoutFixedWindowAhead(t *testing.T) {
	t.Parallel()
	s, c := newStore(t)
	const L = 5
	hour := time.Hour.Microseconds()
	wid := c.Time(ctxT(t)).Val().UnixMicro() / hour
	for _, ahead := range []int64{1, 3, 8} {
		t.Run(strconv.FormatInt(ahead, 10), func(t *testing.T) {
			t.Parallel()
			l := lim(key(t, "b"), algorithm.FixedWindow, L, time.Hour, 0)
			sw := wid + ahead
			v := strconv.FormatInt(L*8+sw%8, 10)
			end := time.UnixMilli((sw + 1) * hour / 1000)
			if err := serverOf(t, c, l.Key).Set(ctxT(t), l.Key, v, 0).Err(); err != nil {
				t.Fatal(err)
			}
			if err := serverOf(t, c, l.Key).PExpireAt(ctxT(t), l.Key, end).Err(); err != nil {
				t.Fatal(err)
			}
			res := check(t, s, one(l, 1))
			checkInvariants(t, one(l, 1), res)
			if res.Allowed || res.Limits[0].Remaining != 0 {
				t.Errorf("got allowed %v remaining %d, want false 0", res.Allowed, res.Limits[0].Remaining)
			}
			if ahead%8 != 0 && !res.Limits[0].ResetAt.Equal(end) {
				t.Errorf("reset at %v, want the end of the stored window %v", res.Limits[0].ResetAt, end)
			}
		})
	}
}

// TestLayoutRefund: a charge is refunded exactly whatever layout the key took since, as
// Check does after another request of its call denied.
func TestLayoutRefund(t *testing.T) {
	t.Parallel()
	c := client(t)
	stores := layoutStores(t, c)
	for _, a := range allAlgorithms {
		for _, p := range [][2]string{{"compact", "previous"}, {"previous", "compact"}, {"compact", "compact"},
			{"mixed", "shared"}, {"shared", "mixed"}, {"compact", "mixed"}, {"shared", "shared"}} {
			t.Run(a.String()+"/"+p[0]+"-"+p[1], func(t *testing.T) {
				t.Parallel()
				first, second := stores[p[0]], stores[p[1]]
				l := lim(key(t, "b"), a, 10, long, 0)
				res := check(t, first, one(l, 4))
				check(t, second, one(l, 3))
				refundNow(t, first, one(l, 4), res)
				if got := check(t, second, peekReq(l)).Limits[0].Remaining; got != 7 {
					t.Errorf("remaining %d after the refund of 4 of 7 charged, want 7", got)
				}
			})
		}
	}
}

// TestLayoutFixedWindowCharge: a compact fixed window's one-limit charge in a batch is one
// INCRBY (fixed_window.lua's fw_charge), with SET PXAT for the window's first charge and DECRBY
// to undo a denial; what it leaves is what eval and commit would leave. Counted in
// commandstats on a Redis of the test's own.
func TestLayoutFixedWindowCharge(t *testing.T) {
	t.Parallel()
	_, c, s := ownStore(t, StoreConfig{Layout: LayoutCompact})
	ctx := ctxT(t)
	const big = 1<<50 - 1 // the largest limit (validate.go)
	hour := time.Hour.Microseconds()
	wid := c.Time(ctx).Val().UnixMicro() / hour
	stored := func(key string, n, w int64) { // a count of n in window w
		c.Set(ctx, key, strconv.FormatInt(n*8+w%8, 10), 0)
		c.PExpireAt(ctx, key, time.UnixMilli((w+1)*hour/1000))
	}
	// A count of 0 (a refund's) in the current window; a count of 1 in the window ahead (the
	// clock stepped back), whose low bits differ; a count one below the largest limit, which a
	// charge of 2 takes past 2^53 when times 8.
	c.Set(ctx, "fw-zero", "0", 0) // low bits 0, whatever the window
	c.PExpireAt(ctx, "fw-zero", time.UnixMilli((wid+1)*hour/1000))
	stored("fw-other", 1, wid+1)
	stored("fw-big", big-1, wid)
	tests := []struct {
		name            string
		key             string
		limit, cost     int64
		allowed         bool
		used, remaining int64
		commands        map[string]int64 // calls per command, the script's own left out
	}{
		{"first charge", "fw", 3, 1, true, 1, 2, map[string]int64{"incrby": 1, "set": 1}},
		{"charge", "fw", 3, 2, true, 3, 0, map[string]int64{"incrby": 1}},
		{"denied", "fw", 3, 1, false, 3, 0, map[string]int64{"incrby": 1, "decrby": 1}},
		{"above the limit", "fw", 3, 4, false, 3, 0, map[string]int64{"get": 1}},
		{"a count of 0", "fw-zero", 3, 1, true, 1, 2, map[string]int64{"incrby": 1, "set": 1}},
		{"another window", "fw-other", 3, 1, true, 2, 1, map[string]int64{"incrby": 1, "decrby": 1, "get": 1, "pexpiretime": 1, "set": 1}},
		{"past 2^53", "fw-big", big, 2, false, big - 1, 1, map[string]int64{"incrby": 1, "decrby": 1, "get": 1}},
	}
	for _, tt := range tests { // in order: each charge follows the one before
		if err := c.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		l := lim(tt.key, algorithm.FixedWindow, tt.limit, time.Hour, 0)
		res := check(t, s, one(l, tt.cost))
		checkInvariants(t, one(l, tt.cost), res)
		got := res.Limits[0]
		if res.Allowed != tt.allowed || got.Used != tt.used || got.Remaining != tt.remaining {
			t.Errorf("%s: allowed %v used %d remaining %d, want %v %d %d", tt.name, res.Allowed, got.Used, got.Remaining, tt.allowed, tt.used, tt.remaining)
		}
		if cmds := commandCalls(t, c); !maps.Equal(cmds, tt.commands) {
			t.Errorf("%s: commands %v, want %v", tt.name, cmds, tt.commands)
		}
		// The stored count, in the window its expiry names (PEXPIRETIME, ms): what eval and
		// commit would have written.
		sw := c.PExpireTime(ctx, tt.key).Val().Milliseconds()*1000/hour - 1
		if v, want := c.Get(ctx, tt.key).Val(), strconv.FormatInt(tt.used*8+sw%8, 10); v != want || sw < wid {
			t.Errorf("%s: value %q in window %d, want %q in window %d or later", tt.name, v, sw, want, wid)
		}
	}
}

// commandCalls returns the calls of each command c's Redis counted since its stats were reset,
// but for the batch's own (FCALL, FUNCTION LOAD, EVALSHA, TIME) and the client's (HELLO,
// CLIENT, INFO, CONFIG).
func commandCalls(t *testing.T, c *redis.Client) map[string]int64 {
	t.Helper()
	info, err := c.Info(ctxT(t), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]int64{}
	for line := range strings.SplitSeq(info, "\r\n") {
		name, val, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":calls=")
		if !ok || strings.ContainsAny(name, "|") {
			continue
		}
		switch name {
		case "fcall", "evalsha", "eval", "time", "hello", "client", "info", "config":
			continue
		}
		n, _ := strconv.ParseInt(val[:strings.IndexByte(val, ',')], 10, 64)
		calls[name] = n
	}
	return calls
}

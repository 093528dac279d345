package admin

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/internal/app/health"
	"github.com/quotaflow/quotaflow/internal/testbed/rulestoretest"
)

// TestLiveFeedBounds: one token holds at most MaxLiveFeedsPerToken live feeds (429 past it,
// naming the token), another token still gets one, and a feed ends after
// MaxLiveFeedDuration.
func TestLiveFeedBounds(t *testing.T) {
	t.Parallel()
	store, js := rulestoretest.Seeded(t, adminRules)
	set, err := store.Current(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	env := newEnv(t, checker.Config{Rules: set}, Config{RuleStore: store, JetStream: js, ReadPerMinute: 1e6, WritePerMinute: 1e6,
		Tokens:               map[string]Token{writeToken: {"alice-ops", RoleWrite}, readToken: {"dashboard", RoleRead}},
		MaxLiveFeedsPerToken: 2, MaxLiveFeedDuration: 2 * time.Second})
	open := func(token string) (*http.Response, time.Time) {
		t.Helper()
		req, _ := http.NewRequest("GET", env.url+"/api/v1/live", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		sent := time.Now() // before the server's clock for the feed starts
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp, sent
	}
	first, opened := open(readToken)
	second, _ := open(readToken)
	for i, resp := range []*http.Response{first, second} {
		if line, _ := bufio.NewReader(resp.Body).ReadString('\n'); resp.StatusCode != 200 || line != "event: hello\n" {
			t.Fatalf("feed %d: %d %q, want 200 and the hello event", i+1, resp.StatusCode, line)
		}
	}
	third, _ := open(readToken)
	body, _ := io.ReadAll(third.Body)
	if third.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(body), `token \"dashboard\" holds 2 live feeds`) {
		t.Errorf("a third feed of one token: %d %s, want 429 naming the token", third.StatusCode, body)
	}
	if other, _ := open(writeToken); other.StatusCode != 200 {
		t.Errorf("another token's feed: %d, want 200", other.StatusCode)
	}
	// The first feed ends on its own after MaxLiveFeedDuration.
	io.Copy(io.Discard, first.Body)
	if took := time.Since(opened); took < 2*time.Second || took > 30*time.Second {
		t.Errorf("the feed ended after %v, want after its 2s", took)
	}
}

// TestLiveRates: the live feed's rates are the checkers' health reports, the source of the
// console's checker rows: each checker's rates by instance, and their sum for the counters. An
// aggregator's report counts for nothing, nor does a checker's too old to be alive (a report
// expires from the bucket without telling its watchers) or one deleted (a checker that stopped).
func TestLiveRates(t *testing.T) {
	t.Parallel()
	store, js := rulestoretest.Seeded(t, adminRules)
	set, err := store.Current(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	env := newEnv(t, checker.Config{Rules: set}, Config{RuleStore: store, JetStream: js, ReadPerMinute: 1e6,
		Tokens: map[string]Token{readToken: {"dashboard", RoleRead}}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: health.Bucket})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	report := func(instance string, at time.Time, r health.Rates) health.Report {
		return health.Report{Role: health.RoleChecker, Instance: instance, At: at, Interval: time.Minute, Checker: &health.CheckerView{Rates: r}}
	}
	a, b := health.Rates{Allowed: 20, Denied: 2.5}, health.Rates{Allowed: 5, Delayed: 1, Degraded: 3}
	tests := []struct {
		name   string
		change func() error // before the feed opens for the first
		want   Rates
	}{
		{"every checker", func() error {
			for key, r := range map[string]health.Report{
				"checker.a":    report("a", now, a),
				"checker.b":    report("b", now, b),
				"checker.gone": report("gone", now.Add(-time.Hour), health.Rates{Allowed: 1000}),
				"aggregator.x": {Role: health.RoleAggregator, Instance: "x", At: now, Interval: time.Minute, Aggregator: &health.AggregatorView{}},
			} {
				v, _ := json.Marshal(r)
				if _, err := kv.Put(ctx, key, v); err != nil {
					return err
				}
			}
			return nil
		}, Rates{Rates: health.Rates{Allowed: 25, Delayed: 1, Denied: 2.5, Degraded: 3}, Checkers: map[string]health.Rates{"a": a, "b": b}}},
		{"a checker stopped", func() error { return kv.Delete(ctx, "checker.b") },
			Rates{Rates: a, Checkers: map[string]health.Rates{"a": a}}},
	}
	req, _ := http.NewRequestWithContext(ctx, "GET", env.url+"/api/v1/live", nil)
	req.Header.Set("Authorization", "Bearer "+readToken)
	var (
		resp *http.Response // the feed, opened after the first change, read by every step
		feed *bufio.Reader
	)
	defer func() {
		if resp != nil {
			resp.Body.Close()
		}
	}()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.change(); err != nil {
				t.Fatal(err)
			}
			if resp == nil {
				var err error
				if resp, err = http.DefaultClient.Do(req); err != nil {
					t.Fatal(err)
				}
				feed = bufio.NewReader(resp.Body)
			}
			// The rates of the reports put before the watch, or since: the events before it
			// are zeros, or the previous step's.
			var got Rates
			for range 20 {
				data, err := nextEvent(feed, "rates")
				if err != nil {
					t.Fatal(err)
				}
				got = Rates{}
				if err := json.Unmarshal([]byte(data), &got); err != nil {
					t.Fatalf("rates %s: %v", data, err)
				}
				got.At = time.Time{}
				if reflect.DeepEqual(got, tt.want) {
					return
				}
			}
			t.Errorf("rates %+v, want %+v", got, tt.want)
		})
	}
}

// nextEvent reads server-sent events until one named event, and returns its data.
func nextEvent(r *bufio.Reader, event string) (string, error) {
	var name string
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return "", err
		}
		switch line = strings.TrimSuffix(line, "\n"); {
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: ") && name == event:
			return strings.TrimPrefix(line, "data: "), nil
		}
	}
}

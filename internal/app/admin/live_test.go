package admin

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/internal/stream"
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
	// The feed reads the decision stream, which the checkers create.
	if _, err := js.CreateOrUpdateStream(context.Background(), jetstream.StreamConfig{Name: stream.Name, Subjects: []string{stream.SubjectPrefix + ".>"}}); err != nil {
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

package admin

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/app/backtest"
)

// blockingBacktester stands in for the ClickHouse replay (tested in cmd/quotaflow against a
// real pipeline): it hands over each request and answers once released.
type blockingBacktester struct {
	got     chan backtest.Request
	release chan struct{}
}

func (b *blockingBacktester) Run(ctx context.Context, req backtest.Request) (*backtest.Report, error) {
	b.got <- req
	<-b.release
	return &backtest.Report{Checks: 7}, nil
}

func (b *blockingBacktester) LiveCandidates(ctx context.Context, req backtest.Request) (*backtest.Report, error) {
	b.got <- req
	<-b.release
	return &backtest.Report{Checks: 9, LiveCandidates: true}, nil
}

// TestBacktestOneAtATime: POST /api/v1/rules:backtest with no rules replays the rules in force;
// while one runs, another is answered 503 at once.
func TestBacktestOneAtATime(t *testing.T) {
	t.Parallel()
	bt := &blockingBacktester{got: make(chan backtest.Request, 1), release: make(chan struct{})}
	env, _ := newAdminEnv(t, adminRules, Config{Backtester: bt})
	post := func() (int, string) {
		req, _ := http.NewRequest("POST", env.url+"/api/v1/rules:backtest", strings.NewReader(`{"from": "2026-11-27T10:00:00Z"}`))
		req.Header.Set("Authorization", "Bearer "+readToken)
		resp, err := env.http.Do(req)
		if err != nil {
			t.Error(err)
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	first := make(chan string, 1)
	go func() {
		code, body := post()
		first <- body
		if code != 200 {
			t.Errorf("first backtest: %d %s, want 200", code, body)
		}
	}()
	select {
	case req := <-bt.got:
		if _, ok := req.Rules.Rule("orders"); !ok || !req.From.Equal(time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)) {
			t.Errorf("backtest of %+v, want the rules in force from 10:00", req)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the backtest never started")
	}
	if code, body := post(); code != http.StatusServiceUnavailable || !strings.Contains(body, "a backtest is running") {
		t.Errorf("second backtest while the first runs: %d %s, want 503", code, body)
	}
	close(bt.release)
	if body := <-first; !strings.Contains(body, `"checks": 7`) && !strings.Contains(body, `"checks":7`) {
		t.Errorf("first backtest answered %s, want the report", body)
	}
}

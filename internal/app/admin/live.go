package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/internal/broker"
	"github.com/quotaflow/quotaflow/internal/stream"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

// streamBody is an answer sent as it comes (server-sent events) instead of one body.
type streamBody func(w http.ResponseWriter, r *http.Request)

// Rates are the checks of every checker per second, by outcome: what the decision stream
// carried over the last second.
type Rates struct {
	At       time.Time `json:"at"`
	Allowed  int64     `json:"allowed"`
	Delayed  int64     `json:"delayed"`
	Denied   int64     `json:"denied"`
	Degraded int64     `json:"degraded"`
}

// rateInterval is how often the live feed sends Rates: an idle feed sends zeros, which also
// keeps proxies from closing it.
const rateInterval = time.Second

// live answers GET /api/v1/live?tier=&rule=&subject= as server-sent events: "transition"
// events (events.Transition, as the aggregators publish them) that match the filters (subject
// as dimension:identifier), and every second a "rates" event (Rates) counted from the
// decision stream, which carries every checker's decisions. Both are read with ephemeral
// ordered consumers: a feed changes nothing on the server, and ends with its client.
func (a *API) live(r *http.Request, c caller) (int, any, error) {
	if a.js == nil {
		return 0, nil, &Error{Status: http.StatusServiceUnavailable, Code: "unavailable",
			Message: "the live feed reads NATS: start the checker with --nats-url"}
	}
	if err := a.takeFeed(c.Name); err != nil {
		return 0, nil, err
	}
	q := r.URL.Query()
	tier, rule, subject := q.Get("tier"), q.Get("rule"), q.Get("subject")
	return http.StatusOK, streamBody(func(w http.ResponseWriter, r *http.Request) {
		defer a.giveFeed(c.Name)
		ctx, cancel := context.WithTimeout(r.Context(), a.feedFor)
		defer cancel()
		r = r.WithContext(ctx)
		a.serveLive(w, r, func(t *events.Transition) bool {
			return (tier == "" || t.Tier == tier) && (rule == "" || t.RuleID == rule) &&
				(subject == "" || t.Dimension+":"+t.Subject == subject)
		})
	}), nil
}

// takeFeed takes a place for a live feed of token: one of the checker's (503 past
// MaxLiveFeeds) and one of the token's (429 past MaxLiveFeedsPerToken).
func (a *API) takeFeed(token string) error {
	a.feedsMu.Lock()
	defer a.feedsMu.Unlock()
	if a.feedsBy[token] >= a.feedsPer {
		return &Error{Status: http.StatusTooManyRequests, Code: "rate_limited", RetryAfter: time.Second,
			Message: fmt.Sprintf("token %q holds %d live feeds already, the most one token may: close one", token, a.feedsPer)}
	}
	select {
	case a.feeds <- struct{}{}:
	default:
		return &Error{Status: http.StatusServiceUnavailable, Code: "unavailable",
			Message: fmt.Sprintf("this checker serves %d live feeds already: close one, or use another checker", cap(a.feeds))}
	}
	a.feedsBy[token]++
	return nil
}

// giveFeed gives back the places takeFeed took.
func (a *API) giveFeed(token string) {
	a.feedsMu.Lock()
	defer a.feedsMu.Unlock()
	if a.feedsBy[token]--; a.feedsBy[token] <= 0 {
		delete(a.feedsBy, token)
	}
	<-a.feeds
}

// serveLive streams until the client goes, the feed's time is up or NATS fails; the failure is sent as an "error"
// event, which the console shows, and the client reconnects.
func (a *API) serveLive(w http.ResponseWriter, r *http.Request, keep func(*events.Transition) bool) {
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{}) // a feed outlives any write timeout
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no") // nginx: pass each event on at once
	w.WriteHeader(http.StatusOK)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()

	f := &liveFeed{w: w, rc: rc}
	if err := f.send("hello", map[string]string{"instance": a.engine.InstanceID()}); err != nil {
		return
	}
	errs := make(chan error, 2)
	go func() { errs <- a.tailTransitions(ctx, f, keep) }()
	go func() { errs <- a.tailDecisions(ctx, f) }()
	tick := time.NewTicker(rateInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case err := <-errs:
			if ctx.Err() == nil {
				a.log.Warn("live feed ended", "err", err)
				_ = f.send("error", map[string]string{"message": fmt.Sprintf("live feed: %v", err)})
			}
			return
		case now := <-tick.C:
			if f.send("rates", f.takeRates(now)) != nil {
				return
			}
		}
	}
}

// liveFeed is one client's live feed: the events written to it, and the rates counted since
// the last "rates" event. Its tails and its ticker write from their own goroutines.
type liveFeed struct {
	w  http.ResponseWriter
	rc *http.ResponseController

	mu    sync.Mutex // one writer at a time; guards rates
	rates Rates
}

// send writes one event and flushes it to the client.
func (f *liveFeed) send(event string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := fmt.Fprintf(f.w, "event: %s\ndata: %s\n\n", event, b); err != nil {
		return err
	}
	return f.rc.Flush()
}

// count adds a batch's decisions to the rates, by outcome.
func (f *liveFeed) count(b *quotaflowv1.DecisionBatch) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, d := range b.Decisions {
		switch {
		case d.GetDegraded():
			f.rates.Degraded++
		case !d.GetAllowed():
			f.rates.Denied++
		case d.GetDelayUs() > 0:
			f.rates.Delayed++
		default:
			f.rates.Allowed++
		}
	}
}

// takeRates returns the rates counted since the last call, stamped now, and starts over.
func (f *liveFeed) takeRates(now time.Time) Rates {
	f.mu.Lock()
	r := f.rates
	f.rates = Rates{}
	f.mu.Unlock()
	r.At = now.UTC()
	return r
}

// tailTransitions sends the warning transitions that keep accepts, from now on, until ctx
// ends or the feed fails.
func (a *API) tailTransitions(ctx context.Context, f *liveFeed, keep func(*events.Transition) bool) error {
	return broker.Tail(ctx, a.js, events.Stream, []string{events.WarningsPrefix + ".>"}, false, func(m jetstream.Msg) (bool, error) {
		var t events.Transition
		if json.Unmarshal(m.Data(), &t) != nil || !keep(&t) {
			return false, nil
		}
		return false, f.send("transition", &t)
	})
}

// tailDecisions counts the decisions of every checker into the feed's rates, from now on,
// until ctx ends or the stream fails.
func (a *API) tailDecisions(ctx context.Context, f *liveFeed) error {
	return broker.Tail(ctx, a.js, stream.Name, nil, false, func(m jetstream.Msg) (bool, error) {
		var b quotaflowv1.DecisionBatch
		if proto.Unmarshal(m.Data(), &b) != nil {
			return false, nil
		}
		f.count(&b)
		return false, nil
	})
}

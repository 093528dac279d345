package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/internal/app/health"
	"github.com/quotaflow/quotaflow/internal/broker"
)

// streamBody is an answer sent as it comes (server-sent events) instead of one body.
type streamBody func(w http.ResponseWriter, r *http.Request)

// Rates are the checks per second by outcome of every checker, and of each one by instance, as
// the checkers' health reports give them: each checker's own count of the checks it decided
// over its last report interval (health.CheckerView.Rates). The console shows the sum as its
// counters and each checker's in that checker's row, so that the two are one measure and
// agree. They were once counted from the decision stream, each second's arrivals, which
// disagreed with the rows: a row changed with its checker's report (every 2s, rates over the
// last 2s, the first report none), read by the console every 5s, so that traffic showed in the
// counters seconds before the row and a short burst not in the row at all; the stream carries
// decisions late under load (batched, spooled, replayed after an outage, read by a consumer
// that falls behind); and it carries settles, cancels and lease releases, which are no checks
// and were counted as allowed ones.
type Rates struct {
	At time.Time `json:"at"`
	health.Rates
	// Checkers are each checker's rates, by instance.
	Checkers map[string]health.Rates `json:"checkers"`
}

// rateInterval is how often the live feed sends Rates: an idle feed sends zeros, which also
// keeps proxies from closing it. The rates change with each checker's report (every 2s by
// default).
const rateInterval = time.Second

// live answers GET /api/v1/live?tier=&rule=&subject= as server-sent events: "transition"
// events (events.Transition, as the aggregators publish them) that match the filters (subject
// as dimension:identifier), and every second a "rates" event (Rates) from the checkers' health
// reports. Both are read with ephemeral ordered consumers: a feed changes nothing on the
// server, and ends with its client.
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
	go func() { errs <- a.tailRates(ctx, f) }()
	running := 2
	select {
	case <-ctx.Done():
	case err := <-errs:
		running--
		if ctx.Err() == nil {
			a.log.Warn("live feed ended", "err", err)
			_ = f.send("error", map[string]string{"message": fmt.Sprintf("live feed: %v", err)})
		}
	}
	// The tails write to w, which must not be written once the handler returns.
	cancel()
	for ; running > 0; running-- {
		<-errs
	}
}

// liveFeed is one client's live feed: the events written to it, from its tails' goroutines.
type liveFeed struct {
	w  http.ResponseWriter
	rc *http.ResponseController

	mu sync.Mutex // one writer at a time
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

// tailRates sends the checkers' rates (Rates) every rateInterval, from their health reports
// as they are put into the health bucket, until ctx ends or the watch fails. Until the bucket
// exists (no process has reported yet) the rates are zeros.
func (a *API) tailRates(ctx context.Context, f *liveFeed) error {
	reports := map[string]health.Report{} // the checkers' latest, by key
	var (
		w       jetstream.KeyWatcher
		updates <-chan jetstream.KeyValueEntry // nil, so never ready, until w watches
	)
	defer func() {
		if w != nil {
			_ = w.Stop()
		}
	}()
	tick := time.NewTicker(rateInterval)
	defer tick.Stop()
	for {
		if w == nil {
			var err error
			switch w, err = watchReports(ctx, a.js); {
			case err == nil:
				updates = w.Updates()
			case ctx.Err() != nil:
				return nil
			case !errors.Is(err, jetstream.ErrBucketNotFound):
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-updates:
			switch {
			case !ok:
				return errors.New("health reports: the watch ended")
			case e == nil: // the reports present when the watch began are all in
			case e.Operation() != jetstream.KeyValuePut:
				delete(reports, e.Key()) // a process that stopped cleanly
			default:
				var r health.Report
				if json.Unmarshal(e.Value(), &r) != nil || r.Role != health.RoleChecker || r.Checker == nil {
					delete(reports, e.Key())
					continue
				}
				reports[e.Key()] = r
			}
		case now := <-tick.C:
			if err := f.send("rates", sumRates(reports, now)); err != nil {
				return err
			}
		}
	}
}

// watchReports watches every key of the health bucket, beginning with the reports in it now.
// The bucket's lookup is bounded as a health probe is: a NATS that does not answer ends the
// feed with an error event, which the console shows and reconnects after, rather than leaving
// it open with nothing in it.
func watchReports(ctx context.Context, js jetstream.JetStream) (jetstream.KeyWatcher, error) {
	lctx, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	kv, err := js.KeyValue(lctx, health.Bucket)
	if err != nil {
		return nil, fmt.Errorf("health reports: %w", err)
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("watch health reports: %w", err)
	}
	return w, nil
}

// sumRates adds up the rates of the checkers' reports current at now. A report expires from
// the bucket after a few of its intervals without telling watchers: one older than that is a
// checker gone (or cut off from NATS), and counts for nothing, as health.List would not list it.
func sumRates(reports map[string]health.Report, now time.Time) Rates {
	out := Rates{At: now.UTC(), Checkers: map[string]health.Rates{}}
	for _, r := range reports {
		if now.Sub(r.At) > time.Duration(health.DefaultKeepIntervals)*r.Interval {
			continue
		}
		c := r.Checker.Rates
		out.Checkers[r.Instance] = c
		out.Allowed += c.Allowed
		out.Delayed += c.Delayed
		out.Denied += c.Denied
		out.Degraded += c.Degraded
	}
	return out
}

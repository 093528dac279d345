package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/internal/webhook"
)

// newDispatcher starts a dispatcher of stream under policy with a fast schedule and a memory
// log; it closes with the test.
func newDispatcher(t *testing.T, js jetstream.JetStream, stream string, policy webhook.URLPolicy, cfg webhook.Config) (*webhook.Dispatcher, *webhook.MemoryLog) {
	t.Helper()
	log := webhook.NewMemoryLog(0)
	cfg.Stream, cfg.Policy, cfg.Log = stream, policy, log
	if cfg.Schedule.Span == 0 {
		cfg.Schedule = fast
	}
	d, err := webhook.New(js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d, log
}

func setEndpoints(t *testing.T, d *webhook.Dispatcher, eps ...webhook.Endpoint) {
	t.Helper()
	if err := d.SetEndpoints(eps); err != nil {
		t.Fatal(err)
	}
}

// TestDeliver: every message published after SetEndpoints reaches the endpoints whose filter
// takes its type, signed, with its Nats-Msg-Id as webhook-id ("<stream>-<sequence>" without
// one), and each attempt is in the delivery log.
func TestDeliver(t *testing.T) {
	t.Parallel()
	js, stream, prefix := testStream(t)
	all, low := newReceiver(t), newReceiver(t)
	d, log := newDispatcher(t, js, stream, allow(all, low), webhook.Config{})
	lowEP := low.endpoint("low")
	lowEP.Filter = []string{"balance.low"}
	setEndpoints(t, d, all.endpoint("all"), lowEP)

	publish(t, js, prefix+".acme", "evt-1", "balance.low", `{"balance":3}`)
	publish(t, js, prefix+".acme", "", "balance.out", `{"balance":0}`)
	publish(t, js, prefix+".acme.balance.low", "", "", `{"balance":2}`) // its type is its subject

	want := []struct{ id, body string }{{"evt-1", `{"balance":3}`}, {stream + "-2", `{"balance":0}`}, {stream + "-3", `{"balance":2}`}}
	for _, w := range want {
		if got := all.next(t, 10*time.Second); got.id != w.id || got.body != w.body || got.contentType != "application/json" {
			t.Errorf("endpoint all got id %q body %q (%s), want %q %q", got.id, got.body, got.contentType, w.id, w.body)
		}
	}
	if got := low.next(t, 10*time.Second); got.id != "evt-1" {
		t.Errorf("endpoint low got %q, want evt-1 only", got.id)
	}
	eventually(t, 10*time.Second, "every message settled", func() bool {
		return len(log.Entries("all")) == 3 && pending(t, js, stream, "low") == 0
	})
	if got := low.deliveries(); len(got) != 1 {
		t.Errorf("endpoint low got %d requests, want 1: its filter takes balance.low only", len(got))
	}
	for _, e := range log.Entries("") {
		if e.Outcome() != "delivered" || e.N != 1 || e.Status != http.StatusOK {
			t.Errorf("log entry %+v, want delivered at attempt 1 with 200", e)
		}
	}
}

// pending is the number of messages of endpoint's consumer not yet acknowledged.
func pending(t *testing.T, js jetstream.JetStream, stream, endpoint string) int {
	t.Helper()
	c, err := js.Consumer(context.Background(), stream, webhook.ConsumerName(endpoint))
	if err != nil {
		return -1
	}
	info := c.CachedInfo()
	return int(info.NumPending) + info.NumAckPending
}

// TestRetries: what a receiver answers decides what follows, always with the same webhook-id.
func TestRetries(t *testing.T) {
	t.Parallel()
	short := webhook.Schedule{Delays: []time.Duration{50 * time.Millisecond, 50 * time.Millisecond}, Span: 100 * time.Millisecond}
	tests := []struct {
		name         string
		answers      []answer
		schedule     webhook.Schedule
		body         string
		wantOutcomes []string
		wantGap      time.Duration // the least time between the first two requests
	}{
		{"503 then 200", []answer{{status: 503}, {status: 200}}, fast, `{}`, []string{"retry", "delivered"}, 50 * time.Millisecond},
		{"429 with Retry-After then 200", []answer{{status: 429, retryAfter: "1"}, {status: 200}}, fast, `{}`, []string{"retry", "delivered"}, time.Second},
		{"timeouts then 200", []answer{{block: true}, {block: true}, {status: 200}}, fast, `{}`, []string{"retry", "retry", "delivered"}, 0},
		{"400 not retried", []answer{{status: 400}}, fast, `{}`, []string{"failed"}, 0},
		{"500 until given up", []answer{{status: 500}}, short, `{}`, []string{"retry", "retry", "gave up"}, 50 * time.Millisecond},
		{"not JSON, not sent", nil, fast, `balance=3`, []string{"failed"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			js, stream, prefix := testStream(t)
			r := newReceiver(t, tt.answers...)
			d, log := newDispatcher(t, js, stream, allow(r), webhook.Config{Schedule: tt.schedule, Timeout: 300 * time.Millisecond})
			setEndpoints(t, d, r.endpoint("e"))
			publish(t, js, prefix+".x", "evt-1", "", tt.body)
			eventually(t, 15*time.Second, "the last outcome", func() bool {
				return len(log.Entries("e")) == len(tt.wantOutcomes)
			})
			time.Sleep(300 * time.Millisecond) // no attempt after the last
			if got := outcomes(log, "e"); !slices.Equal(got, tt.wantOutcomes) {
				t.Errorf("outcomes %v, want %v", got, tt.wantOutcomes)
			}
			checkAttempts(t, r, log, tt.body != `{}`, tt.wantGap)
		})
	}
}

// checkAttempts checks that every request r got carried one webhook-id and verified, that
// they were the log's attempts 1, 2, … (none when notSent), and that the first two were at
// least gap apart.
func checkAttempts(t *testing.T, r *receiver, log *webhook.MemoryLog, notSent bool, gap time.Duration) {
	t.Helper()
	got, entries := r.deliveries(), log.Entries("e")
	if notSent {
		got = nil
		if n := len(r.deliveries()); n != 0 {
			t.Errorf("receiver got %d requests, want none", n)
		}
	} else if len(got) != len(entries) {
		t.Errorf("receiver got %d requests, log has %d attempts", len(got), len(entries))
	}
	for i, e := range entries {
		if e.N != i+1 || e.Message != entries[0].Message {
			t.Errorf("log entry %d: attempt %d of %q, want %d of %q", i, e.N, e.Message, i+1, entries[0].Message)
		}
	}
	for i, d := range got {
		if d.id != entries[0].Message || d.verify != nil {
			t.Errorf("request %d: id %q, verify %v; want %q, nil", i, d.id, d.verify, entries[0].Message)
		}
	}
	if len(got) >= 2 && got[1].at.Sub(got[0].at) < gap {
		t.Errorf("retry %v after the first attempt, want at least %v", got[1].at.Sub(got[0].at), gap)
	}
}

// TestReceiverDownThenBack: while nothing listens on the endpoint's port the message is
// retried; once a receiver listens there again it gets the message, with its first id.
func TestReceiverDownThenBack(t *testing.T) {
	t.Parallel()
	js, stream, prefix := testStream(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	secret, err := webhook.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	d, log := newDispatcher(t, js, stream, allowHosts(addr), webhook.Config{})
	setEndpoints(t, d, webhook.Endpoint{ID: "e", URL: "http://" + addr + "/hooks", Secret: secret})
	publish(t, js, prefix+".x", "evt-down", "", `{"balance":1}`)
	eventually(t, 10*time.Second, "three failed attempts", func() bool { return len(log.Entries("e")) >= 3 })
	for _, e := range log.Entries("e") {
		if e.Outcome() != "retry" || e.Status != 0 || !strings.Contains(e.Err, "refused") {
			t.Errorf("attempt while down: %+v, want a refused connection, retried", e)
		}
	}

	l, err = listenAgain(addr)
	if err != nil {
		t.Skipf("port %s taken meanwhile: %v", addr, err)
	}
	r := startReceiver(t, l, secret)
	if got := r.next(t, 10*time.Second); got.id != "evt-down" || got.body != `{"balance":1}` {
		t.Errorf("receiver back got id %q body %q, want evt-down {\"balance\":1}", got.id, got.body)
	}
	eventually(t, 10*time.Second, "the delivery logged", func() bool {
		e := log.Entries("e")
		return e[len(e)-1].Outcome() == "delivered"
	})
	for _, e := range log.Entries("e") {
		if e.Message != "evt-down" {
			t.Errorf("log entry of %q, want evt-down throughout", e.Message)
		}
	}
}

// listenAgain listens on addr, which was just closed, trying for a second.
func listenAgain(addr string) (net.Listener, error) {
	var err error
	for range 20 {
		var l net.Listener
		if l, err = net.Listen("tcp", addr); err == nil {
			return l, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil, err
}

// TestSlowEndpointDoesNotDelayOthers: while a receiver holds every request until its timeout,
// another endpoint gets all of its messages, well before the slow one's first attempt ends.
func TestSlowEndpointDoesNotDelayOthers(t *testing.T) {
	t.Parallel()
	js, stream, prefix := testStream(t)
	slow, quick := newReceiver(t, answer{block: true}), newReceiver(t)
	const timeout = 5 * time.Second
	d, _ := newDispatcher(t, js, stream, allow(slow, quick), webhook.Config{Timeout: timeout})
	setEndpoints(t, d, slow.endpoint("slow"), quick.endpoint("quick"))
	start := time.Now()
	for i := range 3 {
		publish(t, js, prefix+".x", fmt.Sprintf("evt-%d", i), "", `{}`)
	}
	slow.next(t, 10*time.Second) // held now
	for i := range 3 {
		if got := quick.next(t, timeout); got.id != fmt.Sprintf("evt-%d", i) {
			t.Errorf("quick endpoint got %q, want evt-%d", got.id, i)
		}
	}
	if elapsed := time.Since(start); elapsed >= timeout {
		t.Errorf("quick endpoint's messages took %v, want less than the slow one's timeout %v", elapsed, timeout)
	}
}

// TestCloseReturnsPromptly: Close cuts an attempt short rather than wait for its timeout, and
// the message comes back to the next dispatcher of the endpoint, with the same id.
func TestCloseReturnsPromptly(t *testing.T) {
	t.Parallel()
	js, stream, prefix := testStream(t)
	r := newReceiver(t, answer{block: true}, answer{status: 200})
	d, _ := newDispatcher(t, js, stream, allow(r), webhook.Config{Timeout: time.Minute})
	setEndpoints(t, d, r.endpoint("e"))
	publish(t, js, prefix+".x", "evt-close", "", `{}`)
	r.next(t, 10*time.Second)
	start := time.Now()
	d.Close()
	if elapsed := time.Since(start); elapsed > 2*time.Second {
		t.Errorf("Close took %v with an attempt in flight, want it prompt", elapsed)
	}
	d.Close() // idempotent
	if err := d.SetEndpoints([]webhook.Endpoint{r.endpoint("e")}); !errors.Is(err, webhook.ErrClosed) {
		t.Errorf("SetEndpoints after Close = %v, want ErrClosed", err)
	}

	next, log := newDispatcher(t, js, stream, allow(r), webhook.Config{})
	setEndpoints(t, next, r.endpoint("e"))
	if got := r.next(t, 10*time.Second); got.id != "evt-close" {
		t.Errorf("after a restart the receiver got %q, want evt-close again", got.id)
	}
	eventually(t, 10*time.Second, "the delivery logged", func() bool { return slices.Equal(outcomes(log, "e"), []string{"delivered"}) })
	if e := log.Entries("e")[0]; e.N != 2 {
		t.Errorf("redelivered as attempt %d, want 2", e.N)
	}
}

// TestSetEndpointsRefuses: a set with one bad endpoint changes nothing, and its error names
// the endpoint's field.
func TestSetEndpointsRefuses(t *testing.T) {
	t.Parallel()
	js, stream, _ := testStream(t)
	r := newReceiver(t)
	d, _ := newDispatcher(t, js, stream, allow(r), webhook.Config{})
	good := r.endpoint("good")
	tests := []struct {
		name      string
		eps       []webhook.Endpoint
		wantField string
	}{
		{"loopback not allowed", []webhook.Endpoint{good, {ID: "evil", URL: "http://127.0.0.1:22/", Secret: good.Secret}}, "endpoints[1].url"},
		{"localhost not allowed", []webhook.Endpoint{{ID: "evil", URL: "http://localhost:6379/", Secret: good.Secret}}, "endpoints[0].url"},
		{"user info", []webhook.Endpoint{{ID: "evil", URL: "https://a:b@93.184.215.14/", Secret: good.Secret}}, "endpoints[0].url"},
		{"no secret", []webhook.Endpoint{{ID: "e", URL: good.URL}}, "endpoints[0].secret"},
		{"same id twice", []webhook.Endpoint{good, good}, "endpoints[1].id"},
		{"bad id", []webhook.Endpoint{{ID: "a>b", URL: good.URL, Secret: good.Secret}}, "endpoints[0].id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := fieldOf(d.SetEndpoints(tt.eps)); got != tt.wantField {
				t.Errorf("SetEndpoints = error naming %q, want %q", got, tt.wantField)
			}
		})
	}
	if _, err := js.Consumer(context.Background(), stream, webhook.ConsumerName("good")); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Errorf("a refused set started endpoint good: consumer lookup = %v", err)
	}
}

// TestSetEndpointsChanges: a changed endpoint's next message goes to its new URL; a removed
// or disabled one gets nothing until it is back, when it gets what it missed; Forget deletes
// a removed endpoint's consumer, not a current one's.
func TestSetEndpointsChanges(t *testing.T) {
	t.Parallel()
	js, stream, prefix := testStream(t)
	first := newReceiver(t)
	second := startReceiver(t, nil, first.secret)
	d, log := newDispatcher(t, js, stream, allow(first, second), webhook.Config{})
	setEndpoints(t, d, first.endpoint("e"))
	publish(t, js, prefix+".x", "evt-1", "", `{}`)
	first.next(t, 10*time.Second)

	moved := second.endpoint("e")
	setEndpoints(t, d, moved)
	publish(t, js, prefix+".x", "evt-2", "", `{}`)
	if got := second.next(t, 10*time.Second); got.id != "evt-2" {
		t.Errorf("after the URL changed, the new receiver got %q, want evt-2", got.id)
	}
	// Settled before the loop stops; else the stop cuts the attempt short, and evt-2 comes
	// again, as at-least-once allows.
	eventually(t, 10*time.Second, "evt-2 settled", func() bool { return len(log.Entries("e")) == 2 })

	disabled := moved
	disabled.Disabled = true
	for i, set := range [][]webhook.Endpoint{nil, {disabled}} {
		setEndpoints(t, d, set...)
		publish(t, js, prefix+".x", fmt.Sprintf("evt-missed-%d", i), "", `{}`)
	}
	time.Sleep(300 * time.Millisecond)
	if n := len(second.deliveries()); n != 1 {
		t.Fatalf("endpoint removed, then disabled: receiver has %d requests, want still 1", n)
	}
	setEndpoints(t, d, moved)
	for i := range 2 {
		if got := second.next(t, 10*time.Second); got.id != fmt.Sprintf("evt-missed-%d", i) {
			t.Errorf("endpoint back: got %q, want evt-missed-%d", got.id, i)
		}
	}

	if err := d.Forget(context.Background(), "e"); fieldOf(err) != "id" {
		t.Errorf("Forget a current endpoint = %v, want an error naming id", err)
	}
	setEndpoints(t, d)
	if err := d.Forget(context.Background(), "e"); err != nil {
		t.Fatalf("Forget a removed endpoint = %v", err)
	}
	if _, err := js.Consumer(context.Background(), stream, webhook.ConsumerName("e")); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Errorf("after Forget, consumer lookup = %v, want not found", err)
	}
	if err := d.Forget(context.Background(), "e"); err != nil {
		t.Errorf("Forget twice = %v, want nil", err)
	}
}

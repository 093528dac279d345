package webhook_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/internal/field"
	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
	"github.com/quotaflow/quotaflow/internal/webhook"
)

// natsSrv is the package's embedded NATS server; each test has a stream and subjects of its
// own on it.
var natsSrv *natstest.Server

func TestMain(m *testing.M) { os.Exit(natstest.Main(m, &natsSrv)) }

// fast is a retry schedule of milliseconds, so that tests see retries without waiting
// minutes.
var fast = webhook.Schedule{
	Delays: []time.Duration{50 * time.Millisecond, 100 * time.Millisecond},
	Every:  200 * time.Millisecond,
	Span:   time.Minute,
}

// streams numbers the tests' streams: -count=N runs a test N times against one server.
var streams atomic.Int64

// testStream creates a stream of the test's own and returns a JetStream client, the stream's
// name and the subject prefix it takes (<prefix>.>).
func testStream(t *testing.T) (jetstream.JetStream, string, string) {
	t.Helper()
	n := strconv.FormatInt(streams.Add(1), 10)
	name, prefix := "WEBHOOK_TEST_"+n, "webhook.test"+n
	js := natsSrv.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{prefix + ".>"}}); err != nil {
		t.Fatal(err)
	}
	return js, name, prefix
}

// publish publishes body on subject, with id as its Nats-Msg-Id and typ as its event type
// when not "".
func publish(t *testing.T, js jetstream.JetStream, subject, id, typ, body string) {
	t.Helper()
	m := nats.NewMsg(subject)
	m.Data = []byte(body)
	if id != "" {
		m.Header.Set(jetstream.MsgIDHeader, id)
	}
	if typ != "" {
		m.Header.Set(webhook.TypeHeader, typ)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
}

// answer is what a receiver answers one request.
type answer struct {
	status     int
	retryAfter string
	// body is the answer's body.
	body string
	// block makes the receiver hold the request until the client gives up on it.
	block bool
}

// delivery is one request a receiver got.
type delivery struct {
	id, timestamp, contentType, body string
	at                               time.Time
	// verify is what webhook.Verify said of it.
	verify error
}

// receiver is a real HTTP server that verifies every request's signature, as a webhook
// receiver must, and answers them from a script.
type receiver struct {
	secret  webhook.Secret
	srv     *httptest.Server
	answers []answer // the n-th request gets answers[n-1]; the last answer repeats

	mu      sync.Mutex
	got     []delivery
	arrived chan delivery
}

// newReceiver starts a receiver answering answers (200 when none); it stops with the test.
func newReceiver(t *testing.T, answers ...answer) *receiver {
	t.Helper()
	secret, err := webhook.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	return startReceiver(t, nil, secret, answers...)
}

// startReceiver is newReceiver on the listener l (a loopback port of httptest's when nil),
// verifying with secret.
func startReceiver(t *testing.T, l net.Listener, secret webhook.Secret, answers ...answer) *receiver {
	t.Helper()
	r := &receiver{secret: secret, answers: answers, arrived: make(chan delivery, 1000)}
	r.srv = httptest.NewUnstartedServer(http.HandlerFunc(r.serve))
	if l != nil {
		r.srv.Listener.Close()
		r.srv.Listener = l
	}
	r.srv.Start()
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	d := delivery{
		id: req.Header.Get(webhook.HeaderID), timestamp: req.Header.Get(webhook.HeaderTimestamp),
		contentType: req.Header.Get("Content-Type"), body: string(body), at: time.Now(),
		verify: webhook.Verify(r.secret, req.Header, body, time.Now(), 0),
	}
	r.mu.Lock()
	r.got = append(r.got, d)
	a := answer{status: http.StatusOK}
	if len(r.answers) > 0 {
		a = r.answers[min(len(r.got), len(r.answers))-1]
	}
	r.mu.Unlock()
	select {
	case r.arrived <- d:
	default: // nobody waits for this many: deliveries() still has it
	}
	if a.block {
		select {
		case <-req.Context().Done():
		case <-time.After(time.Minute):
		}
		return
	}
	if a.retryAfter != "" {
		w.Header().Set("Retry-After", a.retryAfter)
	}
	w.WriteHeader(a.status)
	io.WriteString(w, a.body)
}

// deliveries returns the requests so far.
func (r *receiver) deliveries() []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]delivery(nil), r.got...)
}

// next waits for the next request.
func (r *receiver) next(t *testing.T, within time.Duration) delivery {
	t.Helper()
	select {
	case d := <-r.arrived:
		if d.verify != nil {
			t.Errorf("receiver: request %s did not verify: %v", d.id, d.verify)
		}
		return d
	case <-time.After(within):
		t.Fatalf("receiver: no request within %v", within)
		return delivery{}
	}
}

// endpoint is an endpoint of id delivering to r.
func (r *receiver) endpoint(id string) webhook.Endpoint {
	return webhook.Endpoint{ID: id, URL: r.srv.URL + "/hooks/quotaflow", Secret: r.secret}
}

// allow is a policy that lets the receivers' loopback addresses be reached.
func allow(rs ...*receiver) webhook.URLPolicy {
	var p webhook.URLPolicy
	for _, r := range rs {
		p.AllowHosts = append(p.AllowHosts, r.srv.Listener.Addr().String())
	}
	return p
}

// eventually waits up to within for cond, failing the test with what otherwise.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// outcomes are the log's entries of endpoint as their Outcome.
func outcomes(log *webhook.MemoryLog, endpoint string) []string {
	var out []string
	for _, e := range log.Entries(endpoint) {
		out = append(out, e.Outcome())
	}
	return out
}

// fieldOf is the field a *field.Error names, or "" for another error (or nil).
func fieldOf(err error) string {
	var fe *field.Error
	if errors.As(err, &fe) {
		return fe.Field
	}
	return ""
}

// contains reports whether s contains every one of subs.
func contains(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

package webhook_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/quotaflow/quotaflow/internal/webhook"
)

// TestSendAnswers: one signed POST per Send, which the receiver verifies; its answer decides
// whether the message was delivered, is to be retried (and not before Retry-After) or failed
// for good.
func TestSendAnswers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name           string
		answer         answer
		wantRetry      bool
		wantErr        string // a substring of Attempt.Err; "" for delivered
		wantRetryAfter time.Duration
	}{
		{"200", answer{status: 200}, false, "", 0},
		{"204", answer{status: 204}, false, "", 0},
		{"400 for good", answer{status: 400}, false, "HTTP 400", 0},
		{"404 for good", answer{status: 404}, false, "HTTP 404", 0},
		{"410 for good", answer{status: 410}, false, "HTTP 410", 0},
		{"408 retried", answer{status: 408}, true, "HTTP 408", 0},
		{"409 retried", answer{status: 409}, true, "HTTP 409", 0},
		{"425 retried", answer{status: 425}, true, "HTTP 425", 0},
		{"429 with Retry-After seconds", answer{status: 429, retryAfter: "7"}, true, "HTTP 429", 7 * time.Second},
		{"503 with Retry-After date", answer{status: 503, retryAfter: time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)}, true, "HTTP 503", 90 * time.Second},
		{"503 with a huge Retry-After", answer{status: 503, retryAfter: "99999999999999"}, true, "HTTP 503", webhook.MaxRetryAfter},
		{"503 with a bad Retry-After", answer{status: 503, retryAfter: "soon"}, true, "HTTP 503", 0},
		{"500 ignores Retry-After", answer{status: 500, retryAfter: "7"}, true, "HTTP 500", 0},
		{"302 not followed, retried", answer{status: 302}, true, "HTTP 302", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := newReceiver(t, tt.answer)
			msg := webhook.Message{ID: "evt_1", Type: "balance.low", Body: []byte(`{"balance":3}`)}
			before := time.Now()
			a := webhook.NewSender(allow(r), 5*time.Second).Send(context.Background(), r.endpoint("e"), msg)
			d := r.next(t, 5*time.Second)
			if d.id != msg.ID || d.body != string(msg.Body) || d.contentType != "application/json" {
				t.Errorf("receiver got id %q, body %q, content type %q; want %q, %q, application/json", d.id, d.body, d.contentType, msg.ID, msg.Body)
			}
			if got := len(r.deliveries()); got != 1 {
				t.Errorf("receiver got %d requests, want 1 (no redirect followed)", got)
			}
			if a.Status != tt.answer.status || a.Retry != tt.wantRetry || !strings.Contains(a.Err, tt.wantErr) || (tt.wantErr == "") != a.Delivered() {
				t.Errorf("Send = status %d, retry %v, err %q; want %d, %v, %q", a.Status, a.Retry, a.Err, tt.answer.status, tt.wantRetry, tt.wantErr)
			}
			if diff := a.RetryAfter - tt.wantRetryAfter; diff < -5*time.Second || diff > 0 { // an HTTP date has whole seconds, set when the table was
				t.Errorf("Send RetryAfter = %v, want %v", a.RetryAfter, tt.wantRetryAfter)
			}
			if a.At.Before(before) || a.Duration <= 0 || a.N != 0 {
				t.Errorf("Send = at %v, duration %v, n %d; want after %v, positive, 0", a.At, a.Duration, a.N, before)
			}
		})
	}
}

// TestSendErrBody: a failure keeps the start of the answer's body, quoted, for the delivery
// log; not all of it.
func TestSendErrBody(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 10000)
	srv := newReceiver(t, answer{status: http.StatusBadRequest, body: "bad balance field\n" + long})
	a := webhook.NewSender(allow(srv), time.Second).Send(context.Background(), srv.endpoint("e"), webhook.Message{ID: "m", Body: []byte("{}")})
	if !strings.HasPrefix(a.Err, `HTTP 400: "bad balance field\nxxx`) || len(a.Err) > 300 {
		t.Errorf("Send err = %.80q… (%d bytes), want HTTP 400 and the body's start, quoted, at most 300 bytes", a.Err, len(a.Err))
	}
}

// TestSendTimeout: a receiver that does not answer within the timeout fails the attempt at
// the timeout, to be retried.
func TestSendTimeout(t *testing.T) {
	t.Parallel()
	r := newReceiver(t, answer{block: true})
	start := time.Now()
	a := webhook.NewSender(allow(r), 300*time.Millisecond).Send(context.Background(), r.endpoint("e"), webhook.Message{ID: "m", Body: []byte("{}")})
	if elapsed := time.Since(start); elapsed > 3*time.Second || !a.Retry || a.Status != 0 || !strings.Contains(a.Err, "no answer within 300ms") {
		t.Errorf("Send to a silent receiver = %+v after %v; want no answer within 300ms, retried, about then", a, elapsed)
	}
}

// TestSendBadID: an id that cannot be a header value is not sent.
func TestSendBadID(t *testing.T) {
	t.Parallel()
	r := newReceiver(t)
	for _, id := range []string{"", "a b", "a\r\nX-Injected: 1", "é"} {
		a := webhook.NewSender(allow(r), time.Second).Send(context.Background(), r.endpoint("e"), webhook.Message{ID: id, Body: []byte("{}")})
		if a.Retry || !strings.Contains(a.Err, "message id") {
			t.Errorf("Send with id %q = %+v, want a failure for good naming the message id", id, a)
		}
	}
	if n := len(r.deliveries()); n != 0 {
		t.Errorf("receiver got %d requests, want 0", n)
	}
}

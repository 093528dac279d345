package webhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Message is one event to deliver.
type Message struct {
	// ID is the webhook-id: the same on every attempt of the message, to every endpoint, so
	// that a receiver drops the copies at-least-once delivery brings. Printable ASCII without
	// spaces.
	ID string
	// Type is the event's type, which endpoints' filters select.
	Type string
	// At is when the event was published. It is not the signed webhook-timestamp, which is
	// each attempt's own time: receivers refuse timestamps older than minutes, and a retry
	// comes hours later.
	At time.Time
	// Body is the request's body, JSON, sent as it is.
	Body []byte
}

// Attempt is the outcome of one delivery attempt, as the delivery log keeps it.
type Attempt struct {
	// At is when the attempt started; Duration how long it took.
	At       time.Time
	Duration time.Duration
	// N is the attempt's number, 1 for the first (set by the Dispatcher, from JetStream's
	// count of the message's deliveries; 0 from Send).
	N int
	// Status is the receiver's HTTP status, 0 when there was no answer.
	Status int
	// Err says why the attempt failed ("" when delivered): the status and the start of the
	// answer's body, or the network error.
	Err string
	// Retry is set when the failure may mend (no answer, a timeout, 3xx, 408, 409, 425, 429,
	// 5xx), so that the message is tried again; a failure without it is for good (the other
	// 4xx: the receiver refuses this message, and will again).
	Retry bool
	// RetryAfter is the receiver's Retry-After on a 429 or 503, at most MaxRetryAfter: the
	// least wait before the next attempt.
	RetryAfter time.Duration
	// Next is the wait before the next attempt, set by the Dispatcher: 0 when there is none.
	Next time.Duration
	// GaveUp is set by the Dispatcher on a failure that may mend but whose retry schedule is
	// over: there is no next attempt.
	GaveUp bool
}

// Delivered reports whether the receiver took the message (a 2xx answer).
func (a Attempt) Delivered() bool { return a.Err == "" }

// Outcome is the attempt in a word, for logs: "delivered", "retry" (another attempt follows),
// "gave up" (none does, though it might have mended) or "failed" (for good).
func (a Attempt) Outcome() string {
	switch {
	case a.Delivered():
		return "delivered"
	case a.GaveUp:
		return "gave up"
	case a.Retry:
		return "retry"
	}
	return "failed"
}

const (
	// DefaultTimeout bounds one attempt, from dial to the answer's body: a receiver that
	// takes longer is slow, and the attempt is retried rather than waited for.
	DefaultTimeout = 10 * time.Second
	// MaxRetryAfter caps a receiver's Retry-After, so that an answer cannot hold a message
	// back past its retry schedule's day.
	MaxRetryAfter = time.Hour
	// maxAnswerBytes is how much of an answer's body is read (and discarded): enough for a
	// connection to be reused after a short body, and a bound on a receiver that sends more.
	maxAnswerBytes = 64 << 10
	// maxErrBody is how much of a failed answer's body Attempt.Err keeps: the start of an
	// error page says what went wrong; the rest would bloat the delivery log.
	maxErrBody = 200
	// userAgent names the sender to receivers' logs and firewalls.
	userAgent = "quotaflow-webhook/1"
)

// Sender makes delivery attempts: one signed POST each, under a URL policy and a timeout.
// It is safe for concurrent use.
type Sender struct {
	client  *http.Client
	timeout time.Duration
}

// NewSender returns a Sender whose connections obey policy (URLPolicy.Client) and whose
// attempts last at most timeout (DefaultTimeout when 0).
func NewSender(policy URLPolicy, timeout time.Duration) *Sender {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	return &Sender{client: policy.Client(), timeout: timeout}
}

// Send POSTs msg to ep once: Content-Type application/json, the webhook-id, webhook-timestamp
// (now) and webhook-signature headers, within the Sender's timeout or until ctx ends. It does
// not validate ep: that is for whoever registered it, and the Sender's connections refuse the
// addresses the policy refuses anyway.
func (s *Sender) Send(ctx context.Context, ep Endpoint, msg Message) Attempt {
	at := time.Now()
	a := s.post(ctx, ep, msg, at)
	a.At, a.Duration = at, time.Since(at)
	return a
}

// post is Send's request and its answer.
func (s *Sender) post(ctx context.Context, ep Endpoint, msg Message, at time.Time) Attempt {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	req, err := request(ctx, ep, msg, at)
	if err != nil {
		return Attempt{Err: err.Error()}
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return Attempt{Err: s.describe(ctx, err), Retry: true}
	}
	defer resp.Body.Close()
	return answer(resp, time.Now())
}

// request is the signed POST of msg to ep at the time at.
func request(ctx context.Context, ep Endpoint, msg Message, at time.Time) (*http.Request, error) {
	if msg.ID == "" || !token(msg.ID) {
		return nil, fmt.Errorf("message id %q: want printable ASCII without spaces", msg.ID)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ep.URL, bytes.NewReader(msg.Body))
	if err != nil {
		return nil, fmt.Errorf("endpoint url: %w", unwrapURL(err))
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", userAgent)
	req.Header.Set(HeaderID, msg.ID)
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(at.Unix(), 10))
	req.Header.Set(HeaderSignature, Sign(ep.Secret, msg.ID, at, msg.Body))
	return req, nil
}

// describe is err of a request that got no answer, without the URL that url.Error repeats
// (an endpoint's URL may hold a token in its query).
func (s *Sender) describe(ctx context.Context, err error) string {
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
		return fmt.Sprintf("no answer within %v", s.timeout)
	}
	return unwrapURL(err).Error()
}

// unwrapURL is the error a url.Error wraps, or err.
func unwrapURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// answer is the attempt that got resp, read at now.
func answer(resp *http.Response, now time.Time) Attempt {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	a := Attempt{Status: resp.StatusCode}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return a
	}
	a.Err = "HTTP " + strconv.Itoa(resp.StatusCode)
	if snippet := strings.TrimSpace(strings.ToValidUTF8(string(body[:min(len(body), maxErrBody)]), "")); snippet != "" {
		a.Err += fmt.Sprintf(": %q", snippet)
	}
	a.Retry = retryable(resp.StatusCode)
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		a.RetryAfter = retryAfter(resp.Header.Get("Retry-After"), now)
	}
	return a
}

// retryable reports whether a non-2xx status may mend. A 4xx is the receiver refusing this
// request, for good, except 408 (it timed out), 409 (a conflict of the moment), 425 (too
// early) and 429 (too many). A 3xx is retried: a moved receiver is fixed by updating the
// endpoint's URL, which the next attempt uses.
func retryable(status int) bool {
	if status >= 400 && status < 500 {
		switch status {
		case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
			return true
		}
		return false
	}
	return true
}

// retryAfter is a Retry-After value (seconds, or an HTTP date) as a wait from now, within
// [0, MaxRetryAfter]; 0 when v is neither.
func retryAfter(v string, now time.Time) time.Duration {
	var d time.Duration
	if secs, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
		d = time.Duration(min(max(secs, 0), int64(MaxRetryAfter/time.Second))) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	}
	return min(max(d, 0), MaxRetryAfter)
}

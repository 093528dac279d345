package webhook

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/quotaflow/quotaflow/internal/field"
)

// Endpoint is a receiver of webhooks: where they go, how they are signed and which events it
// takes. Its fields come from whoever registers it: Validate before trusting them.
type Endpoint struct {
	// ID names the endpoint for good: its JetStream consumer is ConsumerName(ID), which keeps
	// its place in the stream and its pending retries across restarts. 1 to 64 letters,
	// digits, '-' and '_'.
	ID string `json:"id"`
	// URL is the http or https URL the events are POSTed to, under the URLPolicy.
	URL string `json:"url"`
	// Secret signs every request (see Sign).
	Secret Secret `json:"secret"`
	// Filter are the event types the endpoint takes (Message.Type), all when empty.
	Filter []string `json:"filter,omitempty"`
	// Disabled pauses deliveries: the endpoint's consumer stays and its events wait in it,
	// to be delivered once it is enabled again, unless the stream dropped them by then.
	Disabled bool `json:"disabled,omitempty"`
	// Since, when set, is when the endpoint was registered: its consumer, when a Dispatcher
	// creates it, starts there rather than at SetEndpoints, so that the events published
	// between the registration and a dispatcher's learning of it (a store watched from
	// another process) reach it too. Zero: from SetEndpoints on.
	Since time.Time `json:"since,omitzero"`
}

// Limits of an endpoint's fields.
const (
	// MaxIDBytes bounds an id, which names a JetStream consumer.
	MaxIDBytes = 64
	// MaxFilter bounds the number of event types of a filter, MaxTypeBytes each one's length:
	// enough for any real endpoint, and a bound on what one registration costs.
	MaxFilter    = 64
	MaxTypeBytes = 128
)

// ConsumerName is the durable JetStream consumer of the endpoint id: "webhook-<id>". Each
// endpoint has its own, so that one's backlog and retries hold up no other.
func ConsumerName(id string) string { return "webhook-" + id }

// Validate reports the first field of e that is not acceptable under policy, as a *field.Error
// naming "id", "url", "secret" or "filter[i]". A URL's host name is resolved, and refused when
// it resolves to an address the policy refuses (Client checks again at each connection).
func (e Endpoint) Validate(policy URLPolicy) error { return e.validate(policy, true) }

// validate is Validate, resolving the URL's host name only with resolve: a dispatcher
// re-checking its endpoints at start must not fail with DNS, and its Client checks at dial.
func (e Endpoint) validate(policy URLPolicy, resolve bool) error {
	if err := checkID(e.ID); err != nil {
		return field.Wrap("id", err)
	}
	if err := policy.checkURL(e.URL, resolve); err != nil {
		return field.Wrap("url", err)
	}
	if e.Secret.IsZero() {
		return field.Errorf("secret", "required")
	}
	if len(e.Filter) > MaxFilter {
		return field.Errorf("filter", "must hold at most %d event types, got %d", MaxFilter, len(e.Filter))
	}
	for i, t := range e.Filter {
		if err := checkType(t); err != nil {
			return field.Wrap(fmt.Sprintf("filter[%d]", i), err)
		}
		if j := slices.Index(e.Filter[:i], t); j >= 0 {
			return field.Errorf(fmt.Sprintf("filter[%d]", i), "%q repeats filter[%d]", t, j)
		}
	}
	return nil
}

// checkID reports why id cannot name an endpoint's consumer, or nil.
// CheckID reports whether the endpoint's ID is one (1 to MaxIDBytes letters, digits, '-' and
// '_'): what a reader of its delivery log checks before naming it in a query.
func (e Endpoint) CheckID() error { return checkID(e.ID) }

func checkID(id string) error {
	switch {
	case id == "":
		return errors.New("required")
	case len(id) > MaxIDBytes:
		return fmt.Errorf("must be at most %d bytes, got %d", MaxIDBytes, len(id))
	case strings.TrimLeft(id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") != "":
		return fmt.Errorf("%q: want letters, digits, '-' and '_'", id)
	}
	return nil
}

// checkType reports why t is no event type, or nil: 1 to MaxTypeBytes printable ASCII
// characters without spaces, as the types of the events are.
func checkType(t string) error {
	if t == "" {
		return errors.New("required")
	}
	if len(t) > MaxTypeBytes {
		return fmt.Errorf("must be at most %d bytes, got %d", MaxTypeBytes, len(t))
	}
	if !token(t) {
		return fmt.Errorf("%q: want printable ASCII without spaces", t)
	}
	return nil
}

// token reports whether s is printable ASCII without spaces: fit for an HTTP header value
// and a log line as it is.
func token(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// wants reports whether the endpoint takes events of type t.
func (e Endpoint) wants(t string) bool {
	return len(e.Filter) == 0 || slices.Contains(e.Filter, t)
}

// within prefixes the field a *field.Error names with where ("endpoints[2]" makes
// "endpoints[2].url"); other errors are returned as they are.
func within(where string, err error) error {
	var fe *field.Error
	if !errors.As(err, &fe) {
		return err
	}
	return &field.Error{Field: where + "." + fe.Field, Msg: fe.Msg, Err: fe.Err}
}

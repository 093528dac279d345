// Package field holds the rules a check's fields obey, each written once: the engine applies
// them to every Query (package checker), and the transports apply them first, on what they
// translate, so that an error names the field in the caller's own terms (a header, a
// descriptor entry, a message field). Errors say what the value broke and name no field: the
// caller wraps them in a checker.FieldError with the field's name.
package field

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/quotaflow/quotaflow/internal/urlpath"
)

var errRequired = errors.New("required")

// Text reports why s is not 1 to max bytes of valid UTF-8, or nil.
func Text(s string, max int) error {
	switch {
	case s == "":
		return errRequired
	case len(s) > max:
		return fmt.Errorf("must be at most %d bytes, got %d", max, len(s))
	case !utf8.ValidString(s):
		return errors.New("must be valid UTF-8")
	}
	return nil
}

// Endpoint validates an endpoint and returns its normal form (urlpath.Normalize): the path
// without its query, 1 to max bytes of UTF-8, with every spelling of one path (case, escapes,
// dot and empty segments, a trailing slash, ";" parameters) made one, so that none reaches
// another bucket than the path's own. An error says what the path broke (not absolute, an
// encoded slash, a backslash, a control character, a bad escape, ".." above the root) and
// wraps urlpath's reason. A path already normal is returned without allocating: the engine
// calls it again on every query.
func Endpoint(ep string, max int) (string, error) {
	ep = urlpath.Path(ep)
	if err := Text(ep, max); err != nil {
		return "", err
	}
	norm, err := urlpath.Normalize(ep)
	if err != nil {
		return "", fmt.Errorf("%q %w", ep, err)
	}
	return norm, nil
}

// Cost validates a cost of at most max units and returns it, 0 meaning 1.
func Cost(cost, max int64) (int64, error) {
	switch {
	case cost == 0:
		return 1, nil
	case cost < 0:
		return 0, fmt.Errorf("must not be negative, got %d", cost)
	case cost > max:
		return 0, fmt.Errorf("must be at most %d, got %d", max, cost)
	}
	return cost, nil
}

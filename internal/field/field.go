// Package field holds the rules a check's fields obey, each written once: the engine applies
// them to every Query (package checker), and the transports apply them first, on what they
// translate, so that an error names the field in the caller's own terms (a header, a
// descriptor entry, a message field). Its rules' errors say what the value broke and name no
// field: the caller wraps them in an Error with the field's name (Wrap). Error is the one error
// of bad input in quotaflow, wherever a value is named: a check's fields, a rules document's, an
// override's, an admin request's; transports answer it InvalidArgument (HTTP 400).
package field

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/quotaflow/quotaflow/internal/urlpath"
)

var errRequired = errors.New("required")

// Error is a value that broke a rule, naming its field as the caller spells it (a message
// field, subjects[1].identifier; a header; a query parameter; an override's key). Transports
// answer it InvalidArgument (HTTP 400, or the status of Err where it has one).
type Error struct {
	Field string
	Msg   string
	// Err, when set, is the sentinel of the rule broken (checker.ErrIdempotencyConflict), for
	// errors.Is; it is not part of the message, which Field and Msg say in full.
	Err error
}

// Error implements error: "field: what it broke".
func (e *Error) Error() string { return e.Field + ": " + e.Msg }

// Unwrap returns Err.
func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an Error about name.
func Errorf(name, format string, args ...any) *Error {
	return &Error{Field: name, Msg: fmt.Sprintf(format, args...)}
}

// Wrap is err, a broken rule of this package (or one that wraps a sentinel), about name: its
// message, and the sentinel it wraps for errors.Is.
func Wrap(name string, err error) *Error {
	return &Error{Field: name, Msg: err.Error(), Err: errors.Unwrap(err)}
}

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

package field

import (
	"errors"
	"strings"
	"testing"

	"github.com/quotaflow/quotaflow/internal/urlpath"
)

func TestText(t *testing.T) {
	t.Parallel()
	tests := []struct{ s, want string }{
		{"alice", ""},
		{"", "required"},
		{strings.Repeat("a", 9), "must be at most 8 bytes, got 9"},
		{"a\xff", "must be valid UTF-8"},
	}
	for _, tt := range tests {
		err := Text(tt.s, 8)
		if got := errString(err); got != tt.want {
			t.Errorf("Text(%q, 8) = %q, want %q", tt.s, got, tt.want)
		}
	}
}

func TestEndpoint(t *testing.T) {
	t.Parallel()
	tests := []struct{ ep, want, err string }{
		{"/API/v1//orders/?x=1", "/api/v1/orders", ""},
		{"", "", "required"},
		{"/" + strings.Repeat("a", 16), "", "must be at most 16 bytes, got 17"},
		{"orders", "", `"orders" must be an absolute path, starting with "/"`},
	}
	for _, tt := range tests {
		got, err := Endpoint(tt.ep, 16)
		if got != tt.want || errString(err) != tt.err {
			t.Errorf("Endpoint(%q) = %q, %q; want %q, %q", tt.ep, got, errString(err), tt.want, tt.err)
		}
	}
	// A refused path wraps urlpath's reason, which FieldError.Err carries for errors.Is.
	if _, err := Endpoint("/a/%2F", 16); errors.Unwrap(err) == nil || !errors.Is(err, urlpathErr("/a/%2F")) {
		t.Errorf("Endpoint(/a/%%2F) = %v, want an error wrapping urlpath's reason", err)
	}
}

func urlpathErr(p string) error {
	_, err := urlpath.Normalize(p)
	return err
}

func TestCost(t *testing.T) {
	t.Parallel()
	tests := []struct {
		cost, want int64
		err        string
	}{
		{0, 1, ""}, {1, 1, ""}, {10, 10, ""},
		{-1, 0, "must not be negative, got -1"},
		{11, 0, "must be at most 10, got 11"},
	}
	for _, tt := range tests {
		got, err := Cost(tt.cost, 10)
		if got != tt.want || errString(err) != tt.err {
			t.Errorf("Cost(%d, 10) = %d, %q; want %d, %q", tt.cost, got, errString(err), tt.want, tt.err)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

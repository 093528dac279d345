package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strings"
	"unicode"

	"github.com/quotaflow/quotaflow/internal/field"
)

// UsageError is a command line that could not be understood: exit status 2.
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// Usage makes err, when not nil, a UsageError.
func Usage(err error) error {
	if err == nil {
		return nil
	}
	return UsageError{err}
}

// Usagef is a UsageError of a formatted message.
func Usagef(format string, args ...any) error { return UsageError{fmt.Errorf(format, args...)} }

// Status is an error that is a command's answer rather than its failure, so that scripts can
// branch on it: a denied check (3), an unhealthy status (4). Shown says the command has told
// the user already, on standard output.
type Status struct {
	Code  int
	Err   error
	Shown bool
}

func (e Status) Error() string { return e.Err.Error() }
func (e Status) Unwrap() error { return e.Err }

// ExitCode is the process's exit status for a command's error, which it prints to stderr
// unless the command has shown it: 0 for none (or --help), a Status's code, 2 for a
// UsageError, 1 for any other.
func ExitCode(err error, stderr io.Writer) int {
	var st Status
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &st) && st.Shown:
		return st.Code
	}
	fmt.Fprintln(stderr, program+":", err)
	if errors.As(err, &st) {
		return st.Code
	}
	if errors.As(err, new(UsageError)) {
		return 2
	}
	return 1
}

// FlagError makes err, when it is a Config's *field.Error, a UsageError naming the flag of
// its field: packages name a Config's fields, only cmd knows their flags. flags spells the
// flag of each field (a path within the Config: Publisher.Partitions) whose flag is not its
// last name in kebab case (Rate: --rate, SharedHashes: --shared-hashes), and of each field
// that a message names (want more than InsertTimeout): the message names its flag instead.
func FlagError(err error, flags map[string]string) error {
	var fe *field.Error
	if !errors.As(err, &fe) {
		return err
	}
	parent := fe.Field[:strings.LastIndex(fe.Field, ".")+1]
	msg := fe.Msg
	for name, flag := range flags {
		word, sibling := strings.CutPrefix(name, parent)
		if name == fe.Field {
			continue // a message naming its own field speaks of the value (want a URL)
		}
		if !sibling && strings.Contains(name, ".") || strings.Contains(word, ".") {
			continue // neither a sibling of the field nor a field of the whole Config
		}
		msg = regexp.MustCompile(`\b`+word+`\b`).ReplaceAllLiteralString(msg, "--"+flag)
	}
	name, ok := flags[fe.Field]
	if !ok {
		name = kebab(fe.Field[len(parent):])
	}
	return Usagef("--%s: %s", name, msg)
}

// kebab spells a field's name as a flag's: InstanceID as instance-id.
func kebab(name string) string {
	r := []rune(name)
	var b strings.Builder
	for i, c := range r {
		lower := unicode.ToLower(c)
		if i > 0 && c != lower && (unicode.IsLower(r[i-1]) || i+1 < len(r) && unicode.IsLower(r[i+1])) {
			b.WriteByte('-')
		}
		b.WriteRune(lower)
	}
	return b.String()
}

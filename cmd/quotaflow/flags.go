package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strings"
	"unicode"

	"github.com/quotaflow/quotaflow/internal/field"
	"github.com/quotaflow/quotaflow/internal/suggest"
)

// flagSet is a flag.FlagSet whose flags may also come from environment variables.
type flagSet struct {
	*flag.FlagSet
	env       map[string]string // flag name → environment variable
	after     []func() error    // checks of the parsed values, run by parse
	synopsis  string
	usageLine string    // the command's words before [flags], when not its name
	help      io.Writer // where --help prints
}

func newFlagSet(name, synopsis string, stderr io.Writer) *flagSet {
	fs := &flagSet{FlagSet: flag.NewFlagSet(name, flag.ContinueOnError), env: map[string]string{},
		synopsis: synopsis, help: stderr}
	// The flag package prints a bad flag's error and then the whole help, and the error comes
	// back to be printed again: parse prints the help for --help only, and the error once.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// printHelp prints the command's synopsis and flags.
func (fs *flagSet) printHelp() {
	fs.SetOutput(fs.help)
	defer fs.SetOutput(io.Discard)
	line := fs.usageLine
	if line == "" {
		line = fs.Name()
	}
	fmt.Fprintf(fs.help, "Usage: quotaflow %s [flags]\n\n%s\n\nFlags:\n", line, fs.synopsis)
	fs.PrintDefaults()
}

// describe replaces flag name's help, for a command where it means something else than where it
// was registered; the environment variable fromEnv named stays named.
func (fs *flagSet) describe(name, usage string) {
	f := fs.Lookup(name)
	f.Usage = usage
	if variable, ok := fs.env[name]; ok {
		f.Usage += " (env " + variable + ")"
	}
}

// fromEnv lets the environment set each named flag, from QUOTAFLOW_ and the flag's name in
// capitals with '-' as '_' (--redis-url: QUOTAFLOW_REDIS_URL), and says so in its help.
func (fs *flagSet) fromEnv(names ...string) {
	for _, name := range names {
		fs.fromEnvAs(name, "QUOTAFLOW_"+strings.ToUpper(strings.ReplaceAll(name, "-", "_")))
	}
}

// fromEnvAs lets the environment variable set flag name, and says so in its help.
func (fs *flagSet) fromEnvAs(name, variable string) {
	f := fs.Lookup(name)
	f.Usage += " (env " + variable + ")"
	fs.env[name] = variable
}

// parse parses args, then fills every flag not given on the command line from its environment
// variable. Bad values name the variable they came from.
func (fs *flagSet) parse(args []string, getenv func(string) string) error {
	if err := fs.parseFlags(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("%s: unexpected argument %q", fs.Name(), fs.Arg(0))}
	}
	return fs.fillEnv(getenv)
}

// check adds a check of the parsed values that parse runs; its error is a usage error.
func (fs *flagSet) check(f func() error) { fs.after = append(fs.after, f) }

// parseArgs is parse for commands that take n arguments (n < 0: one or more), which may come
// before, between or after the flags (quotaflow rules get ID --json).
func (fs *flagSet) parseArgs(args []string, getenv func(string) string, n int, names string) ([]string, error) {
	var pos []string
	for {
		if err := fs.parseFlags(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if n >= 0 && len(pos) != n || n < 0 && len(pos) == 0 {
		return nil, usageError{fmt.Errorf("%s: want %s, got %d argument(s)", fs.Name(), names, len(pos))}
	}
	return pos, fs.fillEnv(getenv)
}

// parseFlags is fs.Parse that prints the help on --help and makes any other error a usage
// error naming the command, with the flag meant when one was mistyped.
func (fs *flagSet) parseFlags(args []string) error {
	err := fs.Parse(args)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		fs.printHelp()
		return err
	}
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		if meant, ok := suggest.Closest(strings.TrimPrefix(name, "-"), names); ok {
			msg += fmt.Sprintf(" (did you mean --%s?)", meant)
		}
	}
	return usageError{fmt.Errorf("%s: %s\nrun 'quotaflow %s --help' for its flags", fs.Name(), msg, fs.Name())}
}

func (fs *flagSet) fillEnv(getenv func(string) string) error {
	if err := fs.setFromEnv(getenv); err != nil {
		return err
	}
	for _, f := range fs.after {
		if err := f(); err != nil {
			return usageError{err}
		}
	}
	return nil
}

func (fs *flagSet) setFromEnv(getenv func(string) string) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for name, variable := range fs.env {
		if v := getenv(variable); v != "" && !set[name] {
			if err := fs.Set(name, strings.TrimSpace(v)); err != nil {
				return usageError{fmt.Errorf("%s=%q: invalid value for --%s: %w", variable, v, name, err)}
			}
		}
	}
	return nil
}

// isSet reports whether flag name was given, on the command line or by its variable.
func (fs *flagSet) isSet(name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// fieldFlagErr makes err, when it is a Config's *field.Error, a usage error naming the flag of
// its field: packages name a Config's fields, only cmd knows their flags. flags spells the
// flag of each field (a path within the Config: Publisher.Partitions) whose flag is not its
// last name in kebab case (Rate: --rate, SharedHashes: --shared-hashes), and of each field
// that a message names (want more than InsertTimeout): the message names its flag instead.
func fieldFlagErr(err error, flags map[string]string) error {
	var fe *field.Error
	if !errors.As(err, &fe) {
		return err
	}
	parent := fe.Field[:strings.LastIndex(fe.Field, ".")+1]
	msg := fe.Msg
	for name, flag := range flags {
		word, sibling := strings.CutPrefix(name, parent)
		if !sibling && strings.Contains(name, ".") || strings.Contains(word, ".") {
			continue // neither a sibling of the field nor a field of the whole Config
		}
		msg = regexp.MustCompile(`\b`+word+`\b`).ReplaceAllLiteralString(msg, "--"+flag)
	}
	name, ok := flags[fe.Field]
	if !ok {
		name = kebab(fe.Field[len(parent):])
	}
	return usageError{fmt.Errorf("--%s: %s", name, msg)}
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

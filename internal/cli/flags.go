package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// FlagSet is a flag.FlagSet whose flags may also come from environment variables, whose
// errors are UsageErrors naming the command (and the flag meant, when one was mistyped), and
// whose --help prints the command's synopsis before its flags.
type FlagSet struct {
	*flag.FlagSet
	// UsageLine is the command's words before [flags] in its help, when not its name.
	UsageLine string
	env       map[string]string // flag name → environment variable
	after     []func() error    // checks of the parsed values, run by Parse
	synopsis  string
	help      io.Writer // where --help prints
}

// NewFlagSet returns the flags of the command name (its words: "rules apply"), whose --help
// prints synopsis and the flags to help.
func NewFlagSet(name, synopsis string, help io.Writer) *FlagSet {
	fs := &FlagSet{FlagSet: flag.NewFlagSet(name, flag.ContinueOnError), env: map[string]string{},
		synopsis: synopsis, help: help}
	// The flag package prints a bad flag's error and then the whole help, and the error comes
	// back to be printed again: Parse prints the help for --help only, and the error once.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// printHelp prints the command's synopsis and flags.
func (fs *FlagSet) printHelp() {
	defer fs.SetOutput(io.Discard)
	line := fs.UsageLine
	if line == "" {
		line = fs.Name()
	}
	fmt.Fprintf(fs.help, "Usage: %s %s [flags]\n\n%s\n\nFlags:\n", program, line, fs.synopsis)
	var flags strings.Builder
	fs.SetOutput(&flags)
	fs.PrintDefaults()
	// Spelled --name, as the errors and the docs spell flags (the flag package takes both).
	io.WriteString(fs.help, helpFlagName.ReplaceAllString(flags.String(), "$1--"))
}

// helpFlagName is where PrintDefaults writes a flag's name, -name.
var helpFlagName = regexp.MustCompile(`(?m)^(  )-`)

// Describe replaces flag name's help, for a command where it means something else than where
// it was registered; the environment variable FromEnv named stays named.
func (fs *FlagSet) Describe(name, usage string) {
	f := fs.Lookup(name)
	f.Usage = usage
	if variable, ok := fs.env[name]; ok {
		f.Usage += " (env " + variable + ")"
	}
}

// FromEnv lets the environment set each named flag, from QUOTAFLOW_ and the flag's name in
// capitals with '-' as '_' (--redis-url: QUOTAFLOW_REDIS_URL), and says so in its help.
func (fs *FlagSet) FromEnv(names ...string) {
	for _, name := range names {
		fs.FromEnvAs(name, "QUOTAFLOW_"+strings.ToUpper(strings.ReplaceAll(name, "-", "_")))
	}
}

// FromEnvAs lets the environment variable set flag name, and says so in its help.
func (fs *FlagSet) FromEnvAs(name, variable string) {
	f := fs.Lookup(name)
	f.Usage += " (env " + variable + ")"
	fs.env[name] = variable
}

// Check adds a check of the parsed values that Parse runs; its error is a UsageError.
func (fs *FlagSet) Check(f func() error) { fs.after = append(fs.after, f) }

// Parse parses args, which must be flags only, then fills every flag not given on the command
// line from its environment variable (a bad value names the variable) and runs the Checks.
// --help prints the help and returns flag.ErrHelp.
func (fs *FlagSet) Parse(args []string, getenv func(string) string) error {
	if err := fs.parseFlags(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return Usagef("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
	}
	return fs.fillEnv(getenv)
}

// ParseArgs is Parse for commands that take n arguments (n < 0: one or more), which may come
// before, between or after the flags (quotaflow rules get ID --json); names says what they
// are, for the error of a wrong count.
func (fs *FlagSet) ParseArgs(args []string, getenv func(string) string, n int, names string) ([]string, error) {
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
		return nil, Usagef("%s: want %s, got %d argument(s)", fs.Name(), names, len(pos))
	}
	return pos, fs.fillEnv(getenv)
}

// parseFlags is fs.FlagSet.Parse that prints the help on --help and makes any other error a
// usage error naming the command, with the flag meant when one was mistyped.
func (fs *FlagSet) parseFlags(args []string) error {
	err := fs.FlagSet.Parse(args)
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
		name = strings.TrimPrefix(name, "-")
		msg = "unknown flag --" + name + didYouMean(name, names, "--")
	} else if loc := goFlagName.FindStringSubmatchIndex(msg); loc != nil {
		msg = msg[:loc[2]] + "-" + msg[loc[2]:] // -name as --name, as the help spells it
	}
	return Usagef("%s: %s\nrun '%s %s --help' for its flags", fs.Name(), msg, program, fs.Name())
}

// goFlagName finds the flag's name, -name, in the flag package's errors.
var goFlagName = regexp.MustCompile(`(?:for (?:flag )?|argument: )(-)[^-]`)

func (fs *FlagSet) fillEnv(getenv func(string) string) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for name, variable := range fs.env {
		if v := getenv(variable); v != "" && !set[name] {
			if err := fs.Set(name, strings.TrimSpace(v)); err != nil {
				return Usagef("%s=%q: invalid value for --%s: %w", variable, v, name, err)
			}
		}
	}
	for _, f := range fs.after {
		if err := f(); err != nil {
			return Usage(err)
		}
	}
	return nil
}

// IsSet reports whether flag name was given, on the command line or by its variable.
func (fs *FlagSet) IsSet(name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// Variable is the environment variable that sets flag name, or "".
func (fs *FlagSet) Variable(name string) string { return fs.env[name] }

// Variables are the environment variables that set flags, sorted.
func (fs *FlagSet) Variables() []string { return slices.Sorted(maps.Values(fs.env)) }

// ListVar defines a flag of comma-separated values (host:port,host:port) stored in p, each
// trimmed of spaces, the empty ones dropped.
func (fs *FlagSet) ListVar(p *[]string, name, usage string) { fs.Var((*list)(p), name, usage) }

// list is a ListVar's flag.Value.
type list []string

func (l *list) String() string {
	if l == nil {
		return "" // the flag package asks a zero value for its default
	}
	return strings.Join(*l, ",")
}

func (l *list) Set(s string) error {
	*l = nil
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			*l = append(*l, v)
		}
	}
	return nil
}

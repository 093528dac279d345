// Package cli is the grammar of quotaflow's command line: commands and the verbs of command
// groups, flags that the environment may also set, and the errors that become exit statuses.
// cmd/quotaflow declares the commands and their flags and is the only caller: it hands this
// package the process's arguments and environment, so that no other package reads them.
package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"

	"github.com/quotaflow/quotaflow/internal/suggest"
)

// program is the binary's name, as help and errors spell the commands to run.
const program = "quotaflow"

// Func runs a command, or a verb of a Group, with its arguments, the environment's lookup and
// the process's output.
type Func func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error

// Command is one command of a Program.
type Command struct {
	Name    string
	Summary string // one line, in the command table of the top-level help
	Run     Func
}

// Program is the binary's commands and its top-level help.
type Program struct {
	// Usage is the top-level help; the line {{commands}} in it is replaced by the command table.
	Usage    string
	Commands []Command
	// Version, when set, is what the command "version" (which the Program then has, last) and
	// the flag --version print.
	Version string
}

// commands are p's Commands and its version command.
func (p Program) commands() []Command {
	if p.Version == "" {
		return p.Commands
	}
	return append(slices.Clip(p.Commands), Command{Name: "version", Summary: "print " + program + "'s version (also " + program + " --version)", Run: p.printVersion})
}

func (p Program) printVersion(_ context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := NewFlagSet("version", "Prints the version of "+program+"'s module, the VCS revision it was built from when known, and the Go version.", stderr)
	if err := fs.Parse(args, getenv); err != nil {
		return err
	}
	_, err := fmt.Fprintln(stdout, p.Version)
	return err
}

// isHelp reports whether arg asks for help rather than naming a command.
func isHelp(arg string) bool {
	return arg == "help" || arg == "-h" || arg == "--help" || arg == "-help"
}

// Run runs the command args name. No command prints the help and is a UsageError; "help" and
// --help print it; "help CMD" is "CMD --help"; --version is the command "version". An unknown
// command is a UsageError naming the nearest command.
func (p Program) Run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 0 && (args[0] == "--version" || args[0] == "-version") {
		args = append([]string{"version"}, args[1:]...)
	}
	if len(args) == 0 || isHelp(args[0]) {
		// help <command> is <command> --help; help help (or help --help) is this help, not
		// a question asked again of Run.
		if len(args) > 1 && !isHelp(args[1]) {
			return p.Run(ctx, []string{args[1], "--help"}, getenv, stdout, stderr)
		}
		p.usage(stdout)
		if len(args) == 0 {
			return Usagef("no command given")
		}
		return nil
	}
	commands := p.commands()
	names := make([]string, len(commands))
	for i, c := range commands {
		if c.Name == args[0] {
			return c.Run(ctx, args[1:], getenv, stdout, stderr)
		}
		names[i] = c.Name
	}
	return Usagef("unknown command %q%s\nrun '%s help' for the commands", args[0], didYouMean(args[0], names, ""), program)
}

func (p Program) usage(w io.Writer) {
	head, tail, _ := strings.Cut(p.Usage+"\n", "{{commands}}\n")
	fmt.Fprint(w, head)
	for _, c := range p.commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.Name, c.Summary)
	}
	fmt.Fprint(w, tail)
}

// didYouMean is " (did you mean <prefix>X?)" for the candidate X nearest to word, or "".
func didYouMean(word string, candidates []string, prefix string) string {
	if meant, ok := suggest.Closest(word, candidates); ok {
		return fmt.Sprintf(" (did you mean %s%s?)", prefix, meant)
	}
	return ""
}

// Group is a command whose first argument is a verb: quotaflow rules list.
type Group struct {
	Name  string
	Usage string // the verbs and their arguments, one per line
	Verbs map[string]Func
}

// Run runs the verb args name with the arguments after it. No verb prints the usage and is a
// UsageError; an unknown verb is a UsageError naming the nearest verb.
func (g Group) Run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	usage := g.Usage + "\n"
	if len(args) == 0 || isHelp(args[0]) {
		fmt.Fprintf(stdout, "Usage:\n%s\nRun %s %s <verb> --help for a verb's flags.\n", usage, program, g.Name)
		if len(args) == 0 {
			return Usagef("%s: name a verb", g.Name)
		}
		return nil
	}
	run, ok := g.Verbs[args[0]]
	if !ok {
		verbs := make([]string, 0, len(g.Verbs))
		for v := range g.Verbs {
			verbs = append(verbs, v)
		}
		sort.Strings(verbs) // suggest's ties go to the earlier candidate: one answer every run
		return Usagef("%s: unknown verb %q%s\nUsage:\n%s", g.Name, args[0], didYouMean(args[0], verbs, ""), usage)
	}
	return run(ctx, args[1:], getenv, stdout, stderr)
}

package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

// testProgram has two commands, a group, and a version.
func testProgram(ran *[]string) Program {
	record := func(name string) Func {
		return func(_ context.Context, args []string, _ func(string) string, _, _ io.Writer) error {
			*ran = append(*ran, name+" "+strings.Join(args, " "))
			return nil
		}
	}
	return Program{Usage: "Usage: quotaflow <command>\n\nCommands:\n{{commands}}\nMore.", Version: "quotaflow v1.2.3",
		Commands: []Command{
			{Name: "check", Summary: "ask", Run: record("check")},
			{Name: "checker", Summary: "serve", Run: record("checker")},
			{Name: "rules", Summary: "rules", Run: Group{Name: "rules", Usage: "  rules list\n  rules apply -f FILE",
				Verbs: map[string]Func{"list": record("rules list"), "apply": record("rules apply")}}.Run},
		}}
}

func TestProgramRun(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args               []string
		wantRan, wantOut   string
		wantCode           int
		wantErr, wantNoOut string
	}{
		{args: []string{"check", "--user", "u"}, wantRan: "check --user u"},
		{args: []string{"rules", "apply", "-f", "x"}, wantRan: "rules apply -f x"},
		{args: nil, wantCode: 2, wantOut: "  checker    serve\n", wantErr: "no command given"},
		{args: []string{"help"}, wantOut: "  version    print quotaflow's version"},
		{args: []string{"--version"}, wantOut: "quotaflow v1.2.3\n"},
		{args: []string{"version"}, wantOut: "quotaflow v1.2.3\n"},
		{args: []string{"chek"}, wantCode: 2, wantErr: "unknown command \"chek\" (did you mean check?)\nrun 'quotaflow help' for the commands", wantNoOut: "Commands:"},
		{args: []string{"frobnicate"}, wantCode: 2, wantErr: "unknown command \"frobnicate\"\nrun"},
		{args: []string{"rules", "lsit"}, wantCode: 2, wantErr: "rules: unknown verb \"lsit\" (did you mean list?)"},
		{args: []string{"rules"}, wantCode: 2, wantOut: "rules apply -f FILE", wantErr: "rules: name a verb"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			var ran []string
			var out, errs bytes.Buffer
			code := ExitCode(testProgram(&ran).Run(context.Background(), tt.args, func(string) string { return "" }, &out, &errs), &errs)
			if got := strings.Join(ran, ";"); got != tt.wantRan {
				t.Errorf("ran %q, want %q", got, tt.wantRan)
			}
			if code != tt.wantCode || !strings.Contains(out.String(), tt.wantOut) || !strings.Contains(errs.String(), tt.wantErr) {
				t.Errorf("exit %d, stdout %q, stderr %q; want %d, %q, %q", code, out.String(), errs.String(), tt.wantCode, tt.wantOut, tt.wantErr)
			}
			if tt.wantNoOut != "" && strings.Contains(out.String()+errs.String(), tt.wantNoOut) {
				t.Errorf("output %q has %q, want a few lines", out.String()+errs.String(), tt.wantNoOut)
			}
		})
	}
}

func TestFlagSetParse(t *testing.T) {
	t.Parallel()
	type values struct {
		url     string
		timeout time.Duration
		seeds   []string
	}
	newSet := func(v *values) *FlagSet {
		fs := NewFlagSet("checker", "Serves.", io.Discard)
		fs.StringVar(&v.url, "redis-url", "redis://default", "url")
		fs.DurationVar(&v.timeout, "redis-timeout", time.Second, "timeout")
		fs.ListVar(&v.seeds, "redis-cluster", "seeds")
		fs.FromEnv("redis-url", "redis-timeout", "redis-cluster")
		fs.Check(func() error {
			if v.timeout > time.Minute {
				return errors.New("--redis-timeout: too long")
			}
			return nil
		})
		return fs
	}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    values
		wantErr string
	}{
		{"defaults", nil, nil, values{"redis://default", time.Second, nil}, ""},
		{"env", nil, map[string]string{"QUOTAFLOW_REDIS_URL": "redis://env", "QUOTAFLOW_REDIS_CLUSTER": " a:1, ,b:2 "}, values{"redis://env", time.Second, []string{"a:1", "b:2"}}, ""},
		{"flag beats env", []string{"--redis-url", "redis://flag"}, map[string]string{"QUOTAFLOW_REDIS_URL": "redis://env"}, values{"redis://flag", time.Second, nil}, ""},
		{"bad env", nil, map[string]string{"QUOTAFLOW_REDIS_TIMEOUT": "soon"}, values{}, `QUOTAFLOW_REDIS_TIMEOUT="soon": invalid value for --redis-timeout`},
		{"bad flag value", []string{"--redis-timeout", "soon"}, nil, values{}, `checker: invalid value "soon" for flag --redis-timeout`},
		{"unknown flag", []string{"--redis-ulr", "x"}, nil, values{}, "checker: unknown flag --redis-ulr (did you mean --redis-url?)\nrun 'quotaflow checker --help' for its flags"},
		{"no argument", []string{"--redis-url"}, nil, values{}, "flag needs an argument: --redis-url"},
		{"stray argument", []string{"extra"}, nil, values{}, `checker: unexpected argument "extra"`},
		{"check", []string{"--redis-timeout", "2m"}, nil, values{}, "--redis-timeout: too long"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got values
			err := newSet(&got).Parse(tt.args, func(k string) string { return tt.env[k] })
			if tt.wantErr != "" {
				if !errors.As(err, new(UsageError)) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("Parse = %v, want a UsageError with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got.url != tt.want.url || got.timeout != tt.want.timeout || strings.Join(got.seeds, " ") != strings.Join(tt.want.seeds, " ") {
				t.Errorf("Parse = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

// TestFlagSetHelp: --help prints the synopsis, each flag and its variable, and is no error
// to ExitCode.
func TestFlagSetHelp(t *testing.T) {
	t.Parallel()
	var help bytes.Buffer
	fs := NewFlagSet("rules get", "Prints one rule.", &help)
	fs.Bool("json", false, "print JSON")
	fs.String("target", "http://127.0.0.1:8080", "checker `URL`")
	fs.FromEnv("target")
	_, err := fs.ParseArgs([]string{"--help"}, func(string) string { return "" }, 1, "a rule id")
	if !errors.Is(err, flag.ErrHelp) || ExitCode(err, io.Discard) != 0 {
		t.Fatalf("ParseArgs(--help) = %v, want flag.ErrHelp and exit 0", err)
	}
	for _, want := range []string{"Usage: quotaflow rules get [flags]\n\nPrints one rule.", "\n  --json\n", "\n  --target URL\n", "(env QUOTAFLOW_TARGET)"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("help %q lacks %q", help.String(), want)
		}
	}
	if got := fs.Variables(); strings.Join(got, " ") != "QUOTAFLOW_TARGET" || fs.Variable("json") != "" {
		t.Errorf("Variables = %v, Variable(json) = %q", got, fs.Variable("json"))
	}
}

func TestParseArgs(t *testing.T) {
	t.Parallel()
	fs := NewFlagSet("tier set", "", io.Discard)
	asJSON := fs.Bool("json", false, "")
	pos, err := fs.ParseArgs([]string{"alice", "--json", "pro"}, func(string) string { return "" }, 2, "USER and TIER")
	if err != nil || strings.Join(pos, " ") != "alice pro" || !*asJSON || !fs.IsSet("json") {
		t.Errorf("ParseArgs = %v, %v (json %v); want alice pro with --json", pos, err, *asJSON)
	}
	fs = NewFlagSet("tier set", "", io.Discard)
	if _, err := fs.ParseArgs([]string{"alice"}, func(string) string { return "" }, 2, "USER and TIER"); err == nil || err.Error() != "tier set: want USER and TIER, got 1 argument(s)" {
		t.Errorf("ParseArgs of one argument = %v", err)
	}
}

func TestExitCode(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		err       error
		want      int
		wantShown string
	}{
		{nil, 0, ""},
		{Status{Code: 3, Err: errors.New("denied"), Shown: true}, 3, ""},
		{Status{Code: 4, Err: errors.New("unhealthy: redis down")}, 4, "quotaflow: unhealthy: redis down\n"},
		{Usagef("--x: bad"), 2, "quotaflow: --x: bad\n"},
		{errors.New("boom"), 1, "quotaflow: boom\n"},
	} {
		var b bytes.Buffer
		if got := ExitCode(tt.err, &b); got != tt.want || b.String() != tt.wantShown {
			t.Errorf("ExitCode(%v) = %d, printed %q; want %d, %q", tt.err, got, b.String(), tt.want, tt.wantShown)
		}
	}
}

package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/quotaflow/quotaflow/internal/app/feed"
	"github.com/quotaflow/quotaflow/internal/cli"
)

func runWatch(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	kinds := feed.Kinds()
	name := kinds[0].Name
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	var k *feed.Kind
	var list strings.Builder
	names := make([]string, len(kinds))
	for i := range kinds {
		names[i] = kinds[i].Name
		fmt.Fprintf(&list, "\n  %-10s %s", kinds[i].Name, kinds[i].Summary)
		if kinds[i].Name == name {
			k = &kinds[i]
		}
	}
	if k == nil {
		return cli.Usagef("watch: want `quotaflow watch %s`, got %q", strings.Join(names, "|"), name)
	}
	// Every kind is listed, whichever one's help is asked for: quotaflow watch --help is the
	// help of the default, decisions.
	fs := cli.NewFlagSet("watch "+k.Name, "Targets (default "+kinds[0].Name+"):"+list.String()+"\n\n"+k.Details, stderr)
	fs.UsageLine = "watch [" + strings.Join(names, "|") + "]"
	cfg := feed.Config{Out: stdout, Errs: stderr}
	fs.StringVar(&cfg.NATSURL, "nats-url", "nats://127.0.0.1:4222", "NATS `URL`")
	fs.FromEnv("nats-url")
	registerReaderCreds(fs, &cfg.Credentials)
	fs.StringVar(&cfg.Stream, "stream", k.Stream, "stream to read")
	fs.BoolVar(&cfg.All, "all", false, "start from the oldest "+k.One+" kept instead of new ones")
	fs.BoolVar(&cfg.JSON, "json", false, "print each "+k.One+" as one line of JSON")
	fs.IntVar(&cfg.Count, "count", 0, "stop after this many "+k.Many+" (0: until interrupted)")
	if err := fs.Parse(args, getenv); err != nil {
		return err
	}
	return feed.Follow(ctx, *k, cfg)
}

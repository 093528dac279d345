package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.yaml.in/yaml/v3"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/internal/rules"
	"github.com/quotaflow/quotaflow/internal/rulestore"
)

// adminFlags configure the admin REST API of the commands that run a checker.
type adminFlags struct {
	token          string
	tokensFile     string
	readPerMinute  int
	writePerMinute int
	tokens         map[string]checker.AdminToken // loaded by validate
}

func (a *adminFlags) register(fs *flagSet) {
	fs.StringVar(&a.token, "admin-token", "", "bearer `token` with write access to the admin API under /api/v1 (name \"admin\"); without any token the API refuses every call")
	fs.fromEnv("admin-token", "QUOTAFLOW_ADMIN_TOKEN")
	fs.StringVar(&a.tokensFile, "admin-tokens-file", "", "YAML `file` of admin API tokens: tokens: [{token: ..., name: ..., role: read|write}]")
	fs.fromEnv("admin-tokens-file", "QUOTAFLOW_ADMIN_TOKENS_FILE")
	fs.IntVar(&a.readPerMinute, "admin-read-per-minute", 1000, "admin API reads allowed per token per minute")
	fs.fromEnv("admin-read-per-minute", "QUOTAFLOW_ADMIN_READ_PER_MINUTE")
	fs.IntVar(&a.writePerMinute, "admin-write-per-minute", 100, "admin API writes allowed per token per minute")
	fs.fromEnv("admin-write-per-minute", "QUOTAFLOW_ADMIN_WRITE_PER_MINUTE")
}

func (a *adminFlags) validate() error {
	if a.readPerMinute < 1 {
		return fmt.Errorf("--admin-read-per-minute: want at least 1, got %d", a.readPerMinute)
	}
	if a.writePerMinute < 1 {
		return fmt.Errorf("--admin-write-per-minute: want at least 1, got %d", a.writePerMinute)
	}
	a.tokens = map[string]checker.AdminToken{}
	if a.tokensFile != "" {
		data, err := os.ReadFile(a.tokensFile)
		if err != nil {
			return fmt.Errorf("--admin-tokens-file: %w", err)
		}
		if a.tokens, err = parseTokens(data); err != nil {
			return fmt.Errorf("--admin-tokens-file %s: %w", a.tokensFile, err)
		}
	}
	if a.token != "" {
		if _, dup := a.tokens[a.token]; dup {
			return errors.New("--admin-token: the same token is also in --admin-tokens-file")
		}
		a.tokens[a.token] = checker.AdminToken{Name: "admin", Role: checker.RoleWrite}
	}
	return nil
}

func (a *adminFlags) config(store checker.ConfigStore) checker.AdminConfig {
	return checker.AdminConfig{Store: store, Tokens: a.tokens, ReadPerMinute: a.readPerMinute, WritePerMinute: a.writePerMinute}
}

// tokenEntry is one token of an --admin-tokens-file.
type tokenEntry struct {
	Token string `yaml:"token"`
	Name  string `yaml:"name"`
	Role  string `yaml:"role"`
}

// parseTokens reads a tokens file: tokens: as a list of {token, name, role}, or as a map from
// token to {name, role}.
func parseTokens(data []byte) (map[string]checker.AdminToken, error) {
	var file struct {
		Tokens yaml.Node `yaml:"tokens"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&file); err != nil {
		return nil, fmt.Errorf("yaml: %w", err)
	}
	var entries []tokenEntry
	var where []string
	switch file.Tokens.Kind {
	case yaml.SequenceNode:
		if err := file.Tokens.Decode(&entries); err != nil {
			return nil, fmt.Errorf("tokens: %w", err)
		}
		for i := range entries {
			where = append(where, fmt.Sprintf("tokens[%d]", i))
		}
	case yaml.MappingNode:
		var m map[string]tokenEntry
		if err := file.Tokens.Decode(&m); err != nil {
			return nil, fmt.Errorf("tokens: %w", err)
		}
		for tok, e := range m {
			e.Token = tok
			entries = append(entries, e)
			where = append(where, fmt.Sprintf("tokens[%s…]", tok[:min(4, len(tok))]))
		}
	default:
		return nil, errors.New("tokens: want a list of {token, name, role}")
	}
	out := make(map[string]checker.AdminToken, len(entries))
	for i, e := range entries {
		switch {
		case len(e.Token) < 16:
			return nil, fmt.Errorf("%s.token: want at least 16 characters", where[i])
		case e.Name == "":
			return nil, fmt.Errorf("%s.name: required (write calls are logged under it)", where[i])
		case e.Role != checker.RoleRead && e.Role != checker.RoleWrite:
			return nil, fmt.Errorf("%s.role: want read or write, got %q", where[i], e.Role)
		}
		if _, dup := out[e.Token]; dup {
			return nil, fmt.Errorf("%s.token: listed twice", where[i])
		}
		out[e.Token] = checker.AdminToken{Name: e.Name, Role: e.Role}
	}
	return out, nil
}

// lazyStore is the admin API's store: empty until the rule store is reachable, then the store.
type lazyStore struct {
	p atomic.Pointer[rulestore.Store]
}

var errStoreNotYet = errors.New("the rule store is not reachable yet (NATS down at start); the checker enforces its rules file meanwhile")

func (l *lazyStore) get() (*rulestore.Store, error) {
	if s := l.p.Load(); s != nil {
		return s, nil
	}
	return nil, errStoreNotYet
}

func (l *lazyStore) Current(ctx context.Context) (*rules.Set, error) {
	s, err := l.get()
	if err != nil {
		return nil, err
	}
	return s.Current(ctx)
}

func (l *lazyStore) Apply(ctx context.Context, doc *rules.Document) error {
	s, err := l.get()
	if err != nil {
		return err
	}
	return s.Apply(ctx, doc)
}

func (l *lazyStore) PutRule(ctx context.Context, r rules.DocRule) (bool, error) {
	s, err := l.get()
	if err != nil {
		return false, err
	}
	return s.PutRule(ctx, r)
}

func (l *lazyStore) CreateRule(ctx context.Context, r rules.DocRule) error {
	s, err := l.get()
	if err != nil {
		return err
	}
	return s.CreateRule(ctx, r)
}

func (l *lazyStore) DeleteRule(ctx context.Context, id string) error {
	s, err := l.get()
	if err != nil {
		return err
	}
	return s.DeleteRule(ctx, id)
}

func (l *lazyStore) SetUserTier(ctx context.Context, user, tier string) error {
	s, err := l.get()
	if err != nil {
		return err
	}
	return s.SetUserTier(ctx, user, tier)
}

func (l *lazyStore) PutOverride(ctx context.Context, o rules.Override) error {
	s, err := l.get()
	if err != nil {
		return err
	}
	return s.PutOverride(ctx, o)
}

func (l *lazyStore) DeleteOverride(ctx context.Context, id, actor string) error {
	s, err := l.get()
	if err != nil {
		return err
	}
	return s.DeleteOverride(ctx, id, actor)
}

func (l *lazyStore) Overrides(ctx context.Context) ([]rules.Override, error) {
	s, err := l.get()
	if err != nil {
		return nil, err
	}
	return s.Overrides(ctx)
}

// ruleSource keeps a checker's rules in step with the rule store.
type ruleSource struct {
	js       jetstream.JetStream
	cfg      rulestore.Config
	seed     *rules.Document // the --rules file, nil without one
	seedPath string
	lazy     lazyStore
	log      *slog.Logger
}

// open opens the store, seeds it from the rules file when it holds no rules yet, and returns
// its configuration.
func (rs *ruleSource) open(ctx context.Context) (*rulestore.Store, *rules.Set, error) {
	store, err := rulestore.Open(ctx, rs.js, rs.cfg)
	if err != nil {
		return nil, nil, err
	}
	if rs.seed != nil {
		seeded, err := store.Seed(ctx, rs.seed)
		if err != nil {
			return nil, nil, fmt.Errorf("seed the rule store: %w", err)
		}
		if seeded {
			rs.log.Info("rule store seeded from the rules file", "rules", rs.seedPath)
		} else {
			rs.log.Info("rule store already holds rules: they win over the rules file (quotaflow rules apply -f replaces them)", "rules", rs.seedPath)
		}
	}
	set, err := store.Current(ctx)
	if err != nil {
		return nil, nil, err
	}
	rs.lazy.p.Store(store)
	return store, set, nil
}

// run watches the store and swaps the checker's rules on every change until ctx ends. With
// store nil (NATS was unreachable at start) it first retries opening it, the rules file
// enforced meanwhile.
func (rs *ruleSource) run(ctx context.Context, store *rulestore.Store, srv *checker.Server) error {
	wait := func(d time.Duration) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(d):
			return true
		}
	}
	backoff := 250 * time.Millisecond
	for ctx.Err() == nil {
		if store == nil {
			octx, cancel := context.WithTimeout(ctx, 5*time.Second)
			s, set, err := rs.open(octx)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					rs.log.Warn("rule store still unreachable; enforcing the rules file", "err", err, "retry_in", backoff)
				}
				if !wait(backoff) {
					return nil
				}
				backoff = min(2*backoff, 10*time.Second)
				continue
			}
			store = s
			srv.SetRules(set)
			rs.log.Info("rule store reachable: enforcing its rules from now on", "rule_count", len(set.Rules()))
		}
		err := store.Watch(ctx, srv.SetRules)
		if ctx.Err() != nil {
			return nil
		}
		rs.log.Warn("rule store watch stopped; restarting it", "err", err)
		if !wait(time.Second) {
			return nil
		}
	}
	return nil
}

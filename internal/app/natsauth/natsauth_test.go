package natsauth_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/aggregator"
	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/app/health"
	"github.com/quotaflow/quotaflow/internal/app/natsauth"
	"github.com/quotaflow/quotaflow/internal/app/rulestore"
	"github.com/quotaflow/quotaflow/internal/broker"
	"github.com/quotaflow/quotaflow/internal/stream"
	"github.com/quotaflow/quotaflow/internal/testbed/proctest"
	"github.com/quotaflow/quotaflow/internal/webhook"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/publisher"
)

const seedRules = `rules:
- {id: api, dimension: user, endpoint: /api, algorithm: fixed_window, limit: 10, window: 1m}
`

var quiet = slog.New(slog.DiscardHandler)

// startServer starts a nats-server from the configuration a deployment gets: a main file that
// includes the users file nats-auth writes, with the seeds beside it. It returns the server's
// URL and the credentials folder.
func startServer(t *testing.T) (string, string) {
	t.Helper()
	dir := t.TempDir()
	keys, err := natsauth.Ensure(filepath.Join(dir, "auth"))
	if err != nil {
		t.Fatal(err)
	}
	users, err := natsauth.Config{}.ServerConfig(keys)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "auth", natsauth.ServerFile), users, 0o644); err != nil {
		t.Fatal(err)
	}
	port, err := proctest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf("listen: %q\njetstream { store_dir: %q }\ninclude ./auth/%s\n", proctest.Addr(port), filepath.Join(dir, "js"), natsauth.ServerFile)
	path := filepath.Join(dir, "nats-server.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("the written configuration: %v", err)
	}
	opts.NoLog, opts.NoSigs = true, true
	srv, err := broker.EmbeddedWith(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return srv.ClientURL(), filepath.Join(dir, "auth")
}

// client is a connection as one role, which records the permission violations the server
// reports to it.
type client struct {
	nc *nats.Conn
	js jetstream.JetStream

	mu      sync.Mutex
	refused []string
}

func connect(t *testing.T, url, dir string, role natsauth.Role) *client {
	t.Helper()
	c := &client{}
	creds, err := broker.CredentialsOption(natsauth.SeedFile(dir, role))
	if err != nil {
		t.Fatal(err)
	}
	c.nc, err = nats.Connect(url, creds, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.refused = append(c.refused, err.Error())
	}))
	if err != nil {
		t.Fatalf("connect as %s: %v", role, err)
	}
	t.Cleanup(c.nc.Close)
	if c.js, err = jetstream.New(c.nc); err != nil {
		t.Fatal(err)
	}
	return c
}

// refusals returns the violations reported so far naming subject ("" : any).
func (c *client) refusals(subject string) []string {
	c.nc.Flush()
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, r := range c.refused {
		if strings.Contains(r, "Permissions Violation") && strings.Contains(r, subject) {
			out = append(out, r)
		}
	}
	return out
}

// pipeline is a server with what each role made on it: the rule store seeded by the admin, a
// decision published by a checker, the aggregators' stream work.
type pipeline struct {
	url, dir string
	roles    map[natsauth.Role]*client
}

func newPipeline(t *testing.T) *pipeline {
	t.Helper()
	url, dir := startServer(t)
	p := &pipeline{url: url, dir: dir, roles: map[natsauth.Role]*client{}}
	for _, role := range natsauth.Roles {
		p.roles[role] = connect(t, url, dir, role)
	}
	return p
}

// TestRolesDoTheirJobs runs each role's work with quotaflow's own components against the
// shipped permissions: none is refused anything.
func TestRolesDoTheirJobs(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, checker, agg, op := p.roles[natsauth.Admin], p.roles[natsauth.Checker], p.roles[natsauth.Aggregator], p.roles[natsauth.Operator]

	// The admin API: creates the store, seeds it, changes it.
	store, err := rulestore.Open(ctx, admin.js, rulestore.Config{})
	if err != nil {
		t.Fatalf("admin opens the rule store: %v", err)
	}
	doc, err := rules.Decode([]byte(seedRules))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Seed(ctx, doc); err != nil {
		t.Fatalf("admin seeds: %v", err)
	}
	if _, err := store.PutExemption(ctx, rules.DocExemption{ID: "acme", Dimension: "user", Value: "acme", Reason: "contract"}, "ops"); err != nil {
		t.Fatalf("admin sets an exemption: %v", err)
	}
	hooks, err := rulestore.OpenWebhooks(ctx, admin.js, rulestore.Config{})
	if err != nil {
		t.Fatalf("admin opens the webhook endpoints: %v", err)
	}
	secret, _ := webhook.NewSecret()
	if _, err := hooks.PutEndpoint(ctx, webhook.Endpoint{ID: "billing", URL: "https://billing.example.com/hooks", Secret: secret}, "ops"); err != nil {
		t.Fatalf("admin sets a webhook endpoint: %v", err)
	}
	override := rules.Override{ID: "admin-1", Dimension: "user", Identifier: "alice", Limit: 20, Reason: "launch",
		Creator: "ops", Source: "admin", CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}
	if err := store.PutOverride(ctx, override); err != nil {
		t.Fatalf("admin puts an override: %v", err)
	}

	// A checker: follows the store read-only, publishes decisions, reports its health.
	follower := rulestore.NewFollower(checker.js, rulestore.FollowerConfig{ReadOnly: true})
	set, err := follower.Open(ctx)
	if err != nil {
		t.Fatalf("checker reads the rule store: %v", err)
	}
	if _, ok := set.Rule("api"); !ok {
		t.Errorf("the checker's rules lack the seeded rule")
	}
	if _, err := follower.PutExemption(ctx, rules.DocExemption{ID: "x"}, "me"); !errors.Is(err, rulestore.ErrReadOnly) {
		t.Errorf("a read-only follower's write = %v, want ErrReadOnly", err)
	}
	pub, err := publisher.New(checker.nc, publisher.Config{SpoolDir: t.TempDir(), Partitions: 2, Logger: quiet})
	if err != nil {
		t.Fatalf("checker creates the decision stream: %v", err)
	}
	pub.PublishDecision(&quotaflowv1.Decision{Id: "d1", Allowed: true, Subject: &quotaflowv1.Subject{Identifier: "alice"}})
	if err := pub.Close(ctx); err != nil {
		t.Fatalf("checker publishes: %v", err)
	}
	hkv, err := checker.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: health.Bucket, History: 1})
	if err != nil {
		t.Fatalf("checker creates the health bucket: %v", err)
	}
	if _, err := hkv.Put(ctx, health.Key("checker", "c1"), []byte("{}")); err != nil {
		t.Fatalf("checker reports its health: %v", err)
	}

	// An aggregator: binds the store, writes a policy's override, consumes and acks decisions
	// through its durable consumer, publishes a transition, keeps its buckets.
	astore, err := rulestore.Open(ctx, agg.js, rulestore.Config{Bind: true})
	if err != nil {
		t.Fatalf("aggregator binds the rule store: %v", err)
	}
	penalty := override
	penalty.ID, penalty.Source, penalty.Limit, penalty.Identifier = "penalty-1", "penalty", 5, "mallory"
	if err := astore.PutOverride(ctx, penalty); err != nil {
		t.Fatalf("aggregator's policy puts an override: %v", err)
	}
	if _, err := events.EnsureStream(ctx, agg.js, 1); err != nil {
		t.Fatalf("aggregator ensures the events stream: %v", err)
	}
	cons, err := agg.js.CreateOrUpdateConsumer(ctx, stream.Name, jetstream.ConsumerConfig{Durable: aggregator.ConsumerName(0),
		AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: stream.Subject(stream.SubjectPrefix, 0)})
	if err != nil {
		t.Fatalf("aggregator creates its durable consumer: %v", err)
	}
	if batch, err := cons.FetchNoWait(10); err != nil {
		t.Fatalf("aggregator fetches: %v", err)
	} else {
		for m := range batch.Messages() {
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatalf("aggregator acks: %v", err)
			}
		}
	}
	ev := &events.Transition{ID: "t1", Tier: "free", Dimension: "user", Subject: "bob", To: events.StateThrottled}
	if err := events.Publish(ctx, agg.js, ev.NATSSubject(), ev.ID, ev); err != nil {
		t.Fatalf("aggregator publishes a transition: %v", err)
	}
	ent := &events.EntitlementEvent{ID: "e1", Kind: events.EntitlementUsedPercent, Entitlement: "tokens", Dimension: "user", Subject: "bob", Threshold: 80}
	if err := events.Publish(ctx, agg.js, ent.NATSSubject(), ent.ID, ent); err != nil {
		t.Fatalf("aggregator publishes an entitlement event: %v", err)
	}
	ahooks, err := rulestore.OpenWebhooks(ctx, agg.js, rulestore.Config{Bind: true})
	if err != nil {
		t.Fatalf("aggregator binds the webhook endpoints: %v", err)
	}
	if eps, err := ahooks.Endpoints(ctx); err != nil || len(eps) != 1 || eps[0].Secret.IsZero() {
		t.Errorf("aggregator reads the webhook endpoints: %v, %v; want billing with its secret", eps, err)
	}
	for _, bucket := range []string{stream.Name + "_AGGREGATORS", stream.Name + "_WARNINGS"} {
		kv, err := agg.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket})
		if err != nil {
			t.Fatalf("aggregator creates %s: %v", bucket, err)
		}
		if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
			t.Fatalf("aggregator writes %s: %v", bucket, err)
		}
	}

	// The operator: reads the streams and the buckets, changing nothing.
	var read []string
	err = broker.Tail(ctx, op.js, stream.Name, nil, true, func(m jetstream.Msg) (bool, error) {
		read = append(read, m.Subject())
		return true, nil
	})
	if err != nil || len(read) != 1 {
		t.Errorf("operator tails the decisions: %v, read %v", err, read)
	}
	if ovs, err := rulestore.ReadOverrides(ctx, op.js); err != nil || len(ovs) != 2 {
		t.Errorf("operator reads the overrides: %d, %v; want 2", len(ovs), err)
	}
	if reps, err := health.List(ctx, op.js); err != nil {
		t.Errorf("operator reads the health reports: %v (%d)", err, len(reps))
	}

	for role, c := range p.roles {
		if r := c.refusals(""); len(r) > 0 {
			t.Errorf("%s was refused: %v", role, r)
		}
	}
}

// TestForgedWritesRefused tries, as each role that may not, every write an attacker on the
// NATS network tried: each is refused by the server, and what it aimed at is unchanged.
func TestForgedWritesRefused(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel) // after the parallel subtests
	admin, agg := p.roles[natsauth.Admin], p.roles[natsauth.Aggregator]
	store, err := rulestore.Open(ctx, admin.js, rulestore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	doc, err := rules.Decode([]byte(seedRules))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Seed(ctx, doc); err != nil {
		t.Fatal(err)
	}
	if _, err := rulestore.OpenWebhooks(ctx, admin.js, rulestore.Config{}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.roles[natsauth.Checker].js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: stream.Name, Subjects: []string{stream.SubjectPrefix + ".>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.roles[natsauth.Checker].js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: health.Bucket, History: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := agg.js.CreateOrUpdateConsumer(ctx, stream.Name, jetstream.ConsumerConfig{Durable: aggregator.ConsumerName(1),
		AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: stream.Subject(stream.SubjectPrefix, 1)}); err != nil {
		t.Fatal(err)
	}
	configRev := func() uint64 {
		kv, err := admin.js.KeyValue(ctx, rulestore.ConfigBucket)
		if err != nil {
			t.Fatal(err)
		}
		st, err := kv.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st.(*jetstream.KeyValueBucketStatus).StreamInfo().State.LastSeq
	}
	before := configRev()

	forged := rules.Override{ID: "forged", Dimension: "user", Identifier: "mallory", Limit: 50, Reason: "x", Creator: "ops",
		Source: "admin", CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}
	forgedJSON := fmt.Sprintf(`{"id":"forged","dimension":"user","identifier":"mallory","limit":50,"creator":"ops","expires_at":%q}`,
		forged.ExpiresAt.Format(time.RFC3339))
	kvPut := func(bucket, key, value string) func(context.Context, *client) error {
		return func(ctx context.Context, c *client) error {
			kv, err := c.js.KeyValue(ctx, bucket)
			if err != nil {
				return err
			}
			_, err = kv.Put(ctx, key, []byte(value))
			return err
		}
	}
	publish := func(subject string) func(context.Context, *client) error {
		return func(ctx context.Context, c *client) error {
			_, err := c.js.Publish(ctx, subject, []byte(`{"to":"throttled"}`))
			return err
		}
	}
	api := func(subject, body string) func(context.Context, *client) error {
		return func(ctx context.Context, c *client) error {
			_, err := c.nc.RequestWithContext(ctx, subject, []byte(body))
			return err
		}
	}
	durable := aggregator.ConsumerName(1)
	attacks := []struct {
		name    string
		roles   []natsauth.Role
		subject string // the subject the server must name in its refusal
		do      func(context.Context, *client) error
	}{
		{"put a forged override", []natsauth.Role{natsauth.Checker, natsauth.Operator},
			"$KV.QUOTAFLOW_OVERRIDES.forged", kvPut(rulestore.OverrideBucket, "forged", forgedJSON)},
		{"rewrite the rules document", []natsauth.Role{natsauth.Checker, natsauth.Aggregator, natsauth.Operator},
			"$KV.QUOTAFLOW_CONFIG.ruleset", kvPut(rulestore.ConfigBucket, "ruleset", `{"rules":[]}`)},
		{"publish a throttled transition", []natsauth.Role{natsauth.Checker, natsauth.Admin, natsauth.Operator},
			"quotaflow.warnings.free.user", publish("quotaflow.warnings.free.user")},
		{"publish a config event", []natsauth.Role{natsauth.Checker, natsauth.Aggregator, natsauth.Operator},
			"quotaflow.config.put", publish("quotaflow.config.put")},
		{"publish an entitlement event", []natsauth.Role{natsauth.Checker, natsauth.Admin, natsauth.Operator},
			"quotaflow.entitlements.used_percent", publish("quotaflow.entitlements.used_percent")},
		{"read the webhook secrets", []natsauth.Role{natsauth.Checker, natsauth.Operator},
			"$JS.API.STREAM.INFO.KV_QUOTAFLOW_WEBHOOKS", func(ctx context.Context, c *client) error {
				_, err := c.js.KeyValue(ctx, rulestore.WebhookBucket)
				return err
			}},
		{"point a webhook endpoint elsewhere", []natsauth.Role{natsauth.Aggregator},
			"$KV.QUOTAFLOW_WEBHOOKS.billing", kvPut(rulestore.WebhookBucket, "billing", `{"id":"billing","url":"https://evil.example.com/"}`)},
		{"publish a decision", []natsauth.Role{natsauth.Aggregator, natsauth.Admin, natsauth.Operator},
			"quotaflow.decisions.0", publish("quotaflow.decisions.0")},
		{"forge a checker's health", []natsauth.Role{natsauth.Aggregator, natsauth.Admin, natsauth.Operator},
			"$KV.QUOTAFLOW_HEALTH.checker.c9", kvPut(health.Bucket, "checker.c9", "{}")},
		{"forge an aggregator's health", []natsauth.Role{natsauth.Checker, natsauth.Admin, natsauth.Operator},
			"$KV.QUOTAFLOW_HEALTH.aggregator.a9", kvPut(health.Bucket, "aggregator.a9", "{}")},
		{"delete the configuration", natsauth.Roles,
			"$JS.API.STREAM.DELETE.KV_QUOTAFLOW_CONFIG", api("$JS.API.STREAM.DELETE.KV_QUOTAFLOW_CONFIG", "")},
		{"purge the configuration", natsauth.Roles,
			"$JS.API.STREAM.PURGE.KV_QUOTAFLOW_CONFIG", api("$JS.API.STREAM.PURGE.KV_QUOTAFLOW_CONFIG", "{}")},
		{"remove the newest rules to bring back older ones", natsauth.Roles,
			"$JS.API.STREAM.MSG.DELETE.KV_QUOTAFLOW_CONFIG", api("$JS.API.STREAM.MSG.DELETE.KV_QUOTAFLOW_CONFIG", `{"seq":1}`)},
		{"shorten the configuration's history", []natsauth.Role{natsauth.Checker, natsauth.Aggregator, natsauth.Operator},
			"$JS.API.STREAM.UPDATE.KV_QUOTAFLOW_CONFIG", api("$JS.API.STREAM.UPDATE.KV_QUOTAFLOW_CONFIG", `{"name":"KV_QUOTAFLOW_CONFIG","max_age":1000000000}`)},
		{"drop the undelivered decisions", natsauth.Roles,
			"$JS.API.STREAM.PURGE.QUOTAFLOW_DECISIONS", api("$JS.API.STREAM.PURGE.QUOTAFLOW_DECISIONS", "{}")},
		{"refilter an aggregator's consumer", []natsauth.Role{natsauth.Checker, natsauth.Admin, natsauth.Operator},
			"$JS.API.CONSUMER.CREATE.QUOTAFLOW_DECISIONS." + durable,
			func(ctx context.Context, c *client) error {
				_, err := c.js.CreateOrUpdateConsumer(ctx, stream.Name, jetstream.ConsumerConfig{Durable: durable,
					AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: "quotaflow.decisions.none"})
				return err
			}},
		{"delete an aggregator's consumer", []natsauth.Role{natsauth.Checker, natsauth.Admin, natsauth.Operator},
			"$JS.API.CONSUMER.DELETE.QUOTAFLOW_DECISIONS." + durable,
			func(ctx context.Context, c *client) error { return c.js.DeleteConsumer(ctx, stream.Name, durable) }},
		{"pull an aggregator's decisions", []natsauth.Role{natsauth.Checker, natsauth.Admin, natsauth.Operator},
			"$JS.API.CONSUMER.MSG.NEXT.QUOTAFLOW_DECISIONS." + durable,
			api("$JS.API.CONSUMER.MSG.NEXT.QUOTAFLOW_DECISIONS."+durable, `{"batch":1,"no_wait":true}`)},
	}
	for _, a := range attacks {
		for _, role := range a.roles {
			t.Run(a.name+"/"+string(role), func(t *testing.T) {
				t.Parallel()
				c := connect(t, p.url, p.dir, role)
				// A refused request is dropped by the server, so the call would wait for its
				// deadline: it is ended once the refusal has come.
				actx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				res := make(chan error, 1)
				go func() { res <- a.do(actx, c) }()
				for len(c.refusals(a.subject)) == 0 && actx.Err() == nil {
					time.Sleep(5 * time.Millisecond)
				}
				cancel()
				if err := <-res; err == nil {
					t.Fatalf("%s as %s succeeded", a.name, role)
				}
				if r := c.refusals(a.subject); len(r) == 0 {
					t.Errorf("%s as %s: the server named no refusal of %s; refusals: %v", a.name, role, a.subject, c.refusals(""))
				}
			})
		}
	}
	t.Run("connect without credentials", func(t *testing.T) {
		t.Parallel()
		nc, err := nats.Connect(p.url)
		if err == nil {
			nc.Close()
			t.Fatal("a connection without credentials was accepted")
		}
		if !errors.Is(err, nats.ErrAuthorization) {
			t.Errorf("connect without credentials: %v, want an authorization violation", err)
		}
	})
	t.Cleanup(func() {
		if got := configRev(); got != before {
			t.Errorf("the configuration bucket's last sequence moved from %d to %d", before, got)
		}
		if ovs, err := store.Overrides(context.Background()); err != nil || len(ovs) != 0 {
			t.Errorf("overrides after the attacks: %v, %v; want none", ovs, err)
		}
		cons, err := admin.js.Consumer(context.Background(), stream.Name, durable)
		if err != nil {
			t.Fatalf("the aggregator's consumer: %v", err)
		}
		if f := cons.CachedInfo().Config.FilterSubject; f != stream.Subject(stream.SubjectPrefix, 1) {
			t.Errorf("the aggregator's consumer filters %q, want its partition", f)
		}
	})
}

// TestServerConfigMatchesUsers: the file a deployment's server reads and the users the
// embedded server gets are the same permissions.
func TestServerConfigMatchesUsers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	keys, err := natsauth.Ensure(dir)
	if err != nil {
		t.Fatal(err)
	}
	again, err := natsauth.Ensure(dir)
	if err != nil || fmt.Sprint(again) != fmt.Sprint(keys) {
		t.Errorf("a second Ensure gave %v, %v; want the same keys %v", again, err, keys)
	}
	cfg := natsauth.Config{Partitions: 4}
	file, err := cfg.ServerConfig(keys)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "server.conf")
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatal(err)
	}
	users, err := cfg.Users(keys)
	if err != nil {
		t.Fatal(err)
	}
	if len(opts.Nkeys) != len(users) || len(users) != len(natsauth.Roles) {
		t.Fatalf("the file has %d users, Users %d; want %d", len(opts.Nkeys), len(users), len(natsauth.Roles))
	}
	norm := func(p *server.SubjectPermission) string {
		if p == nil {
			return ""
		}
		a, d := slices.Clone(p.Allow), slices.Clone(p.Deny)
		slices.Sort(a)
		slices.Sort(d)
		return fmt.Sprint(a, d)
	}
	for i, u := range users {
		f := opts.Nkeys[i]
		if f.Nkey != u.Nkey || norm(f.Permissions.Publish) != norm(u.Permissions.Publish) || norm(f.Permissions.Subscribe) != norm(u.Permissions.Subscribe) {
			t.Errorf("user %d: the file's %s %+v differs from Users' %s %+v", i, f.Nkey, f.Permissions, u.Nkey, u.Permissions)
		}
	}
	if _, err := cfg.Permissions("root"); err == nil {
		t.Error("Permissions of an unknown role: no error")
	}
}

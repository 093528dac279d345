// Package natsauth is who may do what in quotaflow's NATS: the roles of its processes, each
// a NATS user with the permissions its work needs and no more, their credentials (nkeys), and
// the server's side of it, as nats-server options for the embedded server and as a
// nats-server configuration file for a server of its own.
//
// The configuration lives in NATS (the rule store's KV buckets), and so do the books (the
// decision stream) and the signals that change limits (warning transitions). A NATS that any
// client may write is a configuration anyone on its network can rewrite; with these users:
//
//   - checker publishes decisions and its health, creates the decision stream, reads the rest;
//   - aggregator consumes decisions, publishes warning, override and entitlement events, writes the
//     policies' overrides, its own buckets and its health;
//   - admin (the admin API) writes the rules, users and overrides and their events;
//   - operator reads: quotaflow watch, top and status, and services that follow warnings.
//
// No role but admin may write the configuration bucket, nor read or write the webhook
// endpoints' (their signing secrets) but admin and the aggregator; no role but the aggregator may
// publish warning transitions, or read or move its durable consumers. docs/security.md says
// what each set of credentials still allows.
package natsauth

import (
	"fmt"
	"slices"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/internal/app/health"
	"github.com/quotaflow/quotaflow/internal/app/rulestore"
	"github.com/quotaflow/quotaflow/internal/field"
	"github.com/quotaflow/quotaflow/internal/stream"
)

// Role is a kind of NATS client of quotaflow; each is one NATS user.
type Role string

// The roles.
const (
	Checker    Role = "checker"
	Aggregator Role = "aggregator"
	Admin      Role = "admin"
	Operator   Role = "operator"
)

// Roles lists every role, in the order the files and users are written.
var Roles = []Role{Checker, Aggregator, Admin, Operator}

// Config says what the permissions name. The zero value is the defaults every quotaflow
// process uses.
type Config struct {
	// Partitions of the decision stream (stream.Partitions): one aggregator durable consumer
	// each, which no other role may touch.
	Partitions int
}

// The aggregator's own buckets: <decision stream>_AGGREGATORS (heartbeats) and
// <decision stream>_WARNINGS (warning states), as package aggregator names them.
var (
	membersBucket  = stream.Name + "_AGGREGATORS"
	warningsBucket = stream.Name + "_WARNINGS"
)

// Validate reports Partitions out of the decision stream's range, as a *field.Error naming it:
// the users file lists one consumer per partition.
func (c Config) Validate() error {
	if c.Partitions < 1 || c.Partitions > stream.MaxPartitions {
		return field.Errorf("Partitions", "want 1 to %d, got %d", stream.MaxPartitions, c.Partitions)
	}
	return nil
}

// kvStream is the JetStream stream behind a KV bucket.
func kvStream(bucket string) string { return "KV_" + bucket }

// kvKeys is the subject of a KV bucket's keys under prefix (a put, a delete and a purge are
// all a publish there).
func kvKeys(bucket, prefix string) string { return "$KV." + bucket + "." + prefix + ">" }

// Permissions returns what role may publish and subscribe to.
func (c Config) Permissions(role Role) (*server.Permissions, error) {
	var pub, deny []string
	// Every role reads every stream and bucket: the data is not secret from any process of
	// the pipeline (docs/security.md), and reading changes nothing.
	for _, s := range []string{stream.Name, events.Stream, kvStream(rulestore.ConfigBucket),
		kvStream(rulestore.OverrideBucket), kvStream(health.Bucket), kvStream(membersBucket), kvStream(warningsBucket)} {
		pub = append(pub, readStream(s)...)
	}
	pub = append(pub, "$JS.API.INFO", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST", "$JS.FC.>")
	switch role {
	case Checker:
		pub = append(pub, writeStream(stream.Name)...)
		pub = append(pub, stream.SubjectPrefix+".>",
			"$JS.API.STREAM.CREATE."+kvStream(health.Bucket), kvKeys(health.Bucket, "checker."))
	case Aggregator:
		pub = append(pub, readStream(kvStream(rulestore.WebhookBucket))...)
		pub = append(pub, writeStream(events.Stream)...)
		pub = append(pub, writeStream(kvStream(membersBucket))...)
		pub = append(pub, writeStream(kvStream(warningsBucket))...)
		pub = append(pub, events.WarningsPrefix+".>", events.OverridesPrefix+".>", events.EntitlementsPrefix+".>",
			kvKeys(rulestore.OverrideBucket, ""), kvKeys(membersBucket, ""), kvKeys(warningsBucket, ""),
			"$JS.API.STREAM.CREATE."+kvStream(health.Bucket), kvKeys(health.Bucket, "aggregator."))
		for _, s := range []string{stream.Name, events.Stream} {
			// Unpin: a partition's new owner takes its pinned consumer (aggregator/members.go).
			pub = append(pub, "$JS.API.CONSUMER.DURABLE.CREATE."+s+".>", "$JS.API.CONSUMER.UNPIN."+s+".>", "$JS.ACK."+s+".>")
		}
	case Admin:
		for _, s := range []string{events.Stream, kvStream(rulestore.ConfigBucket), kvStream(rulestore.OverrideBucket), kvStream(rulestore.WebhookBucket)} {
			pub = append(pub, writeStream(s)...)
		}
		// The webhook endpoints' bucket holds their signing secrets: only the admin API, which
		// writes them, and the aggregator, which signs with them, read it.
		pub = append(pub, readStream(kvStream(rulestore.WebhookBucket))...)
		pub = append(pub, events.ConfigPrefix+".>", events.OverridesPrefix+".>",
			kvKeys(rulestore.ConfigBucket, ""), kvKeys(rulestore.OverrideBucket, ""), kvKeys(rulestore.WebhookBucket, ""))
	case Operator:
	default:
		return nil, fmt.Errorf("role %q: want one of %v", role, Roles)
	}
	if role != Aggregator {
		deny = c.durables()
	}
	return &server.Permissions{
		Publish: &server.SubjectPermission{Allow: pub, Deny: deny},
		// Replies come to inboxes; warning and override events may be followed live.
		Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>", "quotaflow.>"}},
	}, nil
}

// readStream is what reading stream s takes: its info, direct and stored gets, and consumers
// of one's own (ordered consumers, KV watches) that are made, read and deleted.
func readStream(s string) []string {
	return []string{
		"$JS.API.STREAM.INFO." + s,
		"$JS.API.DIRECT.GET." + s, "$JS.API.DIRECT.GET." + s + ".>",
		"$JS.API.STREAM.MSG.GET." + s,
		"$JS.API.CONSUMER.CREATE." + s, "$JS.API.CONSUMER.CREATE." + s + ".>",
		"$JS.API.CONSUMER.INFO." + s + ".*", "$JS.API.CONSUMER.DELETE." + s + ".*",
		"$JS.API.CONSUMER.MSG.NEXT." + s + ".*",
		"$JS.API.CONSUMER.NAMES." + s, "$JS.API.CONSUMER.LIST." + s,
	}
}

// writeStream is creating stream s and updating its settings. Deleting, purging and removing
// single messages are no role's: a KV bucket's history is its audit, and removing its newest
// entry would bring back an older configuration.
func writeStream(s string) []string {
	return []string{"$JS.API.STREAM.CREATE." + s, "$JS.API.STREAM.UPDATE." + s}
}

// durables are the API subjects that reach the aggregators' durable consumers: changing one's
// filter, deleting it or pulling from it would take decisions or events away from the audit.
func (c Config) durables() []string {
	names := make([]string, 0, c.partitions()+1)
	for p := range c.partitions() {
		names = append(names, stream.Name+"."+stream.ConsumerName(p))
	}
	names = append(names, events.Stream+"."+events.ConsumerName)
	var deny []string
	for _, n := range names {
		deny = append(deny, "$JS.API.CONSUMER.CREATE."+n, "$JS.API.CONSUMER.CREATE."+n+".>",
			"$JS.API.CONSUMER.DELETE."+n, "$JS.API.CONSUMER.MSG.NEXT."+n)
	}
	return deny
}

func (c Config) partitions() int {
	if c.Partitions < 1 {
		return stream.Partitions
	}
	return min(c.Partitions, stream.MaxPartitions)
}

// Users returns the embedded server's users: one per role, authenticated by the public nkey
// keys[role].
func (c Config) Users(keys map[Role]string) ([]*server.NkeyUser, error) {
	_, users, err := c.users(keys)
	return users, err
}

// users returns the users of the roles keys names, in Roles' order, and their roles.
func (c Config) users(keys map[Role]string) ([]Role, []*server.NkeyUser, error) {
	var roles []Role
	var users []*server.NkeyUser
	for _, role := range Roles {
		key, ok := keys[role]
		if !ok {
			continue
		}
		perms, err := c.Permissions(role)
		if err != nil {
			return nil, nil, err
		}
		roles, users = append(roles, role), append(users, &server.NkeyUser{Nkey: key, Permissions: perms})
	}
	if len(users) == 0 {
		return nil, nil, fmt.Errorf("no role's key: want keys of %v", Roles)
	}
	return roles, users, nil
}

// sorted is a copy of subjects in order, for a file a reader compares.
func sorted(subjects []string) []string {
	s := slices.Clone(subjects)
	slices.Sort(s)
	return s
}

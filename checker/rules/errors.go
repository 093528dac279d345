package rules

import "errors"

// The errors of a store of rules (internal/app/rulestore), defined here so that the store's users
// (the admin API, the aggregator's policies) can tell them apart without linking the store
// and its NATS client.
var (
	// ErrNotFound is a rule, user or override that does not exist.
	ErrNotFound = errors.New("not found")
	// ErrExists is a rule or override id already in use.
	ErrExists = errors.New("already exists")
	// ErrNotSeeded is a store whose configuration holds no rules document yet.
	ErrNotSeeded = errors.New("the rule store holds no rules yet: start a checker with --rules, or run quotaflow rules apply -f FILE")
)

// Package rulestoretest gives tests a real rule store: on a NATS server of the test's own,
// since the store's buckets and the events stream have fixed names that parallel tests on one
// server would share.
package rulestoretest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/app/rulestore"
	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
)

// Seeded starts a NATS server of the test's own and returns a rule store on it seeded with
// the rules document doc, and its JetStream; both end with the test.
func Seeded(t testing.TB, doc string) (*rulestore.Store, jetstream.JetStream) {
	t.Helper()
	js := natstest.JetStream(t)
	return SeededOn(t, js, doc), js
}

// SeededOn opens the rule store on js and seeds it with doc.
func SeededOn(t testing.TB, js jetstream.JetStream, doc string) *rulestore.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := rulestore.Open(ctx, js, rulestore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	d, err := rules.Decode([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Seed(ctx, d); err != nil {
		t.Fatal(err)
	}
	return store
}

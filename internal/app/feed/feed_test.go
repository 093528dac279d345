package feed_test

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/quotaflow/quotaflow/aggregator/events"
	"github.com/quotaflow/quotaflow/internal/app/feed"
	"github.com/quotaflow/quotaflow/internal/stream"
	"github.com/quotaflow/quotaflow/internal/testbed/natstest"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
)

var natsSrv *natstest.Server

func TestMain(m *testing.M) { os.Exit(natstest.Main(m, &natsSrv)) }

func kind(t *testing.T, name string) feed.Kind {
	t.Helper()
	for _, k := range feed.Kinds() {
		if k.Name == name {
			return k
		}
	}
	t.Fatalf("no feed kind %q", name)
	return feed.Kind{}
}

// TestFollowDecisions: the decisions of a batch print one line each, as text or JSON, at most
// Count of them; an undecodable message is skipped with a note, not an end.
func TestFollowDecisions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	js := natsSrv.JetStream(t)
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: stream.Name, Subjects: []string{stream.SubjectPrefix + ".>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, stream.SubjectPrefix+".0", []byte("not a batch")); err != nil {
		t.Fatal(err)
	}
	batch := &quotaflowv1.DecisionBatch{}
	for _, id := range []string{"d1", "d2", "d3"} {
		batch.Decisions = append(batch.Decisions, &quotaflowv1.Decision{Id: id, Allowed: id != "d2", RuleId: "r", Endpoint: "/x",
			Subject: &quotaflowv1.Subject{Dimension: quotaflowv1.Dimension_DIMENSION_USER, Identifier: "alice"}})
	}
	data, err := proto.Marshal(batch)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, stream.SubjectPrefix+".1", data); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		json     bool
		count    int
		wantLine []string // a substring of each line printed, in order
	}{
		{"text", false, 3, []string{"d1", "d2", "d3"}},
		{"json, two", true, 2, []string{`"id":"d1"`, `"id":"d2"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errs bytes.Buffer
			err := feed.Follow(ctx, kind(t, "decisions"), feed.Config{NATSURL: natsSrv.URL, All: true, JSON: tt.json, Count: tt.count, Out: &out, Errs: &errs})
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			if len(lines) != len(tt.wantLine) {
				t.Fatalf("printed %d lines, want %d:\n%s", len(lines), len(tt.wantLine), out.String())
			}
			for i, want := range tt.wantLine {
				if !strings.Contains(strings.ReplaceAll(lines[i], " ", ""), strings.ReplaceAll(want, " ", "")) {
					t.Errorf("line %d = %q, want it to contain %q", i, lines[i], want)
				}
			}
			if !strings.Contains(errs.String(), "skipping undecodable message") {
				t.Errorf("errors = %q, want a note on the undecodable message", errs.String())
			}
		})
	}
}

// TestFollowWarnings: a warning transition prints as its one-line String, or as sent.
func TestFollowWarnings(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	js := natsSrv.JetStream(t)
	if _, err := events.EnsureStream(ctx, js, 1); err != nil {
		t.Fatal(err)
	}
	tr := &events.Transition{ID: "t1", Tier: "free", Dimension: "user", Subject: "bob", RuleID: "r", From: "normal", To: "warning",
		Limit: 10, Remaining: 1, At: time.Unix(1700000000, 0), Cause: "decision"}
	if err := events.Publish(ctx, js, tr.NATSSubject(), tr.ID, tr); err != nil {
		t.Fatal(err)
	}
	for _, asJSON := range []bool{false, true} {
		var out bytes.Buffer
		if err := feed.Follow(ctx, kind(t, "warnings"), feed.Config{NATSURL: natsSrv.URL, All: true, JSON: asJSON, Count: 1, Out: &out}); err != nil {
			t.Fatal(err)
		}
		want := tr.String()
		if asJSON {
			want = `"id":"t1"`
		}
		if !strings.Contains(out.String(), want) {
			t.Errorf("json=%v: printed %q, want it to contain %q", asJSON, out.String(), want)
		}
	}
}

// TestFollowMissingStream: following a stream that does not exist is an error, not a wait.
func TestFollowMissingStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := feed.Follow(ctx, kind(t, "config"), feed.Config{NATSURL: natsSrv.URL, Stream: "NO_SUCH_STREAM", Out: new(bytes.Buffer)})
	if err == nil {
		t.Fatal("Follow of a missing stream = nil, want an error")
	}
}

package broker

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestEnsureReplicas: replicas a server outside a cluster cannot hold fail at once, as a
// *ReplicasError, from CheckReplicas and from Ensure; one replica is created.
func TestEnsureReplicas(t *testing.T) {
	t.Parallel()
	srv, err := Embedded("solo", "127.0.0.1:-1", t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	nc, err := Connect(Client{URL: srv.ClientURL(), Name: "ensure test"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var re *ReplicasError
	if err := CheckReplicas(ctx, nc, 3); !errors.As(err, &re) || re.Replicas != 3 {
		t.Errorf("CheckReplicas(3) on a lone server = %v, want a ReplicasError for 3", err)
	}
	if err := CheckReplicas(ctx, nc, 1); err != nil {
		t.Errorf("CheckReplicas(1) = %v, want nil", err)
	}
	for _, tt := range []struct {
		replicas int
		wantErr  bool
	}{{3, true}, {1, false}} {
		start := time.Now()
		err := Ensure(ctx, slog.New(slog.DiscardHandler), "stream", EnsureConfig{Replicas: tt.replicas}, func(ctx context.Context) error {
			_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "R", Subjects: []string{"r"}, Replicas: tt.replicas})
			return err
		})
		if got := errors.As(err, &re); got != tt.wantErr || time.Since(start) > 2*time.Second {
			t.Errorf("Ensure of a stream with %d replicas = %v after %v, want ReplicasError %v at once", tt.replicas, err, time.Since(start), tt.wantErr)
		}
	}
}

// TestEnsureWaits: Ensure against a server that starts a second later retries, logging that
// NATS is not ready, and succeeds once it is.
func TestEnsureWaits(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	nc, err := Connect(Client{URL: "nats://" + addr, Name: "ensure test"}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	go func() {
		time.Sleep(time.Second)
		srv, err := Embedded("late", addr, t.TempDir(), nil)
		if err != nil {
			t.Error(err)
			return
		}
		t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = Ensure(ctx, log, "late stream", EnsureConfig{Attempt: 300 * time.Millisecond}, func(ctx context.Context) error {
		_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "L", Subjects: []string{"l"}})
		return err
	})
	if err != nil {
		t.Fatalf("Ensure against a server starting late: %v", err)
	}
	if !strings.Contains(logs.String(), "nats not ready: late stream; retrying") || !strings.Contains(logs.String(), "nats ready: late stream") {
		t.Errorf("logs %q: want the wait and the end of it", logs.String())
	}
}

package broker

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestEmbeddedConnectTail: an embedded server takes a connection and a stream; Tail reads the
// stream from its start, filtered by subject, until its handler is done.
func TestEmbeddedConnectTail(t *testing.T) {
	t.Parallel()
	srv, err := Embedded("test", "127.0.0.1:-1", t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	nc, err := Connect(Client{URL: srv.ClientURL(), Name: "broker test"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		subject := "t.a"
		if i%2 == 1 {
			subject = "t.b"
		}
		if _, err := js.Publish(ctx, subject, []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	err = Tail(ctx, js, "T", []string{"t.b"}, true, func(m jetstream.Msg) (bool, error) {
		got = append(got, string(m.Data()))
		return len(got) == 2, nil
	})
	if err != nil || len(got) != 2 || got[0] != "1" || got[1] != "3" {
		t.Errorf("Tail = %v, read %v; want nil and [1 3]", err, got)
	}
	if _, err := Embedded("test", "no-port", t.TempDir(), nil); err == nil {
		t.Error("Embedded on a bad address succeeded")
	}
}

// TestEmbeddedRefusesOpenNonLoopback: a server without users listens on loopback only.
func TestEmbeddedRefusesOpenNonLoopback(t *testing.T) {
	t.Parallel()
	for _, listen := range []string{"0.0.0.0:-1", "[::]:-1", ":-1"} {
		srv, err := Embedded("open", listen, t.TempDir(), nil)
		if err == nil {
			srv.Shutdown()
			t.Errorf("Embedded(%q) without users started; want refused", listen)
		} else if !strings.Contains(err.Error(), "no users") {
			t.Errorf("Embedded(%q): %v; want the reason", listen, err)
		}
	}
}

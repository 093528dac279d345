package client_test

import (
	"strings"
	"testing"

	"github.com/quotaflow/quotaflow/checker/client"
)

// TestProtocolText: each Protocol reads back from its name; other names are refused, naming
// the ones there are.
func TestProtocolText(t *testing.T) {
	t.Parallel()
	for _, p := range []client.Protocol{client.Connect, client.GRPC, client.GRPCWeb} {
		text, err := p.MarshalText()
		var got client.Protocol
		if err != nil || got.UnmarshalText(text) != nil || got != p {
			t.Errorf("%v: MarshalText = %q, %v; read back as %v", p, text, err, got)
		}
	}
	var p client.Protocol
	if err := p.UnmarshalText([]byte("http")); err == nil || !strings.Contains(err.Error(), "want connect, grpc or grpcweb") {
		t.Errorf("UnmarshalText(http) = %v, want an error naming the protocols", err)
	}
	if got := client.Protocol(7).String(); got != "Protocol(7)" {
		t.Errorf("Protocol(7).String() = %q", got)
	}
}

package transport

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/auth"
	"github.com/quotaflow/quotaflow/internal/testbed/checkertest"
)

// TestGRPCNoBandwidthPings: a gRPC connection to Serve's port is offered a 1 MiB window, and
// a request that finds it quiet is answered without a ping of the server's own (grpc-go's
// bandwidth estimator, which a fixed window turns off) — Envoy sends checks one at a time on
// quiet connections, and each such ping is one more write and read per check. Spoken frame by
// frame over a raw HTTP/2 connection, as a gateway would.
func TestGRPCNoBandwidthPings(t *testing.T) {
	t.Parallel()
	callers := new(auth.Registry)
	if err := callers.Load([]byte("anonymous: {permissions: [check]}\n")); err != nil {
		t.Fatal(err)
	}
	rdb := redisSrv.UniversalClient()
	t.Cleanup(func() { rdb.Close() })
	engine := checker.New(checker.Config{Redis: rdb, Rules: mustRules(t, rlsRules), Logger: checkertest.Logger(), RedisTimeout: loadedTimeout})
	t.Cleanup(func() { engine.Close() })
	srv := New(engine, Config{Callers: callers, Logger: checkertest.Logger(),
		ForwardAuth: ForwardAuthConfig{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}})
	addr := strings.TrimPrefix(serve(t, srv, srv.Handler()), "http://")

	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	body, err := proto.Marshal(rlsReq(desc("user_id", id(t, "u"), "path", "/rls/items")))
	if err != nil {
		t.Fatal(err)
	}
	msg := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(body)))
	msg = append(msg, body...)

	window := uint32(0)
	for i := range 3 {
		stream := uint32(2*i + 1)
		var hb bytes.Buffer
		enc := hpack.NewEncoder(&hb)
		for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":authority", addr},
			{":path", "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"},
			{"content-type", "application/grpc"}, {"te", "trailers"}} {
			if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
				t.Fatal(err)
			}
		}
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
		if err := fr.WriteData(stream, true, msg); err != nil {
			t.Fatal(err)
		}
		// Read until this call's trailers, and a little longer for a ping that follows them.
		for ended := false; ; {
			wait := 10 * time.Second
			if ended {
				wait = 200 * time.Millisecond
			}
			conn.SetReadDeadline(time.Now().Add(wait))
			f, err := fr.ReadFrame()
			if err != nil {
				if ended {
					break // quiet: nothing more after the answer
				}
				t.Fatalf("call %d: reading its answer: %v", i, err)
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if f.IsAck() {
					continue
				}
				if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
					window = v
				}
				if err := fr.WriteSettingsAck(); err != nil {
					t.Fatal(err)
				}
			case *http2.PingFrame:
				if !f.IsAck() {
					t.Errorf("call %d: the server sent a PING of its own; want none on a fixed window", i)
					if err := fr.WritePing(true, f.Data); err != nil {
						t.Fatal(err)
					}
				}
			case *http2.HeadersFrame:
				if f.StreamID == stream && f.StreamEnded() {
					ended = true
				}
			}
		}
		time.Sleep(50 * time.Millisecond) // the connection goes quiet between calls
	}
	if window != grpcWindow {
		t.Errorf("SETTINGS_INITIAL_WINDOW_SIZE %d, want %d", window, grpcWindow)
	}
}

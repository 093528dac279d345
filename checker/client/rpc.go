package client

import (
	"fmt"
	"net/http"
	"slices"

	"connectrpc.com/connect"

	"github.com/quotaflow/quotaflow/internal/bearer"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

// RPCConfig is how NewRPC reaches a checker. The zero value speaks Connect over
// NewHTTPClient's client, without a token.
type RPCConfig struct {
	// Protocol is Connect (the default), GRPC or GRPCWeb.
	Protocol Protocol
	// HTTPClient carries the calls; nil means NewHTTPClient(Protocol).
	HTTPClient *http.Client
	// Token, when set, is sent as "Authorization: Bearer <Token>" on every call.
	Token string
	// Options are further Connect options, after the protocol's and the token's.
	Options []connect.ClientOption
}

// NewRPC returns the generated RateLimiter client of the checker at baseURL
// ("http://checker:8080"). It is the one place quotaflow's Go clients
// are assembled: Client, `quotaflow check` and the load generator of `quotaflow bench`, so that
// a protocol or the token is set up the same way in each.
func NewRPC(baseURL string, cfg RPCConfig) quotaflowv1connect.RateLimiterClient {
	hc := cfg.HTTPClient
	if hc == nil {
		hc = NewHTTPClient(cfg.Protocol)
	}
	var opts []connect.ClientOption
	switch cfg.Protocol {
	case GRPC:
		opts = append(opts, connect.WithGRPC())
	case GRPCWeb:
		opts = append(opts, connect.WithGRPCWeb())
	}
	if cfg.Token != "" {
		opts = append(opts, connect.WithInterceptors(bearer.Interceptor(cfg.Token)))
	}
	opts = append(opts, cfg.Options...)
	return quotaflowv1connect.NewRateLimiterClient(hc, baseURL, opts...)
}

// NewHTTPClient returns the HTTP client NewRPC uses by default for protocol: HTTP/1.1 and
// h2c, keeping up to 64 idle connections to the checker; gRPC, which needs HTTP/2, h2c or
// HTTP/2 over TLS.
func NewHTTPClient(protocol Protocol) *http.Client {
	tr := &http.Transport{Protocols: new(http.Protocols), MaxIdleConnsPerHost: 64}
	if protocol == GRPC {
		tr.Protocols.SetUnencryptedHTTP2(true)
		tr.Protocols.SetHTTP2(true)
	} else {
		tr.Protocols.SetHTTP1(true)
		tr.Protocols.SetUnencryptedHTTP2(true)
	}
	return &http.Client{Transport: tr}
}

// protocolNames are the Protocols' names, as flags and files spell them.
var protocolNames = [...]string{Connect: "connect", GRPC: "grpc", GRPCWeb: "grpcweb"}

// String is p's name: connect, grpc or grpcweb.
func (p Protocol) String() string {
	if int(p) < len(protocolNames) {
		return protocolNames[p]
	}
	return fmt.Sprintf("Protocol(%d)", int(p))
}

// MarshalText is p's name (String), for flags and files.
func (p Protocol) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText reads a Protocol's name: connect, grpc or grpcweb.
func (p *Protocol) UnmarshalText(text []byte) error {
	i := slices.Index(protocolNames[:], string(text))
	if i < 0 {
		return fmt.Errorf("want connect, grpc or grpcweb, got %q", text)
	}
	*p = Protocol(i)
	return nil
}

// Package transport serves a checker.Engine on one port, in every wire format quotaflow speaks:
// the quotaflow.v1.RateLimiter service over Connect, gRPC, gRPC-Web and HTTP/JSON; Envoy's rate
// limit service (RLS v3); GET /ratelimit/check for gateways' forward-auth; gRPC health and
// reflection; /healthz and /readyz.
//
// The engine decides; this package only parses requests into checker.Query values and renders
// checker.Outcome values, and it is the one place that maps the engine's errors to Connect and
// gRPC codes and HTTP statuses. A new transport is a new file here and a line in Handler or
// RegisterGRPC; docs/architecture.md has the steps.
package transport

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/http"

	"connectrpc.com/grpcreflect"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/quotaflow/quotaflow/checker"
	"github.com/quotaflow/quotaflow/checker/auth"
	"github.com/quotaflow/quotaflow/internal/grpcsplit"
	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

// Config configures a Server. The zero value is usable: anyone may check, nobody may assert a
// tier or reset, and forward-auth believes no proxy and reads no idempotency key.
type Config struct {
	// Callers authenticates the callers and says what each may do; nil means no callers:
	// anyone may check, nobody may assert a tier or reset.
	Callers *auth.Registry
	// ForwardAuth configures GET /ratelimit/check.
	ForwardAuth ForwardAuthConfig
	// Lockout counts the failed authentications of every protocol per source address and
	// refuses the credentials of a source past its limit; give the admin API the same one, so
	// that both APIs count one failure budget. nil means a Lockout of the engine's store with
	// auth.DefaultFailuresPerMinute, believing ForwardAuth.TrustedProxies.
	Lockout *auth.Lockout
	// TLS, when set, makes Serve serve TLS with it (internal/tlsfiles builds one that reloads
	// its certificate and can require client certificates); nil serves cleartext and h2c.
	TLS *tls.Config
	// MaxRequestBytes bounds a request's body and each message in it, decompressed size
	// included (DefaultMaxRequestBytes when 0); larger ones are refused with
	// ResourceExhausted (HTTP 413 outside RPCs) before they are authenticated or decoded.
	MaxRequestBytes int64
	// HideReflection stops serving gRPC reflection (on every stack), which lists the services
	// and their schemas to anyone who reaches the port: a port whose callers need
	// credentials has little reason to describe itself to those without.
	HideReflection bool
	// Conns bounds Serve's connections: their number, the time a request may take to arrive
	// and a connection may stay idle (grpcsplit's defaults when zero). Its Logger is ignored.
	Conns grpcsplit.Config
	// Logger receives the transports' logs, with "component"="transport"; nil means
	// slog.Default().
	Logger *slog.Logger
}

// Server serves one engine. Its methods are safe for concurrent use.
type Server struct {
	engine  *checker.Engine
	callers *auth.Registry
	lock    *auth.Lockout
	fa      forwardAuth
	tls     *tls.Config
	maxBody int64
	conns   grpcsplit.Config
	reflect bool
	log     *slog.Logger
	base    *slog.Logger // the Config's, for the components Serve starts
}

var _ quotaflowv1connect.RateLimiterHandler = (*Server)(nil)

// New returns a Server for engine.
func New(engine *checker.Engine, cfg Config) *Server {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	callers := cfg.Callers
	if callers == nil {
		callers = new(auth.Registry)
	}
	maxBody := cfg.MaxRequestBytes
	if maxBody <= 0 {
		maxBody = DefaultMaxRequestBytes
	}
	lock := cfg.Lockout
	if lock == nil {
		lock = auth.NewLockout(engine, auth.LockoutConfig{TrustedProxies: cfg.ForwardAuth.TrustedProxies, Logger: log})
	}
	return &Server{engine: engine, callers: callers, lock: lock, fa: newForwardAuth(cfg.ForwardAuth), tls: cfg.TLS,
		maxBody: maxBody, conns: cfg.Conns, reflect: !cfg.HideReflection, log: log.With("component", "transport"), base: log}
}

// Handler serves everything on one port over HTTP/1.1 and h2c: the RateLimiter service over
// Connect, gRPC and gRPC-Web, Envoy's RateLimitService, gRPC reflection (unless
// Config.HideReflection) and health,
// GET /ratelimit/check for gateways, /healthz and /readyz. gRPC clients are served far more
// cheaply by grpc-go: give it RegisterGRPC's services and split the port (internal/grpcsplit).
func (s *Server) Handler() http.Handler {
	opts := s.handlerOptions()
	mux := http.NewServeMux()
	mux.Handle(quotaflowv1connect.NewRateLimiterHandler(s, opts...))
	mux.Handle(s.RLSHandler())
	mux.Handle((&healthService{s: s}).handler(opts...))
	if s.reflect {
		reflector := grpcreflect.NewStaticReflector(quotaflowv1connect.RateLimiterName, healthServiceName, RLSServiceName)
		mux.Handle(grpcreflect.NewHandlerV1(reflector, opts...))
		mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector, opts...))
	}
	mux.HandleFunc("/ratelimit/check", s.serveForwardAuth)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := s.engine.Ready(r.Context()); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready:", err)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return s.limitBodies(s.authenticate(mux))
}

// RegisterGRPC registers the services Handler serves to gRPC clients — quotaflow.v1.RateLimiter,
// Envoy's RateLimitService, grpc.health.v1.Health and reflection (unless
// Config.HideReflection) — on a grpc-go server. Serve it the h2c connections whose first
// request is gRPC (see internal/grpcsplit): grpc-go's HTTP/2 transport costs far less per call
// than net/http's, and the answers are the same.
func (s *Server) RegisterGRPC(g *grpc.Server) {
	quotaflowv1.RegisterRateLimiterServer(g, grpcRateLimiter{s: s})
	ratelimitv3.RegisterRateLimitServiceServer(g, grpcRLS{s})
	healthpb.RegisterHealthServer(g, grpcHealth{h: &healthService{s: s}})
	if s.reflect {
		reflection.Register(g)
	}
}

// Package loadgen puts load on a checker and measures what it sustains: checks per second,
// latency percentiles, and how many checks were allowed, denied or failed.
//
// A run is a closed loop (Config.Concurrency workers, each sending its next check as soon as
// the last is answered) or, with Config.Rate, an open loop: checks start on a fixed schedule
// whatever the answers, and latency counts from each check's scheduled time, so that a target
// that falls behind shows as latency instead of being hidden.
package loadgen

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"strings"
	"time"

	"github.com/quotaflow/quotaflow/internal/field"
)

// Bounds on a Config.
const (
	// MaxKeys bounds Config.Keys: the subjects' identifiers are made up front.
	MaxKeys = 1_000_000
	// MaxBatch bounds Config.Batch: what CheckRateLimits accepts.
	MaxBatch = 1000
	// MaxConcurrency bounds Config.Concurrency.
	MaxConcurrency = 10_000
)

// Protocol is how checks reach the target.
type Protocol string

// The protocols.
const (
	// ProtocolConnect sends CheckRateLimit over Connect on HTTP/1.1.
	ProtocolConnect Protocol = "connect"
	// ProtocolGRPC sends CheckRateLimit over gRPC on HTTP/2.
	ProtocolGRPC Protocol = "grpc"
	// ProtocolRLS sends Envoy's ShouldRateLimit over gRPC on HTTP/2.
	ProtocolRLS Protocol = "rls"
	// ProtocolGubernator sends gubernator's GetRateLimits over gRPC on HTTP/2, one request
	// named after Endpoint with the subject as its key and a limit no benchmark reaches: the
	// peer docs/performance.md compares with.
	ProtocolGubernator Protocol = "gubernator"
)

// Distribution is how checks pick their subject.
type Distribution string

// The distributions.
const (
	// DistributionUniform picks every subject alike.
	DistributionUniform Distribution = "uniform"
	// DistributionZipf picks subject n in proportion to 1/(n+1)^1.1.
	DistributionZipf Distribution = "zipf"
	// DistributionHot sends 90% of checks to 1% of the subjects (at least one), the rest to
	// any subject.
	DistributionHot Distribution = "hot"
)

// Dimension is what the subjects are.
type Dimension string

// The dimensions.
const (
	// DimensionUser makes the subjects user ids.
	DimensionUser Dimension = "user"
	// DimensionIP makes the subjects client addresses.
	DimensionIP Dimension = "ip"
	// DimensionAPIKey makes the subjects API keys.
	DimensionAPIKey Dimension = "apikey"
)

// Config describes a run. The zero value is usable: a closed loop of 64 workers checking
// 10000 users on /api/v1/orders of http://127.0.0.1:8080 over Connect for 10s.
type Config struct {
	// Target is the checker's base URL, http:// or https://; empty means
	// http://127.0.0.1:8080.
	Target string
	// Protocol is how checks are sent; empty means ProtocolConnect.
	Protocol Protocol
	// Concurrency is the number of workers of a closed loop, or the most checks in flight of
	// an open loop; 0 means 64. At most MaxConcurrency.
	Concurrency int
	// Rate makes the run an open loop of Rate checks per second in total; 0 means a closed
	// loop.
	Rate float64
	// Duration is how long to measure; 0 means 10s.
	Duration time.Duration
	// Warmup is how long to put load on before measuring; what it sends is not reported.
	Warmup time.Duration
	// Timeout is the deadline of each check, which counts as an error if it misses it; 0
	// means 2s.
	Timeout time.Duration
	// Keys is the number of distinct subjects; 0 means 10000. At most MaxKeys.
	Keys int
	// Distribution is how checks pick their subject; empty means DistributionUniform.
	Distribution Distribution
	// Endpoint is the path every check names; empty means /api/v1/orders.
	Endpoint string
	// Entitlement is the entitlement every check names, whose balance it burns (connect and
	// grpc); empty for none.
	Entitlement string
	// Dimension is what the subjects are; empty means DimensionUser.
	Dimension Dimension
	// KeyPrefix comes before each subject's number in its identifier. Empty is a valid
	// prefix: the identifiers are then the bare numbers.
	KeyPrefix string
	// Domain is the RLS domain of ProtocolRLS. Empty is a valid domain, and is sent as such.
	Domain string
	// Batch is the number of checks per RPC: above 1, each call is one CheckRateLimits of
	// Batch checks (ProtocolConnect and ProtocolGRPC only), whose answers all count the RPC's
	// latency; Concurrency then counts RPCs and Rate still counts checks. 0 or 1 means one
	// check per RPC. At most MaxBatch.
	Batch int
	// Progress receives a line a second while the run lasts, rewritten in place when it is a
	// terminal; nil means no progress.
	Progress io.Writer
}

// ConfigError is a Config that cannot be run, or whose target cannot be reached by any client
// (a URL that grpc-go rejects, say): a field.Error whose Field is the name of the Config field
// at fault, such as "Rate", the one error of a Config's field in quotaflow, so that a command
// names the flag of any package's field alike.
type ConfigError = field.Error

func configErrorf(name, format string, args ...any) *ConfigError {
	return field.Errorf(name, format, args...)
}

// withDefaults returns c with every zero field that has a default set to it.
func (c Config) withDefaults() Config {
	if c.Target == "" {
		c.Target = "http://127.0.0.1:8080"
	}
	if c.Protocol == "" {
		c.Protocol = ProtocolConnect
	}
	if c.Concurrency == 0 {
		c.Concurrency = 64
	}
	if c.Duration == 0 {
		c.Duration = 10 * time.Second
	}
	if c.Timeout == 0 {
		c.Timeout = 2 * time.Second
	}
	if c.Keys == 0 {
		c.Keys = 10000
	}
	if c.Distribution == "" {
		c.Distribution = DistributionUniform
	}
	if c.Endpoint == "" {
		c.Endpoint = "/api/v1/orders"
	}
	if c.Dimension == "" {
		c.Dimension = DimensionUser
	}
	return c
}

// ErrBatchProtocol is a ConfigError's cause when Batch asks for batches of a protocol that has
// none: only ProtocolConnect and ProtocolGRPC have CheckRateLimits.
var ErrBatchProtocol = errors.New("batches are CheckRateLimits calls, of protocol connect or grpc")

// Validate reports the first field of c that Run would refuse, as a *ConfigError. Unlike Run,
// it reads a zero field as given rather than as its default, and refuses the zeros that are
// outside a field's range: it is for callers that set every field, such as a command line,
// where a zero is a mistake and not "the default".
func (c Config) Validate() error { return c.validate(true) }

// validate checks a Config; strict also refuses the zero values that Run reads as defaults.
func (c *Config) validate(strict bool) error {
	switch {
	case c.Protocol != ProtocolConnect && c.Protocol != ProtocolGRPC && c.Protocol != ProtocolRLS && c.Protocol != ProtocolGubernator:
		return configErrorf("Protocol", "want connect, grpc, rls or gubernator, got %q", c.Protocol)
	case c.Concurrency < 1 || c.Concurrency > MaxConcurrency:
		return configErrorf("Concurrency", "want 1 to %d, got %d", MaxConcurrency, c.Concurrency)
	case c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0):
		return configErrorf("Rate", "want a positive number of checks per second (or 0 for a closed loop), got %v", c.Rate)
	case c.Duration <= 0:
		return configErrorf("Duration", "want more than 0, got %s", c.Duration)
	case c.Warmup < 0:
		return configErrorf("Warmup", "want 0 or more, got %s", c.Warmup)
	case c.Timeout <= 0:
		return configErrorf("Timeout", "want more than 0, got %s", c.Timeout)
	case c.Batch < 0 || c.Batch > MaxBatch || strict && c.Batch == 0:
		return configErrorf("Batch", "want 1 to %d checks per RPC, got %d", MaxBatch, c.Batch)
	case c.Batch > 1 && c.Protocol != ProtocolConnect && c.Protocol != ProtocolGRPC:
		return field.Wrap("Batch", fmt.Errorf("%w, not %s", ErrBatchProtocol, c.Protocol))
	case c.Keys < 1 || c.Keys > MaxKeys:
		return configErrorf("Keys", "want 1 to %d, got %d", MaxKeys, c.Keys)
	case !strings.HasPrefix(c.Endpoint, "/"):
		return configErrorf("Endpoint", "want a path starting with /, got %q", c.Endpoint)
	case c.Entitlement != "" && c.Protocol != ProtocolConnect && c.Protocol != ProtocolGRPC:
		return configErrorf("Entitlement", "checks name an entitlement over connect or grpc, not %s", c.Protocol)
	case c.Distribution != DistributionUniform && c.Distribution != DistributionZipf && c.Distribution != DistributionHot:
		return configErrorf("Distribution", "want uniform, zipf or hot, got %q", c.Distribution)
	}
	if _, ok := dimensions[c.Dimension]; !ok {
		return configErrorf("Dimension", "want user, ip or apikey, got %q", c.Dimension)
	}
	u, err := url.Parse(c.Target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return configErrorf("Target", "want an http:// or https:// URL, got %q", c.Target)
	}
	return nil
}

package bucket

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/quotaflow/quotaflow/internal/field"
	"github.com/redis/go-redis/v9"
)

// RedisConfig names where the buckets live: one server (URL), a Redis Cluster (Cluster, its
// seed nodes) or a Sentinel group (Sentinels and MasterName). Exactly one topology is named.
type RedisConfig struct {
	// URL is a standalone server's redis:// or rediss:// URL (credentials and database in it).
	URL string
	// Cluster lists seed nodes (host:port) of a Redis Cluster; the client learns the rest.
	Cluster []string
	// Sentinels lists the sentinels (host:port) of the group watching MasterName.
	Sentinels  []string
	MasterName string
	// Username and Password authenticate to the cluster's nodes or the group's servers (a URL
	// carries its own).
	Username, Password string
	// TLS, when set, is the TLS the servers are reached with; with a URL it replaces the one a
	// rediss:// URL implies (and needs rediss://), the server named as the URL's host unless
	// TLS names one.
	TLS *tls.Config
}

// ErrTopology is a RedisConfig that names no topology, or two, or half of one: the sentinel
// of their field errors.
var ErrTopology = errors.New("name one Redis topology: a URL, cluster seeds, or sentinels with a master name")

// dialerRetries is how many times go-redis dials a server that refused: once. Its default (5,
// 100 ms apart, per attempt of a cluster pipeline) spends a check's whole deadline on a dead
// master, while the check's other masters have answered and their charges wait to be refunded;
// the engine's probe finds the server again when it is back.
const dialerRetries = 1

// Validate reports the first field of cfg that breaks its rules, as a *field.Error naming the
// field (wrapping ErrTopology for a topology named twice, half or not at all).
func (cfg RedisConfig) Validate() error {
	topology := func(name, format string, args ...any) error {
		return &field.Error{Field: name, Msg: fmt.Sprintf(format, args...), Err: ErrTopology}
	}
	cluster, sentinels := len(cfg.Cluster) > 0, len(cfg.Sentinels) > 0
	switch {
	case cfg.MasterName != "" && !sentinels:
		return topology("MasterName", "needs Sentinels")
	case cfg.URL == "" && !cluster && !sentinels:
		return topology("URL", "required: %s", ErrTopology)
	case cfg.URL != "" && (cluster || sentinels):
		return topology("URL", "not with Cluster or Sentinels (%s)", ErrTopology)
	case cluster && sentinels:
		return topology("Cluster", "not with Sentinels (%s)", ErrTopology)
	case sentinels && cfg.MasterName == "":
		return topology("Sentinels", "needs MasterName, the name of the master its sentinels watch")
	case cfg.URL == "":
		return nil
	case cfg.Username != "":
		return field.Errorf("Username", "for Cluster or Sentinels (a URL carries its own credentials)")
	case cfg.Password != "":
		return field.Errorf("Password", "for Cluster or Sentinels (a URL carries its own credentials)")
	case !strings.HasPrefix(cfg.URL, "redis://") && !strings.HasPrefix(cfg.URL, "rediss://"):
		return field.Errorf("URL", "want a redis:// or rediss:// URL, got %q", cfg.URL)
	case cfg.TLS != nil && !strings.HasPrefix(cfg.URL, "rediss://"):
		return field.Errorf("TLS", "needs a rediss:// URL")
	}
	if _, err := redis.ParseURL(cfg.URL); err != nil {
		return field.Wrap("URL", err)
	}
	return nil
}

// NewRedisClient returns a client of the topology cfg names, configured as the engine needs:
// context deadlines enforced (without it go-redis ignores them, and a stalled Redis stalls
// every check). It does not contact Redis. Its errors are Validate's.
func NewRedisClient(cfg RedisConfig) (redis.UniversalClient, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	switch {
	case len(cfg.Cluster) > 0:
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: cfg.Cluster, Username: cfg.Username, Password: cfg.Password,
			TLSConfig: cfg.TLS, ContextTimeoutEnabled: true, DialerRetries: dialerRetries}), nil
	case len(cfg.Sentinels) > 0:
		return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: cfg.MasterName, SentinelAddrs: cfg.Sentinels,
			Username: cfg.Username, Password: cfg.Password, TLSConfig: cfg.TLS, ContextTimeoutEnabled: true,
			DialerRetries: dialerRetries}), nil
	}
	opts, err := redis.ParseURL(cfg.URL)
	if err != nil {
		return nil, err // Validate parsed it
	}
	opts.ContextTimeoutEnabled = true
	opts.DialerRetries = dialerRetries
	if cfg.TLS != nil {
		serverName := opts.TLSConfig.ServerName // the URL's host, which its certificate names
		opts.TLSConfig = cfg.TLS
		if cfg.TLS.ServerName == "" {
			opts.TLSConfig = cfg.TLS.Clone()
			opts.TLSConfig.ServerName = serverName
		}
	}
	return redis.NewClient(opts), nil
}

// ErrNoAnswer is Client's error when no server of a cluster or a Sentinel group answered.
var ErrNoAnswer = errors.New("no server answered at start")

// Client returns a client of cfg's topology (NewRedisClient). A Redis Cluster or a Sentinel
// group must answer within 5s, or Client fails with ErrNoAnswer: a wrong seed list is an
// error, not a degraded state. One server is not contacted: it may be down at start, its
// rules' fail modes deciding meanwhile.
func (cfg RedisConfig) Client(ctx context.Context) (redis.UniversalClient, error) {
	rdb, err := NewRedisClient(cfg)
	if err != nil || cfg.URL != "" {
		return rdb, err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := reachable(ctx, rdb); err != nil {
		rdb.Close()
		return nil, fmt.Errorf("%w: %w", ErrNoAnswer, err)
	}
	return rdb, nil
}

// reachable reports whether the topology answers: for a cluster, a seed node that knows the
// slot map; for a Sentinel group, a sentinel that knows the master; for one server, a PING.
func reachable(ctx context.Context, rdb redis.UniversalClient) error {
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		return c.ClusterShards(ctx).Err()
	default:
		return rdb.Ping(ctx).Err()
	}
}

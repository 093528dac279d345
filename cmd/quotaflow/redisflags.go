package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/tlsfiles"
)

// redisFlags name the Redis the buckets live in: one server, a cluster or a Sentinel group.
type redisFlags struct {
	url, cluster, sentinels, master string
	username, password              string
	tls                             bool
	files                           clientTLSFlags
	fs                              *flagSet
}

func (r *redisFlags) register(fs *flagSet) {
	r.fs = fs
	fs.StringVar(&r.url, "redis-url", "redis://127.0.0.1:6379/0", "Redis for the buckets, a redis:// or rediss:// `URL` of one server")
	fs.StringVar(&r.cluster, "redis-cluster", "", "seed nodes of a Redis Cluster for the buckets, `host:port[,host:port...]` (instead of --redis-url)")
	fs.StringVar(&r.sentinels, "redis-sentinel", "", "sentinels of a Redis Sentinel group for the buckets, `host:port[,host:port...]`, with --redis-sentinel-master (instead of --redis-url)")
	fs.StringVar(&r.master, "redis-sentinel-master", "", "`name` of the master the sentinels of --redis-sentinel watch")
	fs.StringVar(&r.username, "redis-username", "", "`user` of --redis-cluster's or --redis-sentinel's servers (a --redis-url carries its own)")
	fs.StringVar(&r.password, "redis-password", "", "`password` of --redis-cluster's or --redis-sentinel's servers")
	fs.BoolVar(&r.tls, "redis-tls", false, "reach --redis-cluster's or --redis-sentinel's servers over TLS (a --redis-url says rediss://)")
	fs.fromEnv("redis-url", "redis-cluster", "redis-sentinel", "redis-sentinel-master", "redis-username", "redis-password", "redis-tls")
	r.files.register(fs, "redis", "Redis")
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// client returns a client of the topology the flags name (bucket.RedisConfig.Client), after
// refusing flags of two topologies or of none.
func (r *redisFlags) client(ctx context.Context) (redis.UniversalClient, error) {
	cfg := bucket.RedisConfig{Cluster: splitList(r.cluster), Sentinels: splitList(r.sentinels), MasterName: r.master,
		Username: r.username, Password: r.password}
	flag := "--redis-url"
	switch {
	case r.cluster != "" && r.sentinels != "":
		return nil, usageError{errors.New("--redis-cluster and --redis-sentinel: name one topology")}
	case (r.cluster != "" || r.sentinels != "") && r.fs.isSet("redis-url"):
		return nil, usageError{errors.New("--redis-url: not with --redis-cluster or --redis-sentinel (name one topology)")}
	case r.master != "" && r.sentinels == "":
		return nil, usageError{errors.New("--redis-sentinel-master: needs --redis-sentinel")}
	case r.sentinels != "" && r.master == "":
		return nil, usageError{errors.New("--redis-sentinel: needs --redis-sentinel-master, the name of the master its sentinels watch")}
	case r.cluster != "":
		flag = "--redis-cluster"
	case r.sentinels != "":
		flag = "--redis-sentinel"
	default:
		cfg.URL = r.url
		if r.fs.isSet("redis-username") || r.fs.isSet("redis-password") || r.tls {
			return nil, usageError{errors.New("--redis-username, --redis-password, --redis-tls: for --redis-cluster or --redis-sentinel (a --redis-url carries credentials and rediss://)")}
		}
		if r.files.set() && !strings.HasPrefix(r.url, "rediss://") {
			return nil, usageError{errors.New("--redis-ca-file, --redis-cert-file, --redis-key-file: need a rediss:// --redis-url")}
		}
	}
	if r.files.set() || r.tls {
		tlsCfg, err := tlsfiles.Client(r.files.ca, r.files.cert, r.files.key, "") // --redis-tls alone: the system's roots
		if err != nil {
			return nil, usageError{fmt.Errorf("--redis-ca-file, --redis-cert-file, --redis-key-file: %w", err)}
		}
		cfg.TLS = tlsCfg
	}
	rdb, err := cfg.Client(ctx)
	switch {
	case errors.Is(err, bucket.ErrNoAnswer):
		return nil, fmt.Errorf("%s: %w", flag, err)
	case err != nil:
		return nil, usageError{fmt.Errorf("%s: %w", flag, err)}
	}
	return rdb, nil
}

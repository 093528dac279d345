package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"

	"github.com/redis/go-redis/v9"

	"github.com/quotaflow/quotaflow/internal/bucket"
	"github.com/quotaflow/quotaflow/internal/cli"
	"github.com/quotaflow/quotaflow/internal/tlsfiles"
)

// redisFlags name the Redis the buckets live in: one server, a cluster or a Sentinel group.
type redisFlags struct {
	url, master, username, password string
	cluster, sentinels              []string
	tls                             bool
	files                           clientTLSFlags
	fs                              *cli.FlagSet
}

func (r *redisFlags) register(fs *cli.FlagSet) {
	r.fs = fs
	fs.StringVar(&r.url, "redis-url", "redis://127.0.0.1:6379/0", "Redis for the buckets, a redis:// or rediss:// `URL` of one server")
	fs.ListVar(&r.cluster, "redis-cluster", "seed nodes of a Redis Cluster for the buckets, `host:port[,host:port...]` (instead of --redis-url)")
	fs.ListVar(&r.sentinels, "redis-sentinel", "sentinels of a Redis Sentinel group for the buckets, `host:port[,host:port...]`, with --redis-sentinel-master (instead of --redis-url)")
	fs.StringVar(&r.master, "redis-sentinel-master", "", "`name` of the master the sentinels of --redis-sentinel watch")
	fs.StringVar(&r.username, "redis-username", "", "`user` of --redis-cluster's or --redis-sentinel's servers (a --redis-url carries its own)")
	fs.StringVar(&r.password, "redis-password", "", "`password` of --redis-cluster's or --redis-sentinel's servers")
	fs.BoolVar(&r.tls, "redis-tls", false, "reach --redis-cluster's or --redis-sentinel's servers over TLS (a --redis-url says rediss://)")
	fs.FromEnv("redis-url", "redis-cluster", "redis-sentinel", "redis-sentinel-master", "redis-username", "redis-password", "redis-tls")
	r.files.register(fs, "redis", "Redis")
}

// redisFlagNames are the flags of bucket.RedisConfig's fields (cli.FlagError).
var redisFlagNames = map[string]string{"URL": "redis-url", "Cluster": "redis-cluster", "Sentinels": "redis-sentinel",
	"MasterName": "redis-sentinel-master", "Username": "redis-username", "Password": "redis-password", "TLS": "redis-ca-file"}

// client returns a client of the topology the flags name (bucket.RedisConfig.Client). The
// default --redis-url is the topology only when no other is named.
func (r *redisFlags) client(ctx context.Context) (redis.UniversalClient, error) {
	cfg := bucket.RedisConfig{Cluster: r.cluster, Sentinels: r.sentinels, MasterName: r.master,
		Username: r.username, Password: r.password}
	if r.fs.IsSet("redis-url") || cfg.Cluster == nil && cfg.Sentinels == nil {
		cfg.URL = r.url
	}
	if r.files.set() || r.tls {
		cfg.TLS = new(tls.Config) // the flags are validated before the files are read
	}
	names := redisFlagNames
	if !r.files.set() {
		names = maps.Clone(names)
		names["TLS"] = "redis-tls"
	}
	if err := cfg.Validate(); err != nil {
		return nil, cli.Usage(cli.FlagError(err, names))
	}
	if cfg.TLS != nil {
		tlsCfg, err := tlsfiles.Client(r.files.ca, r.files.cert, r.files.key, "") // --redis-tls alone: the system's roots
		if err != nil {
			return nil, cli.Usagef("--redis-ca-file, --redis-cert-file, --redis-key-file: %w", err)
		}
		cfg.TLS = tlsCfg
	}
	rdb, err := cfg.Client(ctx)
	if errors.Is(err, bucket.ErrNoAnswer) {
		flag := "--redis-sentinel"
		if cfg.Cluster != nil {
			flag = "--redis-cluster"
		}
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return rdb, err
}

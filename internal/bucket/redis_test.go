package bucket

import (
	"crypto/tls"
	"errors"
	"strings"
	"testing"

	"github.com/quotaflow/quotaflow/internal/field"
	"github.com/redis/go-redis/v9"
)

func TestNewRedisClient(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		cfg      RedisConfig
		wantType string // "" when an error is wanted
		wantErr  string
	}{
		{"one server", RedisConfig{URL: "redis://127.0.0.1:6379/3"}, "*redis.Client", ""},
		{"a cluster", RedisConfig{Cluster: []string{"127.0.0.1:7000", "127.0.0.1:7001"}}, "*redis.ClusterClient", ""},
		{"a sentinel group", RedisConfig{Sentinels: []string{"127.0.0.1:26379"}, MasterName: "m"}, "*redis.Client", ""},
		{"nothing", RedisConfig{}, "", "name one Redis topology"},
		{"two topologies", RedisConfig{URL: "redis://x:1", Cluster: []string{"y:2"}}, "", "name one Redis topology"},
		{"sentinels without a master", RedisConfig{Sentinels: []string{"x:1"}}, "", "needs MasterName"},
		{"a master without sentinels", RedisConfig{URL: "redis://x:1", MasterName: "m"}, "", "MasterName: needs Sentinels"},
		{"a URL and sentinels", RedisConfig{URL: "redis://x:1", Sentinels: []string{"y:2"}, MasterName: "m"}, "", "URL: not with Cluster or Sentinels"},
		{"credentials with a URL", RedisConfig{URL: "redis://x:1", Password: "p"}, "", "Password: for Cluster or Sentinels"},
		{"not a redis URL", RedisConfig{URL: "http://x:1"}, "", "want a redis:// or rediss:// URL"},
		{"TLS with redis://", RedisConfig{URL: "redis://x:1", TLS: &tls.Config{}}, "", "TLS: needs a rediss:// URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rdb, err := NewRedisClient(tt.cfg)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("NewRedisClient = %v, want an error with %q", err, tt.wantErr)
				}
				if fe := (*field.Error)(nil); !errors.As(err, &fe) {
					t.Errorf("error %v is not a *field.Error", err)
				}
				if strings.Contains(tt.wantErr, "topology") && !errors.Is(err, ErrTopology) {
					t.Errorf("error %v is not ErrTopology", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer rdb.Close()
			switch c := rdb.(type) {
			case *redis.ClusterClient:
				if tt.wantType != "*redis.ClusterClient" || !c.Options().ContextTimeoutEnabled {
					t.Errorf("got a cluster client (deadlines %v), want %s with deadlines", c.Options().ContextTimeoutEnabled, tt.wantType)
				}
			case *redis.Client:
				if tt.wantType != "*redis.Client" || !c.Options().ContextTimeoutEnabled {
					t.Errorf("got a client (deadlines %v), want %s with deadlines", c.Options().ContextTimeoutEnabled, tt.wantType)
				}
			}
		})
	}
}

package main

import (
	"context"
	"strings"
	"testing"
)

// TestMigrateCluster: --clickhouse-cluster (or its variable) is checked as a usage error,
// offered by migrate and the aggregator, and refused by a server whose remote_servers lack the
// cluster. schema's TestReplicated migrates a real cluster.
func TestMigrateCluster(t *testing.T) {
	t.Parallel()
	dsn := chSrv.DSN("migrate_cluster_test")
	for _, tt := range []struct {
		name     string
		args     []string
		env      map[string]string
		wantCode int
		want     string
	}{
		{"bad name", []string{"migrate", "--clickhouse-dsn", dsn, "--clickhouse-cluster", "qf; DROP"}, nil, 2, `--clickhouse-cluster: schema layout: cluster "qf; DROP"`},
		{"bad name from the environment", []string{"migrate", "--clickhouse-dsn", dsn}, map[string]string{"QUOTAFLOW_CLICKHOUSE_CLUSTER": "a b"}, 2, `cluster "a b"`},
		{"unknown cluster", []string{"migrate", "--clickhouse-dsn", dsn}, map[string]string{"QUOTAFLOW_CLICKHOUSE_CLUSTER": "qf"}, 1, `cluster "qf" is not in the server's remote_servers`},
		{"migrate help", []string{"help", "migrate"}, nil, 0, "QUOTAFLOW_CLICKHOUSE_CLUSTER"},
		{"aggregator help", []string{"help", "aggregator"}, nil, 0, "QUOTAFLOW_CLICKHOUSE_CLUSTER"},
		{"single server", []string{"migrate", "--clickhouse-dsn", dsn}, nil, 0, "database migrate_cluster_test: applied"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			stdout, stderr, code := runCmd(context.Background(), tt.args, tt.env)
			if code != tt.wantCode || !strings.Contains(stdout+stderr, tt.want) {
				t.Errorf("quotaflow %v: exit %d, output %q; want exit %d and %q", tt.args, code, stdout+stderr, tt.wantCode, tt.want)
			}
		})
	}
}

#!/usr/bin/env bash
# Writes the configuration of a loopback-only ClickHouse into DIR (config.xml, users.xml): its
# data, logs and temporary files under DIR, the native protocol on TCP_PORT and HTTP on
# HTTP_PORT, UTC, one passwordless default user reachable from loopback only. make dev
# (deploy/dev/run.sh) and deploy/bench/backtest.sh start their servers with it.
# Usage: deploy/dev/clickhouse-config.sh DIR TCP_PORT HTTP_PORT
set -euo pipefail
dir="$1" tcp="$2" http="$3"
cat > "$dir/config.xml" <<XML
<?xml version="1.0"?>
<yandex>
    <logger><level>warning</level><log>$dir/server.log</log><errorlog>$dir/error.log</errorlog><console>0</console></logger>
    <listen_host>127.0.0.1</listen_host>
    <tcp_port>$tcp</tcp_port>
    <http_port>$http</http_port>
    <path>$dir/data/</path>
    <tmp_path>$dir/tmp/</tmp_path>
    <user_files_path>$dir/user_files/</user_files_path>
    <format_schema_path>$dir/format_schemas/</format_schema_path>
    <mark_cache_size>67108864</mark_cache_size>
    <max_concurrent_queries>100</max_concurrent_queries>
    <users_config>users.xml</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <timezone>UTC</timezone>
    <mlock_executable>false</mlock_executable>
</yandex>
XML
cat > "$dir/users.xml" <<'XML'
<?xml version="1.0"?>
<yandex>
    <profiles><default></default></profiles>
    <users><default><password></password><networks><ip>127.0.0.1</ip><ip>::1</ip></networks><profile>default</profile><quota>default</quota></default></users>
    <quotas><default></default></quotas>
</yandex>
XML

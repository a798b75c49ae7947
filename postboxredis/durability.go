package postboxredis

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// CheckDurability reads the persistence, memory and replication settings
// of the server client reaches (one node of a cluster) and returns, in
// words, each way an entry Redis acknowledged, and the relay marked
// published, can still be lost: no append-only file, an append-only file
// not fsynced on every write, an eviction policy that may evict streams,
// no replica. An empty list means none was found. It returns an error
// only when the server would not say (CONFIG is disabled or not allowed
// on many managed services); the package documentation's durability
// notes apply either way.
func CheckDurability(ctx context.Context, client redis.UniversalClient) ([]string, error) {
	if client == nil {
		return nil, errors.New("postboxredis: CheckDurability needs a Redis client")
	}
	cfg, err := client.ConfigGet(ctx, "*").Result()
	if err != nil {
		return nil, fmt.Errorf("postboxredis: check durability: CONFIG GET: %w", err)
	}
	var warnings []string
	switch {
	case cfg["appendonly"] != "yes" && cfg["save"] == "":
		warnings = append(warnings, "appendonly is off and no RDB snapshots are configured: a restart loses every entry")
	case cfg["appendonly"] != "yes":
		warnings = append(warnings, "appendonly is off: a restart loses every entry written since the last RDB snapshot")
	case cfg["appendfsync"] == "everysec":
		warnings = append(warnings, "appendfsync is everysec: a machine crash can lose about the last second of acknowledged entries; \"always\" fsyncs every write before its reply")
	case cfg["appendfsync"] != "always":
		warnings = append(warnings, fmt.Sprintf("appendfsync is %s: the operating system decides when acknowledged entries reach the disk; \"always\" fsyncs every write before its reply", cfg["appendfsync"]))
	}
	if p := cfg["maxmemory-policy"]; p != "" && p != "noeviction" {
		warnings = append(warnings, fmt.Sprintf("maxmemory-policy is %s: at maxmemory Redis may evict streams and dedupe keys; with noeviction it refuses writes instead (OOM, an infrastructure failure)", p))
	}
	info, err := client.Info(ctx, "replication").Result()
	if err == nil && strings.Contains(info, "role:master") && strings.Contains(info, "connected_slaves:0\r") {
		warnings = append(warnings, "no replica is connected: losing this machine loses every entry; replication is asynchronous unless Config.MinReplicas makes each publish WAIT for replicas")
	}
	return warnings, nil
}

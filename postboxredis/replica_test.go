package postboxredis_test

import (
	"context"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/postbox-go/postbox/postboxredis"
)

// startReplica starts a redis-server of the test's own, keeping nothing
// on disk, as a replica of the machine's Redis, and waits until it is in
// sync. It is stopped when t ends.
func startReplica(t *testing.T, master *redis.Client) *redis.Client {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not installed")
	}
	ctx := context.Background()
	// A diskless sync waits 5s by default for more replicas to join.
	if old, err := master.ConfigGet(ctx, "repl-diskless-sync-delay").Result(); err == nil {
		if err := master.ConfigSet(ctx, "repl-diskless-sync-delay", "0").Err(); err == nil {
			t.Cleanup(func() {
				if v, ok := old["repl-diskless-sync-delay"]; ok {
					_ = master.ConfigSet(context.Background(), "repl-diskless-sync-delay", v).Err()
				}
			})
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	host, mport, _ := net.SplitHostPort(redisAddr())
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", t.TempDir(), "--replicaof", host, mport, "--repl-diskless-load", "on-empty-db")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	replica := redis.NewClient(&redis.Options{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), MaxRetries: -1})
	t.Cleanup(func() { _ = replica.Close() })
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := replica.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return replica
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica did not sync within 20s (%v): %s", err, info)
		}
		time.Sleep(50 * time.Millisecond) // polling the replica: no event to wait on
	}
}

// TestReplica publishes with MinReplicas against a real replica: the
// publish succeeds once the replica has the entry. Publishing to the
// replica itself fails with READONLY, an infrastructure failure.
func TestReplica(t *testing.T) {
	if testing.Short() {
		t.Skip("replica test skipped in -short mode")
	}
	master := client(t, nil)
	replica := startReplica(t, master)
	ctx := context.Background()
	name := stream(t, master, "g")

	p := publisher(t, master, &postboxredis.Config{Stream: name, MinReplicas: 1, ReplicaTimeout: 2 * time.Second})
	env := envelope("t", "", "replicated")
	if err := publish(t, p, ctx, env); err != nil {
		t.Fatalf("publish with a replica attached: %v", err)
	}
	msgs, err := replica.XRange(ctx, name, "-", "+").Result()
	if err != nil || len(msgs) != 1 || msgs[0].Values["id"] != env.ID {
		t.Fatalf("the replica holds %v (%v), want the entry", msgs, err)
	}

	onReplica := publisher(t, replica, &postboxredis.Config{Stream: name})
	err = publish(t, onReplica, ctx, envelope("t", "", "x"))
	mustInfra(t, err, nil)
	if !redis.IsReadOnlyError(err) {
		t.Fatalf("got %v, want READONLY", err)
	}
}

package postboxkafka_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/postbox-go/postbox/postboxkafka"
)

func TestEnsureTopic(t *testing.T) {
	c := cluster(t)
	cl := client(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topic := uniqueName("ensure")
	durable := map[string]string{"min.insync.replicas": "2", "message.timestamp.type": "CreateTime"}
	if err := postboxkafka.EnsureTopic(ctx, cl, topic, 6, 3, durable); err != nil {
		t.Fatal(err)
	}
	info := c.TopicInfo(topic)
	if info == nil || info.NumReplicas != 3 || len(c.PartitionInfos(topic)) != 6 || *info.Configs["min.insync.replicas"] != "2" {
		t.Fatalf("created %+v", info)
	}
	// Again, as every replica does at start-up: no change, no error; new
	// configs are set on the existing topic.
	if err := postboxkafka.EnsureTopic(ctx, cl, topic, 6, 3, map[string]string{"retention.ms": "86400000"}); err != nil {
		t.Fatal(err)
	}
	if v := c.TopicInfo(topic).Configs["retention.ms"]; v == nil || *v != "86400000" {
		t.Fatalf("retention.ms not set on the existing topic: %v", v)
	}
	if err := postboxkafka.EnsureTopic(ctx, cl, topic, -1, -1, nil); err != nil {
		t.Fatalf("broker defaults against an existing topic: %v", err)
	}
	if err := postboxkafka.EnsureTopic(ctx, cl, topic, 12, 3, nil); !errors.Is(err, postboxkafka.ErrTopicMismatch) {
		t.Fatalf("other partition count: %v", err)
	}
	if err := postboxkafka.EnsureTopic(ctx, cl, topic, 6, 1, nil); !errors.Is(err, postboxkafka.ErrTopicMismatch) {
		t.Fatalf("other replication factor: %v", err)
	}
	if len(c.PartitionInfos(topic)) != 6 {
		t.Fatal("a mismatch changed the topic")
	}
	for name, call := range map[string]func() error{
		"invalid name":       func() error { return postboxkafka.EnsureTopic(ctx, cl, "a:b", 1, 1, nil) },
		"zero partitions":    func() error { return postboxkafka.EnsureTopic(ctx, cl, "ok", 0, 1, nil) },
		"zero replicas":      func() error { return postboxkafka.EnsureTopic(ctx, cl, "ok", 1, 0, nil) },
		"too many replicas":  func() error { return postboxkafka.EnsureTopic(ctx, cl, "ok", 1, 5, nil) },
		"nil client":         func() error { return postboxkafka.EnsureTopic(ctx, nil, "ok", 1, 1, nil) },
		"check missing":      func() error { _, err := postboxkafka.CheckTopic(ctx, cl, "nope"); return err },
		"check nil client":   func() error { _, err := postboxkafka.CheckTopic(ctx, nil, topic); return err },
		"internal topic":     func() error { return postboxkafka.EnsureTopic(ctx, cl, "__x", 1, 1, nil) },
		"name over 249 long": func() error { return postboxkafka.EnsureTopic(ctx, cl, strings.Repeat("x", 250), 1, 1, nil) },
	} {
		if err := call(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := postboxkafka.CheckTopic(ctx, cl, "nope"); !errors.Is(err, postboxkafka.ErrNoTopic) {
		t.Fatalf("CheckTopic on a missing topic: %v", err)
	}
}

// TestCheckTopic reports the settings that weaken an acknowledgement, and
// none for a topic set up as the package documentation says.
func TestCheckTopic(t *testing.T) {
	c := cluster(t)
	cl := client(t, c, kgo.ProducerBatchMaxBytes(1<<20))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	good := uniqueName("good")
	if err := postboxkafka.EnsureTopic(ctx, cl, good, 3, 3, map[string]string{"min.insync.replicas": "2"}); err != nil {
		t.Fatal(err)
	}
	rep, err := postboxkafka.CheckTopic(ctx, cl, good)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Problems) != 0 || rep.Partitions != 3 || rep.ReplicationFactor != 3 || rep.Configs["min.insync.replicas"] != "2" {
		t.Fatalf("report %+v", rep)
	}

	weak := uniqueName("weak")
	if err := postboxkafka.EnsureTopic(ctx, cl, weak, 1, 1, map[string]string{
		"cleanup.policy": "compact", "max.message.bytes": "1000",
	}); err != nil {
		t.Fatal(err)
	}
	rep, err = postboxkafka.CheckTopic(ctx, cl, weak)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"replication factor 1", "min.insync.replicas 1", "cleanup.policy", "max.message.bytes 1000"}
	if len(rep.Problems) != len(want) {
		t.Fatalf("problems %q, want ones starting %q", rep.Problems, want)
	}
	for i, w := range want {
		if !strings.HasPrefix(rep.Problems[i], w) {
			t.Fatalf("problem %d %q, want one starting %q", i, rep.Problems[i], w)
		}
	}

	every := uniqueName("isr")
	if err := postboxkafka.EnsureTopic(ctx, cl, every, 1, 3, map[string]string{"min.insync.replicas": "3"}); err != nil {
		t.Fatal(err)
	}
	rep, err = postboxkafka.CheckTopic(ctx, cl, every)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Problems) != 1 || !strings.Contains(rep.Problems[0], "losing one replica stops every write") {
		t.Fatalf("problems %q", rep.Problems)
	}
}

package postboxkafka_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/postboxkafka"
)

// TestBrokerFaults injects the broker's answers to produce requests with
// kfake and checks how each publish counts for the relay.
func TestBrokerFaults(t *testing.T) {
	cases := []struct {
		err     *kerr.Error
		count   int  // requests to fault; -1: all
		message bool // else infrastructure; nil outcome when ok
		ok      bool
	}{
		{kerr.MessageTooLarge, 1, true, false},
		{kerr.RecordListTooLarge, 1, true, false},
		{kerr.InvalidRecord, 1, true, false},
		{kerr.InvalidTopicException, 1, true, false},
		{kerr.TopicAuthorizationFailed, 1, true, false},
		{kerr.PolicyViolation, 1, true, false},
		// Retriable answers: the client retries them; while they last,
		// the publish times out as an infrastructure failure.
		{kerr.NotEnoughReplicas, -1, false, false},
		{kerr.NotEnoughReplicasAfterAppend, -1, false, false},
		{kerr.NotLeaderForPartition, -1, false, false},
		{kerr.RequestTimedOut, -1, false, false},
		{kerr.NotEnoughReplicas, 2, false, true}, // and once they pass, it succeeds
		{kerr.ClusterAuthorizationFailed, 1, false, false},
		{kerr.InvalidTimestamp, 1, false, false},
		// The topic exists, but the broker keeps saying otherwise: the
		// lookup finds it, so this is not the message's fault.
		{kerr.UnknownTopicOrPartition, -1, false, false},
	}
	for _, tc := range cases {
		name := fmt.Sprintf("%s/%d", tc.err.Message, tc.count)
		t.Run(name, func(t *testing.T) {
			c := cluster(t)
			// Retriable answers make the client refresh metadata before it
			// retries; by default it refreshes at most every 5s.
			cl := client(t, c, kgo.MetadataMinAge(50*time.Millisecond))
			topic := uniqueName("fault")
			ensure(t, cl, topic, 1, nil)
			pub := publisher(t, cl, &postboxkafka.Config{PublishTimeout: time.Second})
			h := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: tc.err, Count: tc.count})
			defer h.Remove()
			err := publish(t, context.Background(), pub, envelope(topic, "k", "x"))
			switch {
			case tc.ok:
				if err != nil {
					t.Fatalf("publish after %d faults: %v", tc.count, err)
				}
				if h.Hits() != tc.count {
					t.Fatalf("%d faults answered, want %d", h.Hits(), tc.count)
				}
				return
			case err == nil:
				t.Fatal("publish succeeded through the fault")
			case postbox.IsMessageError(err) != tc.message:
				t.Fatalf("%v: message failure %v, want %v", err, postbox.IsMessageError(err), tc.message)
			case h.Hits() == 0:
				t.Fatal("the fault answered no request")
			}
			if tc.message && !errors.Is(err, tc.err) {
				t.Fatalf("%v does not wrap %v", err, tc.err)
			}
			t.Logf("%v", err)
		})
	}
}

// TestTooLarge: a message over the topic's max.message.bytes is refused by
// the broker, and one over the client's ProducerBatchMaxBytes by the
// client before it is sent; both are message failures.
func TestTooLarge(t *testing.T) {
	c := cluster(t)
	cl := client(t, c, kgo.ProducerBatchMaxBytes(64<<10))
	small := uniqueName("small")
	ensure(t, cl, small, 1, map[string]string{"max.message.bytes": "2000"})
	pub := publisher(t, cl, nil)

	// Random bytes, which the client's batch compression cannot shrink
	// under the limit.
	big := make([]byte, 5000)
	_, _ = rand.Read(big)
	err := publish(t, context.Background(), pub, envelope(small, "k", string(big)))
	if !postbox.IsPermanent(err) || !errors.Is(err, kerr.MessageTooLarge) {
		t.Fatalf("over max.message.bytes: %v, want a permanent failure", err)
	}
	err = publish(t, context.Background(), pub, envelope(small, "k", strings.Repeat("x", 100<<10)))
	if !postbox.IsPermanent(err) || !errors.Is(err, kerr.MessageTooLarge) {
		t.Fatalf("over ProducerBatchMaxBytes: %v, want a permanent failure", err)
	}
	if err := publish(t, context.Background(), pub, envelope(small, "k", "fits")); err != nil {
		t.Fatalf("a small message after the refused ones: %v", err)
	}

	// Over ProducerBatchMaxBytes is refused when written; over the topic's
	// max.message.bytes, which the writer cannot know, is dead on its
	// first publish.
	_, prefix, d := pubtest.Tables(t)
	client, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Publisher: pub, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var ve *postbox.ValidationError
	ctx := context.Background()
	if err := client.Write(ctx, postbox.Message{Topic: small, Payload: make([]byte, 100<<10)}); !errors.As(err, &ve) {
		t.Fatalf("write over ProducerBatchMaxBytes: %v, want a *ValidationError", err)
	}
	if err := client.Write(ctx, postbox.Message{Topic: small, Key: "k", Payload: big}); err != nil {
		t.Fatal(err)
	}
	res, err := client.Drain(ctx)
	if err != nil || res.Dead != 1 || res.Failed != 1 {
		t.Fatalf("Drain = %+v, %v; want the message dead on its first attempt", res, err)
	}
}

// TestMissingTopic: a topic that does not exist fails as a message failure
// wrapping ErrNoTopic, and is not created by the attempt.
func TestMissingTopic(t *testing.T) {
	c := cluster(t)
	pub := publisher(t, client(t, c), nil)
	topic := uniqueName("missing")
	start := time.Now()
	err := publish(t, context.Background(), pub, envelope(topic, "", "x"))
	if !postbox.IsMessageError(err) || !errors.Is(err, postboxkafka.ErrNoTopic) || !strings.Contains(err.Error(), topic) {
		t.Fatalf("publish to a missing topic: %v", err)
	}
	t.Logf("confirmed missing after %s: %v", time.Since(start).Round(time.Millisecond), err)
	if c.TopicInfo(topic) != nil {
		t.Fatal("publishing created the topic")
	}
}

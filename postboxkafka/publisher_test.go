package postboxkafka_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/postboxkafka"
)

// TestRecordOnTheWire reads back what a Publisher produced with a plain
// client: the key, the value, the CloudEvents headers in binary mode
// (ce_*), content-type, user headers, and a timestamp that is the publish
// time even for a message written long ago.
func TestRecordOnTheWire(t *testing.T) {
	c := cluster(t)
	topic := uniqueName("wire")
	ensure(t, client(t, c), topic, 3, nil)
	pub := publisher(t, client(t, c), nil)
	ctx := context.Background()

	keyed := envelope(topic, "order-7", `{"n":1}`)
	keyed.Headers[postbox.HeaderContentType] = "application/json"
	keyed.Headers[postbox.HeaderSubject] = "order-7"
	keyed.Headers["tenant"] = "acme"
	keyed.Headers["traceparent"] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	keyed.CreatedAt = time.Now().Add(-72 * time.Hour) // a backlog relayed three days late
	keyless := envelope(topic, "", "")
	keyless.Payload = nil
	before := time.Now().Truncate(time.Millisecond)
	for _, env := range []*postbox.Envelope{keyed, keyless} {
		if err := publish(t, ctx, pub, env); err != nil {
			t.Fatal(err)
		}
	}
	after := time.Now()

	recs := consumeAll(t, c, topic, 2)
	byID := map[string]*kgo.Record{}
	for _, r := range recs {
		id, _ := header(r, postboxkafka.HeaderID)
		byID[id] = r
	}
	r := byID[keyed.ID]
	if r == nil {
		t.Fatalf("no record with ce_id %s among %d", keyed.ID, len(recs))
	}
	if string(r.Key) != "order-7" || string(r.Value) != `{"n":1}` {
		t.Fatalf("key %q value %q", r.Key, r.Value)
	}
	if r.Timestamp.Before(before) || r.Timestamp.After(after) {
		t.Fatalf("record timestamp %s, want the publish time (between %s and %s), not created_at %s", r.Timestamp, before, after, keyed.CreatedAt)
	}
	want := map[string]string{
		"ce_id": keyed.ID, "ce_specversion": "1.0", "ce_type": topic, "ce_source": "test",
		"ce_time": keyed.Headers[postbox.HeaderTime], "ce_subject": "order-7", "ce_partitionkey": "order-7",
		"content-type": "application/json", "tenant": "acme", "traceparent": keyed.Headers["traceparent"],
	}
	if len(r.Headers) != len(want) {
		t.Fatalf("headers %v, want %v", r.Headers, want)
	}
	for k, v := range want {
		if got, ok := header(r, k); !ok || got != v {
			t.Fatalf("header %s = %q (present %v), want %q; all: %v", k, got, ok, v, r.Headers)
		}
	}
	r = byID[keyless.ID]
	if r == nil {
		t.Fatal("keyless record missing")
	}
	if r.Key != nil {
		t.Fatalf("keyless message has key %q, want none (null), so the partitioner spreads them", r.Key)
	}
	if r.Value == nil || len(r.Value) != 0 {
		t.Fatalf("empty payload travels as %v, want an empty value, never a null (a tombstone on a compacted topic)", r.Value)
	}
	if _, ok := header(r, "ce_partitionkey"); ok {
		t.Fatal("keyless message carries ce_partitionkey")
	}
}

// TestSameKeySamePartition publishes several messages for each of many
// keys and checks that each key's messages are in one partition, in
// publish order, and that the keys use more than one partition.
func TestSameKeySamePartition(t *testing.T) {
	c := cluster(t)
	topic := uniqueName("keys")
	ensure(t, client(t, c), topic, 6, nil)
	pub := publisher(t, client(t, c), nil)
	const keys, per = 20, 5
	for i := range per {
		for k := range keys {
			if err := publish(t, context.Background(), pub, envelope(topic, fmt.Sprintf("key-%d", k), fmt.Sprint(i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	recs := consumeAll(t, c, topic, keys*per)
	partition := map[string]int32{}
	next := map[string]int{}
	used := map[int32]bool{}
	// Records arrive in offset order within each partition.
	for _, r := range recs {
		k := string(r.Key)
		if p, ok := partition[k]; ok && p != r.Partition {
			t.Fatalf("key %s in partitions %d and %d", k, p, r.Partition)
		}
		partition[k] = r.Partition
		used[r.Partition] = true
		if string(r.Value) != fmt.Sprint(next[k]) {
			t.Fatalf("key %s: message %s at offset %d, want %d", k, r.Value, r.Offset, next[k])
		}
		next[k]++
	}
	if len(used) < 2 {
		t.Fatalf("%d keys all in one partition", keys)
	}
}

// TestRetentionKeepsRelayedBacklog shows why the record timestamp is the
// publish time: a message written 48 hours ago and relayed now survives a
// topic retention of one hour, while a record stamped with its old
// creation time is deleted by the same retention on arrival.
func TestRetentionKeepsRelayedBacklog(t *testing.T) {
	c := cluster(t)
	admin := client(t, c)
	retention := map[string]string{"retention.ms": fmt.Sprint(time.Hour.Milliseconds())}
	relayed, stamped := uniqueName("relayed"), uniqueName("stamped")
	ensure(t, admin, relayed, 1, retention)
	ensure(t, admin, stamped, 1, retention)
	created := time.Now().Add(-48 * time.Hour)

	env := envelope(relayed, "k", "old")
	env.CreatedAt = created
	if err := publish(t, context.Background(), publisher(t, client(t, c), nil), env); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := admin.ProduceSync(ctx, &kgo.Record{Topic: stamped, Value: []byte("old"), Timestamp: created}).FirstErr(); err != nil {
		t.Fatal(err)
	}

	c.ApplyRetention()
	if got := c.PartitionInfo(stamped, 0).LogStartOffset; got != 1 {
		t.Fatalf("the control record stamped 48h ago was not deleted by a 1h retention (log start %d); the test shows nothing", got)
	}
	if got := c.PartitionInfo(relayed, 0).LogStartOffset; got != 0 {
		t.Fatalf("the relayed message was deleted by retention on arrival (log start %d)", got)
	}
	if recs := consumeAll(t, c, relayed, 1); string(recs[0].Value) != "old" {
		t.Fatalf("read %q", recs[0].Value)
	}
}

// TestNewRefusesUnsafeClients lists every client option that would make
// an acknowledgement worth less than postbox promises, or create or
// reroute topics behind the Publisher.
func TestNewRefusesUnsafeClients(t *testing.T) {
	c := cluster(t)
	cases := []struct {
		name  string
		opts  []kgo.Opt
		field []string
	}{
		{"leader acks", []kgo.Opt{kgo.RequiredAcks(kgo.LeaderAck()), kgo.DisableIdempotentWrite()}, []string{"client.RequiredAcks", "client.DisableIdempotentWrite"}},
		{"no acks", []kgo.Opt{kgo.RequiredAcks(kgo.NoAck()), kgo.DisableIdempotentWrite()}, []string{"client.RequiredAcks", "client.DisableIdempotentWrite"}},
		{"not idempotent", []kgo.Opt{kgo.DisableIdempotentWrite()}, []string{"client.DisableIdempotentWrite"}},
		{"cancellable", []kgo.Opt{kgo.AllowIdempotentProduceCancellation()}, []string{"client.AllowIdempotentProduceCancellation"}},
		{"auto-create", []kgo.Opt{kgo.AllowAutoTopicCreation()}, []string{"client.AllowAutoTopicCreation"}},
		{"transactional", []kgo.Opt{kgo.TransactionalID("tx")}, []string{"client.TransactionalID"}},
		{"manual flush", []kgo.Opt{kgo.ManualFlushing()}, []string{"client.ManualFlushing"}},
		{"one topic", []kgo.Opt{kgo.DefaultProduceTopic("x"), kgo.DefaultProduceTopicAlways()}, []string{"client.DefaultProduceTopicAlways"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := postboxkafka.New(client(t, c, tc.opts...), &postboxkafka.Config{PublishTimeout: time.Nanosecond})
			var ce *postbox.ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("New: %v, want a *postbox.ConfigError", err)
			}
			fields := []string{"PublishTimeout"} // every problem at once, the Config's included
			fields = append(fields, tc.field...)
			if len(ce.Problems) != len(fields) {
				t.Fatalf("problems %v, want fields %v", err, fields)
			}
			for i, f := range fields {
				if ce.Problems[i].Field != f {
					t.Fatalf("problem %d is %q, want %q: %v", i, ce.Problems[i].Field, f, err)
				}
			}
		})
	}
	if _, err := postboxkafka.New(client(t, c), nil); err != nil {
		t.Fatalf("a client with franz-go's defaults (acks=all, idempotent) refused: %v", err)
	}
	if _, err := postboxkafka.New(nil, nil); err == nil {
		t.Fatal("New accepted a nil client")
	}
}

// TestTopicMapping maps topics with TopicPrefix and Topic, and fails a
// topic Kafka cannot carry as a message failure before it is produced.
func TestTopicMapping(t *testing.T) {
	c := cluster(t)
	cl := client(t, c)
	ensure(t, cl, "events.orders.created", 1, nil)
	ensure(t, cl, "orders.v1.created", 1, nil)

	pub := publisher(t, cl, &postboxkafka.Config{TopicPrefix: "events."})
	if got, err := pub.KafkaTopic("orders.created"); err != nil || got != "events.orders.created" {
		t.Fatalf("KafkaTopic: %q, %v", got, err)
	}
	if err := publish(t, context.Background(), pub, envelope("orders.created", "", "x")); err != nil {
		t.Fatal(err)
	}
	err := publish(t, context.Background(), pub, envelope("orders:v1:created", "", "x"))
	if !postbox.IsMessageError(err) || !errors.Is(err, postboxkafka.ErrInvalidTopic) || !strings.Contains(err.Error(), `":"`) {
		t.Fatalf("a topic with ':' published without a mapping: %v, want a message failure wrapping ErrInvalidTopic that names ':'", err)
	}

	mapped := publisher(t, cl, &postboxkafka.Config{Topic: func(topic string) string { return strings.ReplaceAll(topic, ":", ".") }})
	if err := publish(t, context.Background(), mapped, envelope("orders:v1:created", "", "x")); err != nil {
		t.Fatal(err)
	}
	if recs := consumeAll(t, c, "orders.v1.created", 1); string(recs[0].Value) != "x" {
		t.Fatalf("read %q", recs[0].Value)
	}
	internal := publisher(t, cl, &postboxkafka.Config{Topic: func(string) string { return "__consumer_offsets" }})
	if err := publish(t, context.Background(), internal, envelope("x", "", "x")); !errors.Is(err, postboxkafka.ErrInvalidTopic) || !postbox.IsMessageError(err) {
		t.Fatalf("publish to an internal topic: %v", err)
	}
}

func TestConfigValidation(t *testing.T) {
	cfg := &postboxkafka.Config{
		TopicPrefix:    "bad prefix",
		Topic:          func(s string) string { return s },
		PublishTimeout: time.Hour,
	}
	err := cfg.WithDefaults().Validate()
	var ce *postbox.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("Validate: %v", err)
	}
	got := []string{}
	for _, p := range ce.Problems {
		got = append(got, p.Field)
	}
	if strings.Join(got, ",") != "TopicPrefix,TopicPrefix,PublishTimeout" {
		t.Fatalf("fields %v: %v", got, err)
	}
	if err := (*postboxkafka.Config)(nil).WithDefaults().Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	d := (*postboxkafka.Config)(nil).WithDefaults()
	if d.PublishTimeout != postboxkafka.DefaultPublishTimeout || d.Logger == nil {
		t.Fatalf("defaults %+v", d)
	}

	_, err = postboxkafka.NewSubscriber("", []string{"ok", "no:colon", "ok"}, &postboxkafka.SubscriberConfig{
		MaxInFlight: -1, PartitionBuffer: -1, CommitInterval: time.Hour, CommitTimeout: time.Millisecond, MaxRetryHold: -1,
	})
	if !errors.As(err, &ce) {
		t.Fatalf("NewSubscriber: %v", err)
	}
	got = got[:0]
	for _, p := range ce.Problems {
		got = append(got, p.Field)
	}
	want := "MaxInFlight,PartitionBuffer,CommitInterval,CommitTimeout,MaxRetryHold,group,topics[1],topics[2]"
	if strings.Join(got, ",") != want {
		t.Fatalf("fields %v, want %s: %v", got, want, err)
	}
	if _, err := postboxkafka.NewSubscriber("g", nil, nil); err == nil {
		t.Fatal("a subscriber without topics accepted")
	}
	s, err := postboxkafka.NewSubscriber("g", []string{"t"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sc := s.Config(); sc.MaxInFlight != postboxkafka.DefaultMaxInFlight || sc.PartitionBuffer != postboxkafka.DefaultPartitionBuffer ||
		sc.CommitInterval != postboxkafka.DefaultCommitInterval || sc.MaxRetryHold != postboxkafka.DefaultMaxRetryHold {
		t.Fatalf("defaults %+v", sc)
	}
}

func TestValidateTopicName(t *testing.T) {
	for _, ok := range []string{"a", "orders.created", "Orders_v1-x", strings.Repeat("x", 249), "_single", "a..b"} {
		if err := postboxkafka.ValidateTopicName(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", strings.Repeat("x", 250), "a:b", "a b", "a/b", "é", "__consumer_offsets", "__x"} {
		if err := postboxkafka.ValidateTopicName(bad); !errors.Is(err, postboxkafka.ErrInvalidTopic) {
			t.Errorf("%q: %v, want ErrInvalidTopic", bad, err)
		}
	}
}

// TestInvalidEnvelopes fails, as message failures and without producing,
// envelopes that cannot travel.
func TestInvalidEnvelopes(t *testing.T) {
	c := cluster(t)
	cl := client(t, c)
	topic := uniqueName("invalid")
	ensure(t, cl, topic, 1, nil)
	pub := publisher(t, cl, nil)
	noID := envelope(topic, "", "x")
	noID.ID = ""
	ceUnderscore := envelope(topic, "", "x")
	ceUnderscore.Headers["CE_Custom"] = "v"
	badValue := envelope(topic, "", "x")
	badValue.Headers["h"] = "\xff"
	for name, tc := range map[string]struct {
		env  *postbox.Envelope
		want error
	}{
		"no id":             {noID, postboxkafka.ErrNoID},
		"ce_ user header":   {ceUnderscore, postboxkafka.ErrInvalidHeader},
		"header not UTF-8":  {badValue, postboxkafka.ErrInvalidHeader},
		"topic not allowed": {envelope("a:b", "", "x"), postboxkafka.ErrInvalidTopic},
	} {
		err := publish(t, context.Background(), pub, tc.env)
		if !postbox.IsMessageError(err) || !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want a message failure wrapping %v", name, err, tc.want)
		}
	}
	if n := c.PartitionInfo(topic, 0).HighWatermark; n != 0 {
		t.Fatalf("%d records produced for invalid envelopes", n)
	}
}

// TestCanceledAndTimedOut: a publish whose context ended, or that got no
// acknowledgement within PublishTimeout, is an infrastructure failure, and
// done runs once even when the acknowledgement arrives afterwards.
func TestCanceledAndTimedOut(t *testing.T) {
	c := cluster(t)
	cl := client(t, c)
	topic := uniqueName("stall")
	ensure(t, cl, topic, 1, nil)
	pub := publisher(t, cl, &postboxkafka.Config{PublishTimeout: 300 * time.Millisecond})

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := publish(t, ctx, pub, envelope(topic, "", "x")); !errors.Is(err, context.Canceled) || postbox.IsMessageError(err) {
		t.Fatalf("canceled publish: %v", err)
	}

	// Hold produce requests until released: the publish times out first,
	// then the acknowledgement arrives.
	release := make(chan struct{})
	var once sync.Once
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.SleepControl(func() { <-release })
		return nil, nil, false
	})
	defer once.Do(func() { close(release) })
	r := pubtest.NewResult(t)
	pub.Publish(context.Background(), envelope(topic, "", "late"), r.Done)
	err := r.Wait(10 * time.Second)
	if !errors.Is(err, postboxkafka.ErrPublishTimeout) || postbox.IsMessageError(err) {
		t.Fatalf("stalled publish: %v, want an infrastructure failure wrapping ErrPublishTimeout", err)
	}
	once.Do(func() { close(release) })
	// The record was produced after all; Close waits for its outcome,
	// which must not call done again.
	closeCtx, cancelClose := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelClose()
	if err := pub.Close(closeCtx); err != nil {
		t.Fatal(err)
	}
	if n := r.Calls(); n != 1 {
		t.Fatalf("done called %d times", n)
	}
	if recs := consumeAll(t, c, topic, 1); string(recs[0].Value) != "late" {
		t.Fatalf("read %q", recs[0].Value)
	}
}

// TestClose: publishes after Close fail with ErrClosed; a Close that
// gives up fails what is outstanding with ErrClosed, once.
func TestClose(t *testing.T) {
	c := cluster(t)
	cl := client(t, c)
	topic := uniqueName("close")
	ensure(t, cl, topic, 1, nil)
	pub, err := postboxkafka.New(cl, &postboxkafka.Config{Logger: quiet, PublishTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var once sync.Once
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.SleepControl(func() { <-release })
		return nil, nil, false
	})
	defer once.Do(func() { close(release) })
	r := pubtest.NewResult(t)
	pub.Publish(context.Background(), envelope(topic, "", "x"), r.Done)

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := pub.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close with a produce outstanding: %v", err)
	}
	if err := r.Wait(time.Second); !errors.Is(err, postboxkafka.ErrClosed) || postbox.IsMessageError(err) {
		t.Fatalf("outstanding publish at Close: %v", err)
	}
	if err := publish(t, context.Background(), pub, envelope(topic, "", "y")); !errors.Is(err, postboxkafka.ErrClosed) || postbox.IsMessageError(err) {
		t.Fatalf("publish after Close: %v", err)
	}
	once.Do(func() { close(release) })
	// The held produce resolves now, and its done stays called once.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	if err := cl.Flush(ctx2); err != nil {
		t.Fatal(err)
	}
	if n := r.Calls(); n != 1 {
		t.Fatalf("done called %d times", n)
	}
}

// TestConcurrentPublishes publishes from many goroutines, some with
// contexts that end early: every done runs exactly once, no failure is a
// message failure, and every acknowledged message is in the topic.
func TestConcurrentPublishes(t *testing.T) {
	c := cluster(t)
	cl := client(t, c)
	topic := uniqueName("many")
	ensure(t, cl, topic, 4, nil)
	pub := publisher(t, cl, nil)
	const n = 400
	var wg sync.WaitGroup
	var mu sync.Mutex
	acked := map[string]bool{}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			env := envelope(topic, fmt.Sprintf("k%d", i%16), fmt.Sprint(i))
			r := pubtest.NewResult(t)
			pub.Publish(ctx, env, r.Done)
			if i%10 == 0 {
				cancel()
			}
			if err := r.Wait(30 * time.Second); err == nil {
				mu.Lock()
				acked[env.ID] = true
				mu.Unlock()
			} else if postbox.IsMessageError(err) {
				// A context that ends before its record is sent makes the
				// client fail the records buffered behind it in the
				// partition too: infrastructure failures, sent again by the
				// relay. Never a message failure.
				t.Errorf("publish %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	// The topic may hold more than the acknowledged records: a publish
	// whose context ended after the broker stored it fails as
	// infrastructure (the relay sends it again). So read until every
	// acknowledged id is seen, not until a count is reached.
	cl2 := client(t, c, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	missing := len(acked)
	for missing > 0 {
		fs := cl2.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("%d acknowledged messages not in the topic within 30s", missing)
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Fatalf("fetch: %v", err) })
		for _, r := range fs.Records() {
			if id, _ := header(r, postboxkafka.HeaderID); acked[id] {
				acked[id] = false
				missing--
			}
		}
	}
}

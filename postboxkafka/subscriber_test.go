package postboxkafka_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxkafka"
)

// processorFunc adapts a function to postbox.Processor.
type processorFunc func(ctx context.Context, d *postbox.Delivery) postbox.Verdict

func (f processorFunc) Process(ctx context.Context, d *postbox.Delivery) postbox.Verdict {
	return f(ctx, d)
}

// produceTo writes records with a plain client, each to the partition it
// names, and returns them with their offsets.
func produceTo(t testing.TB, c *kfake.Cluster, recs ...*kgo.Record) []*kgo.Record {
	t.Helper()
	cl := client(t, c, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return recs
}

func rec(topic string, partition int32, id string) *kgo.Record {
	return &kgo.Record{Topic: topic, Partition: partition, Value: []byte(id), Headers: []kgo.RecordHeader{{Key: postboxkafka.HeaderID, Value: []byte(id)}}}
}

// committed returns group's committed offset for topic's partition, or
// -1.
func committed(c *kfake.Cluster, group, topic string, partition int32) int64 {
	g := c.GroupInfo(group)
	if g == nil {
		return -1
	}
	if pc, ok := g.Commits[topic][partition]; ok {
		return pc.Offset
	}
	return -1
}

func waitCommitted(t testing.TB, c *kfake.Cluster, group, topic string, partition int32, offset int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.WaitGroupInfo(ctx, group, func(g *kfake.GroupInfo) bool {
		return g != nil && g.Commits[topic][partition].Offset >= offset
	}); err != nil {
		t.Fatalf("partition %d of %s: committed %d, want %d within 30s", partition, topic, committed(c, group, topic, partition), offset)
	}
}

// TestCommitOnlyAfterSettle: a record being processed is not committed,
// while one settled in another partition is; once it settles, it is.
func TestCommitOnlyAfterSettle(t *testing.T) {
	c := cluster(t)
	topic := uniqueName("settle")
	ensure(t, client(t, c), topic, 2, nil)
	produceTo(t, c, rec(topic, 0, "slow"), rec(topic, 1, "quick"))
	release := make(chan struct{})
	inHand := make(chan struct{})
	group := uniqueName("g")
	running(t, subscriber(t, c, group, []string{topic}, nil), processorFunc(func(_ context.Context, d *postbox.Delivery) postbox.Verdict {
		if d.ID == "slow" {
			close(inHand)
			<-release
		}
		return postbox.Verdict{Action: postbox.Ack}
	}))
	<-inHand
	waitCommitted(t, c, group, topic, 1, 1)
	if got := committed(c, group, topic, 0); got != -1 {
		t.Fatalf("partition 0 committed at %d while its only record is in the handler", got)
	}
	close(release)
	waitCommitted(t, c, group, topic, 0, 1)
}

// TestRetryHoldsPartition: a Retry holds the partition for the delay (no
// later record of it is processed meanwhile, and nothing is committed past
// the held record), then processes the same record again with Delivered
// one higher. A delay over MaxRetryHold is shortened to it.
func TestRetryHoldsPartition(t *testing.T) {
	c := cluster(t)
	topic := uniqueName("hold")
	ensure(t, client(t, c), topic, 1, nil)
	produceTo(t, c, rec(topic, 0, "r0"), rec(topic, 0, "r1"), rec(topic, 0, "r2"))
	group := uniqueName("g")
	type seen struct {
		id        string
		delivered int
		at        time.Time
		committed int64
	}
	var mu sync.Mutex
	var got []seen
	changed := make(chan struct{}, 1)
	const delay = 300 * time.Millisecond
	running(t, subscriber(t, c, group, []string{topic}, &postboxkafka.SubscriberConfig{CommitInterval: time.Millisecond, MaxRetryHold: delay}),
		processorFunc(func(_ context.Context, d *postbox.Delivery) postbox.Verdict {
			mu.Lock()
			got = append(got, seen{d.ID, d.Delivered, time.Now(), committed(c, group, topic, 0)})
			mu.Unlock()
			select {
			case changed <- struct{}{}:
			default:
			}
			switch {
			case d.ID == "r0" && d.Delivered == 1:
				return postbox.Verdict{Action: postbox.Retry, Delay: delay}
			case d.ID == "r1" && d.Delivered == 1:
				return postbox.Verdict{Action: postbox.Retry, Delay: time.Hour} // held for MaxRetryHold only
			}
			return postbox.Verdict{Action: postbox.Ack}
		}))
	deadline := time.After(30 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n >= 5 {
			break
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("%d deliveries within 30s: %+v", n, got)
		}
	}
	waitCommitted(t, c, group, topic, 0, 3)
	mu.Lock()
	defer mu.Unlock()
	want := []struct {
		id        string
		delivered int
	}{{"r0", 1}, {"r0", 2}, {"r1", 1}, {"r1", 2}, {"r2", 1}}
	if len(got) != len(want) {
		t.Fatalf("deliveries %+v", got)
	}
	for i, w := range want {
		if got[i].id != w.id || got[i].delivered != w.delivered {
			t.Fatalf("delivery %d is %s#%d, want %s#%d: %+v", i, got[i].id, got[i].delivered, w.id, w.delivered, got)
		}
	}
	if gap := got[1].at.Sub(got[0].at); gap < delay {
		t.Fatalf("r0 processed again after %s, before its %s delay", gap, delay)
	}
	if gap := got[3].at.Sub(got[2].at); gap < delay || gap > 20*time.Second {
		t.Fatalf("r1 processed again after %s, want MaxRetryHold (%s)", gap, delay)
	}
	if got[1].committed != -1 {
		t.Fatalf("offset %d committed while r0 was held", got[1].committed)
	}
	if got[3].committed > 1 {
		t.Fatalf("offset %d committed while r1 (offset 1) was held", got[3].committed)
	}
}

// TestDeliveryFromForeignRecords maps records written by other producers:
// CloudEvents headers become ce-*, a record without ce_id gets an id from
// its place in the log, the topic falls back to the Kafka topic and the key
// to the record key.
func TestDeliveryFromForeignRecords(t *testing.T) {
	c := cluster(t)
	topic := uniqueName("foreign")
	ensure(t, client(t, c), topic, 1, nil)
	produceTo(t, c,
		&kgo.Record{Topic: topic, Key: []byte("k1"), Value: []byte("plain"), Headers: []kgo.RecordHeader{{Key: "x-trace", Value: []byte("t")}}},
		&kgo.Record{Topic: topic, Value: []byte("ce"), Headers: []kgo.RecordHeader{
			{Key: "ce_id", Value: []byte("abc")}, {Key: "ce_type", Value: []byte("com.example.thing")},
			{Key: "ce_partitionkey", Value: []byte("pk")}, {Key: "content-type", Value: []byte("text/plain")},
		}},
	)
	ch := make(chan *postbox.Delivery, 2)
	running(t, subscriber(t, c, uniqueName("g"), []string{topic}, nil), processorFunc(func(_ context.Context, d *postbox.Delivery) postbox.Verdict {
		ch <- d
		return postbox.Verdict{Action: postbox.Ack}
	}))
	var ds []*postbox.Delivery
	for len(ds) < 2 {
		select {
		case d := <-ch:
			ds = append(ds, d)
		case <-time.After(30 * time.Second):
			t.Fatalf("%d deliveries within 30s", len(ds))
		}
	}
	plain, ce := ds[0], ds[1]
	if want := fmt.Sprintf("kafka/%s/0/0", topic); plain.ID != want || plain.Topic != topic || plain.Key != "k1" ||
		plain.Headers["x-trace"] != "t" || plain.Delivered != 1 {
		t.Fatalf("plain record: %+v", plain)
	}
	if ce.ID != "abc" || ce.Topic != "com.example.thing" || ce.Key != "pk" || ce.Headers["ce-id"] != "abc" ||
		ce.Headers[postbox.HeaderContentType] != "text/plain" || string(ce.Payload) != "ce" {
		t.Fatalf("CloudEvents record: %+v", ce)
	}
}

// TestRebalanceHandsOverSettledWork: a second member joins while the
// first is consuming. The first commits what it settled before the
// partitions move, so no message is processed twice, and each key's
// messages are processed in order across the handover.
func TestRebalanceHandsOverSettledWork(t *testing.T) {
	c := cluster(t)
	topic := uniqueName("rebalance")
	cl := client(t, c)
	ensure(t, cl, topic, 4, nil)
	pub := publisher(t, cl, nil)
	const keys, per = 16, 25
	for i := range per {
		for k := range keys {
			if err := publish(t, context.Background(), pub, envelope(topic, fmt.Sprintf("key-%02d", k), strconv.Itoa(i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	used := map[int32]bool{}
	for _, r := range consumeAll(t, c, topic, keys*per) {
		used[r.Partition] = true
	}
	if len(used) != 4 {
		t.Fatalf("the keys use %d of 4 partitions; pick other keys", len(used))
	}
	group := uniqueName("g")
	var mu sync.Mutex
	count := map[string]int{}
	next := map[string]int{}
	by := map[string]int{}
	var violation string
	changed := make(chan struct{}, 1)
	proc := func(member string) postbox.Processor {
		return processorFunc(func(_ context.Context, d *postbox.Delivery) postbox.Verdict {
			mu.Lock()
			n := len(count)
			mu.Unlock()
			if member == "first" && n >= keys*per/4 {
				// A quarter done: the first member goes on only once the
				// second has joined, so the partitions move while records
				// are in flight and queued.
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				_, err := c.WaitGroupInfo(ctx, group, func(g *kfake.GroupInfo) bool { return g != nil && len(g.Members) == 2 })
				cancel()
				if err != nil {
					t.Error("the second member did not join within 30s")
				}
				// Work that takes a while, so the first member is still
				// busy when its partitions are revoked.
				time.Sleep(20 * time.Millisecond)
			}
			seq, _ := strconv.Atoi(string(d.Payload))
			mu.Lock()
			defer mu.Unlock()
			count[d.ID]++
			by[member]++
			if seq != next[d.Key] && violation == "" {
				violation = fmt.Sprintf("key %s: message %d processed when %d was due (by %s)", d.Key, seq, next[d.Key], member)
			}
			next[d.Key] = seq + 1
			select {
			case changed <- struct{}{}:
			default:
			}
			return postbox.Verdict{Action: postbox.Ack}
		})
	}
	cfg := &postboxkafka.SubscriberConfig{PartitionBuffer: 16, CommitInterval: 10 * time.Millisecond}
	running(t, subscriber(t, c, group, []string{topic}, cfg), proc("first"))
	waitCount := func(n int) {
		t.Helper()
		deadline := time.After(60 * time.Second)
		for {
			mu.Lock()
			got := len(count)
			mu.Unlock()
			if got >= n {
				return
			}
			select {
			case <-changed:
			case <-deadline:
				t.Fatalf("%d of %d messages processed within 60s", got, n)
			}
		}
	}
	waitCount(keys * per / 4)
	running(t, subscriber(t, c, group, []string{topic}, cfg), proc("second"))
	waitCount(keys * per)
	mu.Lock()
	defer mu.Unlock()
	if violation != "" {
		t.Fatal(violation)
	}
	for id, n := range count {
		if n != 1 {
			t.Fatalf("message %s processed %d times across the rebalance", id, n)
		}
	}
	if by["second"] == 0 {
		t.Fatal("the second member processed nothing: no partition moved")
	}
	t.Logf("first member %d, second %d", by["first"], by["second"])
}

// TestCommitFailureRedelivers: when commits fail, the records processed
// are delivered again to the group's next member, as Kafka's at-least-once
// delivery says; the inbox absorbs them (TestInboxAbsorbsRedelivery).
func TestCommitFailureRedelivers(t *testing.T) {
	c := cluster(t)
	topic := uniqueName("nocommit")
	ensure(t, client(t, c), topic, 1, nil)
	produceTo(t, c, rec(topic, 0, "a"), rec(topic, 0, "b"))
	group := uniqueName("g")
	h := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: group, Err: kerr.UnknownServerError, Count: -1})
	first := make(chan string, 2)
	stop := running(t, subscriber(t, c, group, []string{topic}, nil), processorFunc(func(_ context.Context, d *postbox.Delivery) postbox.Verdict {
		first <- d.ID
		return postbox.Verdict{Action: postbox.Ack}
	}))
	for range 2 {
		select {
		case <-first:
		case <-time.After(30 * time.Second):
			t.Fatal("records not delivered within 30s")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.Wait(ctx, 1); err != nil {
		t.Fatal("no commit was attempted")
	}
	stop()
	h.Remove()
	if got := committed(c, group, topic, 0); got != -1 {
		t.Fatalf("committed %d through the fault", got)
	}
	again := make(chan string, 2)
	running(t, subscriber(t, c, group, []string{topic}, nil), processorFunc(func(_ context.Context, d *postbox.Delivery) postbox.Verdict {
		again <- d.ID
		return postbox.Verdict{Action: postbox.Ack}
	}))
	for _, want := range []string{"a", "b"} {
		select {
		case got := <-again:
			if got != want {
				t.Fatalf("redelivered %s, want %s", got, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("not delivered again within 30s")
		}
	}
	waitCommitted(t, c, group, topic, 0, 2)
}

// TestRunErrors: Run refuses what it cannot consume, clearly.
func TestRunErrors(t *testing.T) {
	c := cluster(t)
	topic := uniqueName("exists")
	ensure(t, client(t, c), topic, 1, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ack := processorFunc(func(context.Context, *postbox.Delivery) postbox.Verdict { return postbox.Verdict{} })

	missing := uniqueName("missing")
	err := subscriber(t, c, uniqueName("g"), []string{topic, missing}, nil).Run(ctx, ack)
	if !errors.Is(err, postboxkafka.ErrNoTopic) {
		t.Fatalf("Run on a missing topic: %v", err)
	}
	if c.TopicInfo(missing) != nil {
		t.Fatal("subscribing created the topic")
	}
	for name, opt := range map[string]kgo.Opt{
		"client.ConsumeRegex":           kgo.ConsumeRegex(),
		"client.AllowAutoTopicCreation": kgo.AllowAutoTopicCreation(),
	} {
		err := subscriber(t, c, uniqueName("g"), []string{topic}, nil, opt).Run(ctx, ack)
		var ce *postbox.ConfigError
		if !errors.As(err, &ce) || len(ce.Problems) != 1 || ce.Problems[0].Field != name {
			t.Fatalf("Run with %s: %v", name, err)
		}
	}
	if err := subscriber(t, c, uniqueName("g"), []string{topic}, nil).Run(ctx, nil); err == nil {
		t.Fatal("Run accepted a nil Processor")
	}
	// A context that ends at once: Run returns nil.
	done, stop := context.WithCancel(context.Background())
	stop()
	if err := subscriber(t, c, uniqueName("g"), []string{topic}, nil).Run(done, ack); err != nil {
		t.Fatalf("Run with an ended context: %v", err)
	}
}

// TestRunRefusedGroup: a group this client may not join ends Run with the
// broker's error rather than a silent wait.
func TestRunRefusedGroup(t *testing.T) {
	c := cluster(t)
	topic := uniqueName("acl")
	ensure(t, client(t, c), topic, 1, nil)
	group := uniqueName("g")
	h := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.JoinGroup}, Group: group, Err: kerr.GroupAuthorizationFailed, Count: -1, TopLevel: true})
	defer h.Remove()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := subscriber(t, c, group, []string{topic}, nil).Run(ctx, processorFunc(func(context.Context, *postbox.Delivery) postbox.Verdict {
		return postbox.Verdict{Action: postbox.Ack}
	}))
	if !errors.Is(err, kerr.GroupAuthorizationFailed) {
		t.Fatalf("Run in a group it may not join: %v", err)
	}
}

// TestRunCommitsOnShutdown: what is settled when Run's context ends is
// committed before Run returns, however long the CommitInterval.
func TestRunCommitsOnShutdown(t *testing.T) {
	c := cluster(t)
	topic := uniqueName("shutdown")
	ensure(t, client(t, c), topic, 1, nil)
	produceTo(t, c, rec(topic, 0, "a"), rec(topic, 0, "b"), rec(topic, 0, "c"))
	group := uniqueName("g")
	seen := make(chan string, 3)
	stop := running(t, subscriber(t, c, group, []string{topic}, &postboxkafka.SubscriberConfig{CommitInterval: time.Minute}),
		processorFunc(func(_ context.Context, d *postbox.Delivery) postbox.Verdict {
			seen <- d.ID
			return postbox.Verdict{Action: postbox.Ack}
		}))
	for range 3 {
		select {
		case <-seen:
		case <-time.After(30 * time.Second):
			t.Fatal("records not delivered within 30s")
		}
	}
	stop()
	if got := committed(c, group, topic, 0); got != 3 {
		t.Fatalf("committed %d after Run returned, want 3", got)
	}
}

// hinted is a processorFunc that asks for an in-flight window
// (postbox.InFlightHinter).
type hinted struct {
	processorFunc
	hint int
}

func (h hinted) InFlightHint() int { return h.hint }

// TestSubscriberTakesTheHint: a Subscriber left at its default MaxInFlight
// (16) processes as many records at once as its Processor asks for, where
// the partitions allow: one record in each of 128 partitions, a hint of
// 100, and every record held until 100 are in the handler together. The
// broker suite's topic has four partitions, too few to show it.
func TestSubscriberTakesTheHint(t *testing.T) {
	const partitions, hint = 128, 100
	c := cluster(t)
	topic := uniqueName("hint")
	ensure(t, client(t, c), topic, partitions, nil)
	recs := make([]*kgo.Record, partitions)
	for i := range recs {
		recs[i] = rec(topic, int32(i), "r"+strconv.Itoa(i))
	}
	produceTo(t, c, recs...)
	var mu sync.Mutex
	now, peak := 0, 0
	full := make(chan struct{})
	running(t, subscriber(t, c, uniqueName("g"), []string{topic}, nil), hinted{hint: hint, processorFunc: func(ctx context.Context, _ *postbox.Delivery) postbox.Verdict {
		mu.Lock()
		now++
		if now > peak {
			peak = now
			if peak == hint {
				close(full)
			}
		}
		mu.Unlock()
		select {
		case <-full:
		case <-ctx.Done():
		}
		mu.Lock()
		now--
		mu.Unlock()
		return postbox.Verdict{Action: postbox.Ack}
	}})
	select {
	case <-full:
	case <-time.After(30 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("at most %d records were processed at once, want the hint, %d", peak, hint)
	}
}

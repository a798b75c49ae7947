package postboxnats_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxnats"
)

// TestInboxBatchPerKeyCopiesFailures runs the Subscriber with PerKey over
// the batching processor: messages over a few keys, some sent twice under
// one id (copies the stream keeps), some failing their first run. Every id
// takes effect once, each key's messages in stream order, and every
// delivery is settled.
func TestInboxBatchPerKeyCopiesFailures(t *testing.T) {
	eachSetup(t, fastRetries, func(t *testing.T, url string, db consumerDB) {
		_, js := connect(t, url)
		_, base := stream(t, js, nil)
		c := ensureConsumer(t, js, base, "billing", nil)
		const keys, perKey = 4, 15
		var mu sync.Mutex
		failedOnce := map[string]bool{}
		inner := db.batchProcessor(t, "billing", func(d *postbox.Delivery) error {
			n, _ := strconv.Atoi(strings.Split(string(d.Payload), ":")[1])
			mu.Lock()
			defer mu.Unlock()
			if n%5 == 2 && !failedOnce[d.ID] {
				failedOnce[d.ID] = true
				return errors.New("not yet")
			}
			return nil
		}, &postbox.BatchConfig{MaxBatch: 16})
		var vs verdicts
		runSubscriber(t, subscriber(t, c, &postboxnats.SubscriberConfig{PerKey: true}), processorFunc(func(ctx context.Context, d *postbox.Delivery) postbox.Verdict {
			v := inner.Process(ctx, d)
			vs.add(d, v)
			return v
		}))
		ids := map[string]bool{}
		sent := 0
		for i := range perKey {
			for k := range keys {
				key := fmt.Sprintf("k%d", k)
				id := postbox.NewID()
				ids[id] = true
				h := map[string]string{postbox.HeaderID: id, postbox.HeaderType: "orders.paid", postbox.HeaderPartitionKey: key}
				copies := 1
				if i%4 == 1 {
					copies = 2 // a copy right behind it, same key
				}
				for range copies {
					publishMsg(t, js, base+".orders.paid", fmt.Sprintf("%s:%d", key, i), h)
					sent++
				}
			}
		}
		waitUntil(t, 30*time.Second, "every delivery settled", func() bool {
			return vs.count(func(x verdictOf) bool { return x.v.Action == postbox.Ack }) == sent
		})
		settledAll(t, c)
		applied := map[string]int{}
		order := map[string][]int{}
		for _, x := range vs.all() {
			if x.v.Action == postbox.DeadLettered {
				t.Fatalf("dead letter: %+v", x.v)
			}
			if x.v.Action == postbox.Ack && !x.v.Duplicate {
				applied[x.d.ID]++
				n, _ := strconv.Atoi(strings.Split(string(x.d.Payload), ":")[1])
				order[x.d.Key] = append(order[x.d.Key], n)
			}
		}
		if len(applied) != len(ids) {
			t.Fatalf("%d ids applied, want %d", len(applied), len(ids))
		}
		for id, n := range applied {
			if n != 1 {
				t.Fatalf("id %s applied %d times", id, n)
			}
		}
		for key, ns := range order {
			for i := 1; i < len(ns); i++ {
				if ns[i] <= ns[i-1] {
					t.Fatalf("key %s applied in the order %v", key, ns)
				}
			}
		}
		if n := db.effects(t); n != int64(len(ids)) {
			t.Fatalf("%d effects, want %d", n, len(ids))
		}
	})
}

// TestInboxBatchPoisonDeadLettered: through the batching processor, a
// message whose handler always fails is dead-lettered after MaxAttempts,
// and the messages batched around it take effect once.
func TestInboxBatchPoisonDeadLettered(t *testing.T) {
	cfg := fastRetries
	cfg.MaxAttempts = 3
	eachSetup(t, cfg, func(t *testing.T, url string, db consumerDB) {
		pc := newPoisonCase(t, url)
		c, poison := pc.consumer, pc.poison
		inner := db.batchProcessor(t, "billing", pc.handle, nil)
		var vs verdicts
		runSubscriber(t, subscriber(t, c, nil), processorFunc(func(ctx context.Context, d *postbox.Delivery) postbox.Verdict {
			v := inner.Process(ctx, d)
			vs.add(d, v)
			return v
		}))
		const healthy = 40
		pc.publishAll(t, healthy)
		waitUntil(t, 30*time.Second, "the poison dead-lettered", func() bool { return len(db.dead(t, "billing")) == 1 })
		settledAll(t, c)
		if dl := db.dead(t, "billing")[0]; dl.ID != poison.ID || dl.Attempts != 3 || dl.Error != "cannot apply" {
			t.Fatalf("dead letter %+v", dl)
		}
		var runs []string
		for _, x := range vs.all() {
			if x.d.ID == poison.ID {
				runs = append(runs, x.v.Action.String())
			}
		}
		if fmt.Sprint(runs) != "[retry retry dead-lettered]" {
			t.Fatalf("poison runs %v, want retry, retry, dead-lettered", runs)
		}
		if n := db.effects(t); n != healthy {
			t.Fatalf("%d effects, want %d", n, healthy)
		}
	})
}

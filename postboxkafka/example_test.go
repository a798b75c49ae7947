package postboxkafka_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxkafka"
)

// A Publisher and a Subscriber on an in-process Kafka (kfake). Against a
// real cluster, only the seed brokers and EnsureTopic's replication
// factor and configs change.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(3))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		panic(err)
	}
	defer cl.Close()

	// Topology, once, at deploy or start-up.
	if err := postboxkafka.EnsureTopic(ctx, cl, "orders.created", 6, 3, map[string]string{"min.insync.replicas": "2"}); err != nil {
		panic(err)
	}
	rep, err := postboxkafka.CheckTopic(ctx, cl, "orders.created")
	if err != nil {
		panic(err)
	}
	fmt.Println("durability problems:", len(rep.Problems))

	// The relay's side: postbox.Config{Publisher: pub}. Here, one publish
	// by hand.
	pub, err := postboxkafka.New(cl, nil)
	if err != nil {
		panic(err)
	}
	defer pub.Close(ctx)
	env := &postbox.Envelope{
		ID: "0190a8e4-4b1e-7cc2-8a55-0d4c1b5f3e21", Topic: "orders.created", Key: "order-42",
		Payload: []byte(`{"total":42}`),
		Headers: map[string]string{postbox.HeaderType: "orders.created", postbox.HeaderContentType: "application/json"},
	}
	acked := make(chan error, 1)
	pub.Publish(ctx, env, func(err error) { acked <- err })
	fmt.Println("published:", <-acked)

	// The consumer's side: usually inbox.Processor("billing", handle).
	sub, err := postboxkafka.NewSubscriber("billing", []string{"orders.created"},
		&postboxkafka.SubscriberConfig{Logger: slog.New(slog.DiscardHandler)},
		kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		panic(err)
	}
	got := make(chan *postbox.Delivery, 1)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- sub.Run(runCtx, processorFunc(func(_ context.Context, d *postbox.Delivery) postbox.Verdict {
			got <- d
			return postbox.Verdict{Action: postbox.Ack}
		}))
	}()
	d := <-got
	fmt.Println(d.ID, d.Topic, d.Key, string(d.Payload), d.Headers["content-type"], d.Delivered)
	stop()
	fmt.Println("run:", <-done)
	// Output:
	// durability problems: 0
	// published: <nil>
	// 0190a8e4-4b1e-7cc2-8a55-0d4c1b5f3e21 orders.created order-42 {"total":42} application/json 1
	// run: <nil>
}

package bench_test

import (
	"testing"

	"github.com/postbox-go/postbox/cmd/postbox/internal/bench"
	"github.com/postbox-go/postbox/internal/testdb"
)

// A small RabbitMQ drain, its raw baseline carrying a relay's headers,
// from the outbox and from the log: the raw queue and the drain's queue
// each hold exactly the messages sent, checked by the benchmark itself.
func TestRabbitMQSmall(t *testing.T) {
	testdb.SharedService(t, "rabbitmq")
	for _, storage := range []string{"table", "log"} {
		t.Run(storage, func(t *testing.T) {
			res := runBench(t, bench.RabbitMQ, bench.RabbitMQOptions{Messages: 2000, Keys: 50, RawHeaders: true, Storage: storage})
			if res.QueueDepth != 2000 || res.RawRate <= 0 || res.DrainRate <= 0 {
				t.Fatalf("result %+v", res)
			}
		})
	}
}

func TestRabbitMQBadOptions(t *testing.T) {
	wantRejected(t, bench.RabbitMQ, bench.RabbitMQOptions{Messages: -5, Window: 70000, Storage: "wal"}, "--messages", "--window", "--storage")
}

package bench_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/postbox-go/postbox/internal/bench"
)

// A small RabbitMQ drain: the raw queue and the drain's queue each hold
// exactly the messages sent, checked by the benchmark itself.
func TestRabbitMQSmall(t *testing.T) {
	var out bytes.Buffer
	res, err := bench.RabbitMQ(context.Background(), bench.RabbitMQOptions{Messages: 2000, Keys: 50}, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if res.QueueDepth != 2000 || res.RawRate <= 0 || res.DrainRate <= 0 {
		t.Fatalf("result %+v", res)
	}
}

func TestRabbitMQBadOptions(t *testing.T) {
	_, err := bench.RabbitMQ(context.Background(), bench.RabbitMQOptions{Messages: -5, Window: 70000}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "--messages") || !strings.Contains(err.Error(), "--window") {
		t.Fatalf("err = %v", err)
	}
}

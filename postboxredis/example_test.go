package postboxredis_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxredis"
)

// A bad configuration is refused with every bad field named at once.
func ExampleNew_invalidConfig() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	_, err := postboxredis.New(rdb, &postboxredis.Config{
		Stream:         "orders",
		StreamPrefix:   "events:",
		PublishTimeout: time.Hour,
	})
	var ce *postbox.ConfigError
	if errors.As(err, &ce) {
		for _, p := range ce.Problems {
			fmt.Println(p.Field)
		}
	}
	// Output:
	// StreamPrefix
	// PublishTimeout
}

// Classify tells the relay's two kinds of failure apart: a message whose
// stream does not exist spends an attempt, a lost connection does not.
func ExampleClassify() {
	fmt.Println(postboxredis.Classify(postbox.NewMessageError(postboxredis.ErrNoStream)))
	fmt.Println(postboxredis.Classify(fmt.Errorf("publish: %w", postboxredis.ErrPublishTimeout)))
	fmt.Println(postboxredis.Classify(context.DeadlineExceeded))
	// Output:
	// message
	// infrastructure
	// infrastructure
}

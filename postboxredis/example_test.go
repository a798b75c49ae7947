package postboxredis_test

import (
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

// The relay tells its two kinds of failure apart with
// postbox.IsMessageError: the Publisher reports a message whose stream
// does not exist as a message failure, and a timeout as an
// infrastructure failure; errors.Is finds the cause through either.
func Example_failures() {
	noStream := postbox.NewMessageError(fmt.Errorf("postboxredis: publish: %w", postboxredis.ErrNoStream))
	timeout := fmt.Errorf("postboxredis: publish: %w", postboxredis.ErrPublishTimeout)
	fmt.Println(postbox.IsMessageError(noStream), errors.Is(noStream, postboxredis.ErrNoStream))
	fmt.Println(postbox.IsMessageError(timeout), errors.Is(timeout, postboxredis.ErrPublishTimeout))
	// Output:
	// true true
	// false true
}

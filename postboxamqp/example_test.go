package postboxamqp_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxamqp"
)

// A bad configuration is refused with every bad field named at once.
func ExampleNew_invalidConfig() {
	_, err := postboxamqp.New(postboxamqp.URL("amqp://guest:guest@127.0.0.1:5672/"), &postboxamqp.Config{
		AcceptUnroutable: []string{"audit.*.login"},
		PublishTimeout:   time.Hour,
	})
	var ce *postbox.ConfigError
	if errors.As(err, &ce) {
		for _, p := range ce.Problems {
			fmt.Println(p.Field)
		}
	}
	// Output:
	// AcceptUnroutable[0]
	// PublishTimeout
}

// Classify tells the relay's two kinds of failure apart: an unroutable
// message spends an attempt, a lost connection does not.
func ExampleClassify() {
	fmt.Println(postboxamqp.Classify(postbox.NewMessageError(postboxamqp.ErrUnroutable)))
	fmt.Println(postboxamqp.Classify(fmt.Errorf("publish: %w", postboxamqp.ErrConnectionLost)))
	fmt.Println(postboxamqp.Classify(context.DeadlineExceeded))
	// Output:
	// message
	// infrastructure
	// infrastructure
}

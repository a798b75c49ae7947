package postboxamqp_test

import (
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

// The relay tells its two kinds of failure apart with
// postbox.IsMessageError: the Publisher reports an unroutable message as
// a message failure, and a lost connection as an infrastructure failure;
// errors.Is finds the cause through either.
func Example_failures() {
	unroutable := postbox.NewMessageError(fmt.Errorf("postboxamqp: publish: %w", postboxamqp.ErrUnroutable))
	lost := fmt.Errorf("postboxamqp: publish: %w", postboxamqp.ErrConnectionLost)
	fmt.Println(postbox.IsMessageError(unroutable), errors.Is(unroutable, postboxamqp.ErrUnroutable))
	fmt.Println(postbox.IsMessageError(lost), errors.Is(lost, postboxamqp.ErrConnectionLost))
	// Output:
	// true true
	// false true
}

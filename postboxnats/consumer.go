package postboxnats

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrConsumerConfig is wrapped by the errors of EnsureConsumer and
// NewSubscriber for a consumer the Subscriber cannot work with: not
// durable, not a pull consumer, or without explicit acks.
var ErrConsumerConfig = errors.New("postboxnats: consumer unsuitable for a Subscriber")

// EnsureConsumer creates the durable pull consumer cfg describes on
// stream, or updates it to cfg when it exists, and returns it. It is the
// consumer side's explicit topology step, like EnsureStream: run it at
// deploy or start-up (it is idempotent, every replica may), and hand the
// result to NewSubscriber. Subscribing creates nothing.
//
// cfg must name the consumer with Durable (Name, if also set, must equal
// it), must not set DeliverSubject (a push consumer), and must use
// explicit acks: jetstream.AckExplicitPolicy, which is the zero value.
// AckAll would let one delivery's ack settle every earlier delivery,
// including those still being handled or held for their key; AckNone
// would lose a delivery whose handler failed.
//
// Three settings decide how the consumer and the inbox share the work:
//
//   - MaxDeliver must be -1 (or 0, the server default: unlimited), or
//     exceed the inbox's MaxAttempts by a margin. The inbox counts
//     failed handler runs and dead-letters a message after MaxAttempts,
//     visibly and requeueably; when the server's count runs out first it
//     stops delivering the message and drops it from the consumer with
//     no trace but an advisory. Deliveries the inbox does not count
//     also spend MaxDeliver: redeliveries after a lost ack or an
//     expired AckWait, copies absorbed as duplicates, and, with
//     SubscriberConfig.PerKey, messages handed back to the server while
//     their key is blocked. Use -1 unless a bound is required, and then
//     a generous one.
//   - AckWait bounds one handler run, from delivery to the ack: a run
//     that takes longer is redelivered (to this or another subscriber)
//     while it still runs, and the copy waits on the first run's
//     transaction or is absorbed by the inbox. Set it well above the
//     slowest handler's transaction (server default 30s). BackOff, when
//     set, replaces AckWait for these timeouts; it does not apply to the
//     inbox's retries, which are negative acks with their own delay.
//   - MaxAckPending caps deliveries awaiting an ack across all the
//     consumer's subscribers (server default 1000). Messages waiting for
//     a delayed retry count against it, so keep it well above twice
//     a Run's window (MaxInFlight, or a batch processor's larger hint:
//     the client's pull buffer holds as many again) times the number of
//     subscribers.
func EnsureConsumer(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	if js == nil {
		return nil, errors.New("postboxnats: EnsureConsumer needs a JetStream")
	}
	if stream == "" {
		return nil, errors.New("postboxnats: ensure consumer: the stream name is empty")
	}
	if err := checkConsumerConfig(&cfg); err != nil {
		return nil, fmt.Errorf("postboxnats: ensure consumer %q on stream %q: %w", cfg.Durable, stream, err)
	}
	c, err := js.CreateOrUpdateConsumer(ctx, stream, cfg)
	if err != nil {
		return nil, fmt.Errorf("postboxnats: ensure consumer %q on stream %q: %w", cfg.Durable, stream, err)
	}
	return c, nil
}

// checkConsumerConfig reports why cfg cannot back a Subscriber.
func checkConsumerConfig(cfg *jetstream.ConsumerConfig) error {
	var problems []error
	if cfg.Durable == "" {
		problems = append(problems, errors.New("no Durable name: the consumer must be durable so that its acks and pending deliveries outlive a subscriber"))
	}
	if cfg.Name != "" && cfg.Name != cfg.Durable {
		problems = append(problems, fmt.Errorf("the Name %q differs from the Durable name %q", cfg.Name, cfg.Durable))
	}
	if cfg.DeliverSubject != "" {
		problems = append(problems, errors.New("a DeliverSubject is set: the Subscriber pulls, it needs a pull consumer"))
	}
	if cfg.AckPolicy != jetstream.AckExplicitPolicy {
		problems = append(problems, fmt.Errorf("the AckPolicy is %s: the Subscriber acks each delivery on its own after its transaction commits, which needs explicit acks", cfg.AckPolicy))
	}
	if cfg.MaxDeliver == 1 {
		problems = append(problems, errors.New("a MaxDeliver of 1 means no retry could ever be delivered; use -1, or more than the inbox's MaxAttempts"))
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrConsumerConfig, errors.Join(problems...))
}

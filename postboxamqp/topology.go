package postboxamqp

import (
	"context"
	"errors"
	"fmt"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/postbox-go/postbox/internal/printable"
)

// Topology describes what EnsureTopology declares: an exchange, and
// optionally a consumer's queue bound to it with its dead-letter exchange
// and queue. Everything is durable.
type Topology struct {
	// Exchange is the exchange publishers send to. Required.
	Exchange string
	// Kind is the exchange type: "topic" (default), "direct", "fanout" or
	// "headers".
	Kind string

	// Queue, when set, is declared and bound to Exchange with Bindings.
	// One queue serves one consumer name: every Subscriber of it shares
	// its deliveries (competing consumers), and each consumer that must
	// see every message needs a queue of its own.
	Queue string
	// Bindings are the routing keys (patterns, for a topic exchange:
	// "orders.*", "#") binding Queue to Exchange. None leaves Queue
	// unbound, and a mandatory publish that nothing else routes fails as
	// unroutable.
	Bindings []string
	// Classic declares classic queues instead of quorum queues. Leave it
	// off: a quorum queue replicates a persistent message before the
	// broker confirms it (docs/design.md §8), and counts redeliveries
	// (x-delivery-count).
	Classic bool
	// DeliveryLimit sets x-delivery-limit on a quorum Queue: after that
	// many redeliveries the broker dead-letters (or drops) the message by
	// itself. 0 leaves the broker's default, which is no limit on
	// RabbitMQ 3.x and 20 on 4.x; keep it above the inbox's MaxAttempts
	// plus the redeliveries a database outage can cause (RabbitMQ 4
	// accepts -1 for no limit).
	DeliveryLimit int

	// DeadLetterExchange, when set, is declared as a fanout exchange and
	// set as Queue's x-dead-letter-exchange: deliveries a Subscriber
	// settles as DeadLettered go there.
	DeadLetterExchange string
	// DeadLetterQueue, when set, is declared (quorum, unless Classic) and
	// bound to DeadLetterExchange, so dead letters are kept. Requires
	// DeadLetterExchange.
	DeadLetterQueue string

	// QueueArgs are extra arguments for Queue (x-overflow, x-max-length,
	// ...). They must not repeat what the fields above set.
	QueueArgs amqp.Table
}

var exchangeKinds = map[string]bool{
	amqp.ExchangeTopic: true, amqp.ExchangeDirect: true, amqp.ExchangeFanout: true, amqp.ExchangeHeaders: true,
}

// validate checks t with Kind defaulted, naming every bad field.
func (t *Topology) validate() error {
	var ps problems
	if err := validateName(t.Exchange); err != nil {
		ps.Add("Exchange", t.Exchange, "%v", err)
	} else if strings.HasPrefix(t.Exchange, "amq.") {
		ps.Add("Exchange", t.Exchange, `names starting with "amq." are reserved for the broker's own exchanges`)
	}
	if !exchangeKinds[t.Kind] {
		ps.Add("Kind", t.Kind, "must be topic, direct, fanout or headers")
	}
	if t.Queue != "" {
		if err := validateName(t.Queue); err != nil {
			ps.Add("Queue", t.Queue, "%v", err)
		}
	} else {
		if len(t.Bindings) > 0 {
			ps.Add("Bindings", strings.Join(t.Bindings, ","), "need a Queue to bind")
		}
		if t.DeliveryLimit != 0 {
			ps.Add("DeliveryLimit", t.DeliveryLimit, "needs a Queue")
		}
		if len(t.QueueArgs) > 0 {
			ps.Add("QueueArgs", len(t.QueueArgs), "need a Queue")
		}
	}
	for i, b := range t.Bindings {
		if len(b) > maxShortString || !printable.Line(b) {
			ps.Add(fmt.Sprintf("Bindings[%d]", i), b, "must be printable UTF-8 of at most %d bytes", maxShortString)
		}
	}
	if t.DeliveryLimit < -1 {
		ps.Add("DeliveryLimit", t.DeliveryLimit, "must be -1 (no limit, RabbitMQ 4), 0 (the broker's default) or positive")
	} else if t.DeliveryLimit != 0 && t.Classic {
		ps.Add("DeliveryLimit", t.DeliveryLimit, "applies to quorum queues only")
	}
	if t.DeadLetterExchange != "" {
		if err := validateName(t.DeadLetterExchange); err != nil {
			ps.Add("DeadLetterExchange", t.DeadLetterExchange, "%v", err)
		} else if t.DeadLetterExchange == t.Exchange {
			ps.Add("DeadLetterExchange", t.DeadLetterExchange, "must differ from Exchange, or dead letters would be routed back to the queues they left")
		}
	}
	if t.DeadLetterQueue != "" {
		if err := validateName(t.DeadLetterQueue); err != nil {
			ps.Add("DeadLetterQueue", t.DeadLetterQueue, "%v", err)
		} else if t.DeadLetterQueue == t.Queue {
			ps.Add("DeadLetterQueue", t.DeadLetterQueue, "must differ from Queue")
		}
		if t.DeadLetterExchange == "" {
			ps.Add("DeadLetterQueue", t.DeadLetterQueue, "needs a DeadLetterExchange to bind to")
		}
	}
	for k := range t.QueueArgs {
		switch k {
		case "x-queue-type", "x-dead-letter-exchange", "x-delivery-limit":
			ps.Add("QueueArgs", k, "is set by the Topology's own fields")
		}
	}
	return ps.Err()
}

// EnsureTopology declares t on a channel of its own on conn: the exchange,
// then the dead-letter exchange and queue, then the queue and its
// bindings. It is the explicit topology step: run it at deploy or
// start-up (every replica may; declarations are idempotent), never per
// publish. Publishers and Subscribers declare nothing, and a missing
// exchange or queue is reported as such.
//
// A declaration that differs from what exists (another queue type,
// other arguments) fails with the broker's 406 PRECONDITION_FAILED
// (*amqp.Error): RabbitMQ does not change a queue's arguments in place.
// An invalid t returns a *postbox.ConfigError naming every bad field.
func EnsureTopology(ctx context.Context, conn *amqp.Connection, t Topology) error {
	if t.Kind == "" {
		t.Kind = amqp.ExchangeTopic
	}
	if err := t.validate(); err != nil {
		return err
	}
	if conn == nil {
		return errors.New("postboxamqp: EnsureTopology needs a connection")
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("postboxamqp: ensure topology: open channel: %w", err)
	}
	// Declarations wait for the broker without a context: closing the
	// channel when ctx ends makes the one in progress return.
	stop := context.AfterFunc(ctx, func() { _ = ch.Close() })
	defer func() {
		stop()
		_ = ch.Close()
	}()
	wrap := func(what string, err error) error {
		if ctx.Err() != nil {
			return fmt.Errorf("postboxamqp: ensure topology: %s: %w (%w)", what, ctx.Err(), err)
		}
		return fmt.Errorf("postboxamqp: ensure topology: %s: %w", what, err)
	}
	queueType := amqp.QueueTypeQuorum
	if t.Classic {
		queueType = amqp.QueueTypeClassic
	}
	if err := ch.ExchangeDeclare(t.Exchange, t.Kind, true, false, false, false, nil); err != nil {
		return wrap(fmt.Sprintf("exchange %q", t.Exchange), err)
	}
	if t.DeadLetterExchange != "" {
		if err := ch.ExchangeDeclare(t.DeadLetterExchange, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
			return wrap(fmt.Sprintf("dead-letter exchange %q", t.DeadLetterExchange), err)
		}
	}
	if t.DeadLetterQueue != "" {
		if _, err := ch.QueueDeclare(t.DeadLetterQueue, true, false, false, false, amqp.Table{amqp.QueueTypeArg: queueType}); err != nil {
			return wrap(fmt.Sprintf("dead-letter queue %q", t.DeadLetterQueue), err)
		}
		if err := ch.QueueBind(t.DeadLetterQueue, "", t.DeadLetterExchange, false, nil); err != nil {
			return wrap(fmt.Sprintf("bind dead-letter queue %q", t.DeadLetterQueue), err)
		}
	}
	if t.Queue == "" {
		return ctx.Err()
	}
	args := amqp.Table{amqp.QueueTypeArg: queueType}
	for k, v := range t.QueueArgs {
		args[k] = v
	}
	if t.DeadLetterExchange != "" {
		args["x-dead-letter-exchange"] = t.DeadLetterExchange
	}
	if t.DeliveryLimit != 0 {
		args["x-delivery-limit"] = int64(t.DeliveryLimit)
	}
	if _, err := ch.QueueDeclare(t.Queue, true, false, false, false, args); err != nil {
		return wrap(fmt.Sprintf("queue %q", t.Queue), err)
	}
	for _, b := range t.Bindings {
		if err := ch.QueueBind(t.Queue, b, t.Exchange, false, nil); err != nil {
			return wrap(fmt.Sprintf("bind queue %q to %q with %q", t.Queue, t.Exchange, b), err)
		}
	}
	return ctx.Err()
}

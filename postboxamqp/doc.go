// Package postboxamqp publishes postbox messages to RabbitMQ and consumes
// them, over AMQP 0-9-1 (github.com/rabbitmq/amqp091-go).
//
// A Publisher is the relay's postbox.Publisher: each envelope becomes one
// persistent message on an exchange, published on a channel in confirm
// mode with the mandatory flag, and counts as published only once the
// broker confirmed it without returning it (guarantee G3 of docs/design.md). A Subscriber
// is a postbox.Subscriber: it consumes a queue with manual
// acknowledgements and settles each delivery as the inbox's Verdict says.
//
//	dial := postboxamqp.URL("amqp://guest:guest@127.0.0.1:5672/")
//	conn, _ := dial(ctx)
//	err := postboxamqp.EnsureTopology(ctx, conn, postboxamqp.Topology{
//		Exchange:           "orders",
//		Queue:              "billing.orders",
//		Bindings:           []string{"orders.*"},
//		DeadLetterExchange: "billing.orders.dlx",
//		DeadLetterQueue:    "billing.orders.dead",
//	})
//	conn.Close()
//
//	pub, err := postboxamqp.New(dial, &postboxamqp.Config{Exchange: "orders"})
//	defer pub.Close(ctx)
//	client, err := postbox.NewClient(postboxpgx.New(pool), &postbox.Config{Publisher: pub})
//
//	sub, err := postboxamqp.NewSubscriber(dial, "billing.orders", nil)
//	err = sub.Run(ctx, inbox.Processor("billing", handle))
//
// # The message on the wire
//
// The exchange is Config.Exchange ("postbox" by default) and the routing
// key is the topic, or whatever Config.RoutingKey returns. The body is
// the payload, unchanged. Properties: delivery-mode 2 (persistent),
// message-id = the message's id (G7, the same on every retry),
// content-type from the content-type header, timestamp = the time the
// message was written, type = the topic.
//
// Headers follow the CloudEvents AMQP protocol binding in binary mode:
// each CloudEvents attribute travels as an application property named
// "cloudEvents:" plus the attribute (ce-id becomes cloudEvents:id,
// ce-partitionkey cloudEvents:partitionkey), and datacontenttype as the
// content-type property. The binding is written for AMQP 1.0; RabbitMQ
// maps AMQP 0-9-1 headers to AMQP 1.0 application properties, so a
// CloudEvents SDK reading the queue over AMQP 1.0 sees a binary-mode
// event. Values travel as their canonical strings, which the binding
// allows. Other headers keep their names. The Subscriber maps it all
// back: cloudEvents:X (or cloudEvents_X, the binding's other spelling)
// becomes ce-X, the content-type property becomes the content-type
// header. Headers that steer RabbitMQ (CC and BCC add routing keys;
// x-delay, x-death, x-delivery-count) are refused as invalid.
//
// # Topology is explicit
//
// Publishing and subscribing declare nothing. EnsureTopology declares an
// exchange and, optionally, a quorum queue with its bindings and its
// dead-letter exchange and queue, as a deploy or start-up step.
//
// With the mandatory flag, a message that no queue is bound for comes
// back as a basic.return before its confirm, and fails as a message
// failure (ErrUnroutable): it spends an attempt, backs off, and ends in
// the dead table after the budget, visible and requeueable once a queue
// is bound. It is never marked published. For fan-out topics where "no
// queue bound yet" is normal, Config.AcceptUnroutable lists the topics
// whose returned messages count as published anyway; Unroutable counts
// them.
//
// A missing exchange is different: the broker closes the channel (404),
// every message of the Publisher would fail alike, and burying the whole
// backlog while the operator creates the exchange would help no one. It
// fails as an infrastructure failure wrapping ErrNoExchange, and the relay
// pauses and retries until the exchange exists.
//
// # Failures
//
// done gets nil on a confirm, and otherwise an error the relay sorts by
// postbox.IsPermanent and postbox.IsMessageError (docs/design.md §4); the
// Publisher wraps what the broker can never accept from the message with
// postbox.Permanent (the relay buries it at once), and every other message
// failure with postbox.NewMessageError:
//
//	failure                                              class           error
//	basic.ack, not returned                              success         nil
//	basic.ack after basic.return, topic accepted         success         nil (counted by Unroutable)
//	basic.return (312 NO_ROUTE) with mandatory           message         ErrUnroutable
//	payload over MaxMessageSize                          permanent       ErrTooLarge
//	properties and headers over the frame_max            permanent       ErrTooLarge
//	routing key over 255 bytes or not UTF-8              permanent       ErrInvalidRoutingKey
//	header unfit for AMQP, or one that steers RabbitMQ   permanent       ErrInvalidHeader
//	no message id                                        permanent       ErrNoID
//	channel exception over content (406, 501, 502, 505)
//	  this message a suspect sent alone                  permanent       ErrRejected + *amqp.Error
//	  otherwise (it becomes a suspect)                   infrastructure  ErrConnectionLost + *amqp.Error
//	basic.nack                                           infrastructure  ErrNacked
//	exchange missing (404 on publish)                    infrastructure  ErrNoExchange
//	connection or channel lost before the confirm        infrastructure  ErrConnectionLost
//	no connection, dial failing or backing off           infrastructure  ErrNotConnected
//	connection blocked (memory or disk alarm)            infrastructure  ErrBlocked
//	no confirm within PublishTimeout                     infrastructure  ErrPublishTimeout
//	the publish's context ended                          infrastructure  ctx.Err()
//	Publisher closed                                     infrastructure  ErrClosed
//	anything else                                        infrastructure
//
// The Publisher is a postbox.MessageChecker: a Client whose route leads to
// it refuses at write time, with a *postbox.ValidationError, a payload over
// MaxMessageSize, a header AMQP cannot carry or RabbitMQ reserves, and a
// routing key AMQP cannot carry. The frame_max is known only once
// connected: a message over it is dead at the first publish.
//
// A basic.nack means a queue process failed or a queue with
// x-overflow=reject-publish is full: the broker's state, which passes,
// so it spends no attempt. Unknown errors count as infrastructure on
// purpose: a pause can delay a message, an attempt can bury it.
//
// A channel exception does not name the publish that caused it. When the
// broker closes the channel over content, every message still in flight
// fails as infrastructure and becomes a suspect: its next attempt is
// published alone (it takes the whole MaxPending window), so that if it
// breaks the channel again it is blamed, and spends an attempt, on its
// own. A message is never blamed on first sight, even when it was the only
// one in flight: the publish at fault may have failed on another path.
//
// # Connections
//
// A Publisher owns one connection with one confirm-mode channel; a
// Subscriber owns one per Run. Both dial through a Dialer (URL makes one;
// DialConfig takes amqp.Config options such as TLS) and dial again after
// a loss. The connections these dial batch their writes: amqp091 writes
// each publish to the socket with a system call of its own, and what is
// written while the socket is busy goes out together in the next one, so
// a busy relay pays one call for many publishes, and so does the broker
// reading them. A Dialer of your own keeps amqp091's one call each.
//
// For the Publisher the reconnect is single-flight and driven by
// publishing: the first Publish that finds no connection dials, the others
// wait for that dial within their context, and while the backoff after a
// failed dial runs (ReconnectBackoff, doubling to ReconnectBackoffMax)
// they fail at once with ErrNotConnected, which makes the relay pause
// rather than spin. A lost connection fails every publish awaiting its
// confirm, each exactly once, as infrastructure: none spends an attempt,
// and the relay sends them again with the same message-id. The Subscriber
// waits for the deliveries being processed, dials again with backoff, and
// resumes; the broker redelivers what was not acknowledged.
//
// # Subscribers: redelivery and order
//
// RabbitMQ has no delayed redelivery of its own (basic.nack with requeue
// puts a message back at once). For a Retry verdict the Subscriber holds
// the delivery, unacknowledged, for the verdict's delay and then requeues
// it, so no consumer of the queue sees it before the delay has passed
// (DelayedRedelivery in the broker suite). The hold is capped by
// MaxRetryHold (5 minutes, the inbox's default BackoffMax; at most 25, under
// RabbitMQ's consumer_timeout of 30), held deliveries use prefetch slots,
// and a connection loss or a shutdown returns held deliveries to the
// queue at once. A retry queue with a per-message TTL would free the
// slots, but expires only at its head, so a long delay would hold back
// the short ones behind it.
//
// A DeadLettered verdict comes after the inbox wrote its own dead message
// (the one to inspect and requeue through postbox); the Subscriber then
// rejects the delivery without requeue, so the broker moves it to the
// queue's dead-letter exchange (a second, operator-side record) or drops
// it when the queue has none.
//
// Delivery.Delivered is x-delivery-count + 1 on a quorum queue, 1 for a
// first delivery from any queue, and 0 (unknown) for a redelivery from a
// classic queue, which Delivery.Redelivered marks. Either way the inbox
// tells a redelivery, and bounds a message that kills the consuming
// process: the connection's end returns the delivery to the queue at
// once, and after postbox.Config.MaxCrashes runs in a row that never
// returned, its next delivery becomes a consumer dead message.
//
// The Subscriber does not promise per-key order (OrderPerKey in the
// broker suite). With PerKey it processes one delivery per key at a time,
// in the order it received them, but a requeued delivery goes back to
// the queue while the key's next message may already be processed;
// competing consumers of one queue split a key's messages between them;
// and a connection loss returns every unacknowledged delivery to the
// queue at once. The inbox still applies every message exactly once;
// handlers that depend on per-key order must check it themselves (a
// version column, say) when consuming from RabbitMQ.
//
// # What a confirm is worth
//
// A confirm is only as durable as the queues behind it (docs/design.md §8). For
// a persistent message routed to a quorum queue, RabbitMQ confirms once a
// majority of the queue's replicas have written it to disk (fsynced). A
// classic queue confirms a persistent message once it is on its one
// node's disk: that node's loss loses it. A transient message (this
// package never sends one) is lost on any restart. Declare consumer
// queues as quorum queues (EnsureTopology's default) on a cluster of
// three nodes for a confirm that survives the loss of a node.
//
// The mandatory flag is what stops an unroutable message from being
// confirmed: without it the broker acknowledges a message that reached no
// queue, and the relay would mark it published while it is gone. It is
// set on every publish unless Config.DisableMandatory.
//
// On a quorum queue, RabbitMQ 4 dead-letters or drops a message after 20
// redeliveries by default (x-delivery-limit), before the inbox's budget
// of 25 attempts is spent; set Topology.DeliveryLimit above it (or -1)
// there. RabbitMQ 3.x has no default limit.
package postboxamqp

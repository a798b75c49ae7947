// Package postboxnats publishes postbox messages to NATS JetStream and
// consumes them into an inbox.
//
// A Publisher is the relay's postbox.Publisher for JetStream: each
// envelope becomes one JetStream message, published asynchronously, and
// counts as published only once JetStream's PubAck arrives (guarantee G3 of docs/design.md).
//
//	nc, _ := nats.Connect(url)
//	js, _ := jetstream.New(nc)
//	_, err := postboxnats.EnsureStream(ctx, js, jetstream.StreamConfig{
//		Name:       "EVENTS",
//		Subjects:   []string{"events.>"},
//		Replicas:   3,
//		Duplicates: 2 * time.Minute,
//	})
//	pub, err := postboxnats.New(js, &postboxnats.Config{SubjectPrefix: "events."})
//	defer pub.Close(ctx)
//	client, err := postbox.NewClient(postboxpgx.New(pool), &postbox.Config{Publisher: pub})
//
// # The message on the wire
//
// The subject is SubjectPrefix followed by the topic ("events." and
// "orders.created" give "events.orders.created"), or whatever
// Config.Subject returns. The payload is the data, unchanged. Every
// envelope header becomes a NATS header of the same name: the CloudEvents
// attributes in binary mode (ce-id, ce-type, ce-source, ce-time,
// ce-specversion, ce-partitionkey) and content-type. The message id goes
// in Nats-Msg-Id (G7), so every retry of a message carries the id
// JetStream deduplicates on, and a retry inside the stream's Duplicates
// window is acknowledged with Duplicate set instead of stored twice; the
// Publisher counts such an ack as success, since the message was stored
// before. Headers named Nats-* are refused: they steer JetStream
// (Nats-Rollup purges, Nats-Expected-* makes the store conditional) and
// only the Publisher sets them.
//
// # Topology is explicit
//
// Publish never creates a stream. EnsureStream creates or updates one, as
// a deploy or start-up step. A message whose subject no stream captures
// fails as a message failure wrapping ErrNoStream: it spends an attempt,
// backs off, and ends in the dead table after the attempt budget, visible
// and requeueable once the stream exists.
//
// # Failures
//
// done gets nil on a PubAck, and otherwise an error the relay sorts by
// postbox.IsPermanent and postbox.IsMessageError (docs/design.md §4); the
// Publisher wraps what the server can never accept from the message with
// postbox.Permanent (the relay buries it at once), and every other message
// failure with postbox.NewMessageError:
//
//	failure                                           class           error
//	PubAck (Duplicate or not)                         success         nil
//	payload + headers over the server's max_payload   permanent       nats.ErrMaxPayload
//	over the stream's max_msg_size, headers > 64 KiB  permanent       *jetstream.APIError 10054, 10097
//	over the file store's record limit                permanent       *jetstream.APIError 10077
//	invalid subject (topic mapping, Subject func)     permanent       ErrInvalidSubject
//	invalid or Nats-* header, a key with CR or LF     permanent       ErrInvalidHeader
//	  (it travels in ce-partitionkey), empty id                       ErrNoID
//	expected stream mismatch, sealed stream           message         *jetstream.APIError 10060, 10109
//	no answer, and the server says no stream matches  message         ErrNoStream
//	no answer, and the stream lookup fails            infrastructure  jetstream.ErrNoStreamResponse + lookup error
//	no answer, though a stream captures the subject   infrastructure  jetstream.ErrNoStreamResponse
//	no PubAck within PublishTimeout                   infrastructure  jetstream.ErrAsyncPublishTimeout
//	connection lost while awaiting the ack            infrastructure  nats.ErrDisconnected
//	connection closed, reconnect buffer full          infrastructure  nats.ErrConnectionClosed, ...
//	stream full (DiscardNew), resources, offline      infrastructure  *jetstream.APIError
//	the publish's context ended                       infrastructure  ctx.Err()
//	Publisher closed                                  infrastructure  ErrClosed
//	anything else                                     infrastructure
//
// The Publisher is a postbox.MessageChecker: a Client whose route leads to
// it refuses at write time, with a *postbox.ValidationError, what it could
// tell from the message alone: an invalid subject (a topic with an empty
// token, such as "a..b", ".a" or "a."), a header or key NATS cannot carry,
// and, once connected, a payload that with its headers is over the
// server's max_payload. What only the stream knows (max_msg_size) is
// dead at the first publish.
//
// "No answer" (no responders) is ambiguous: no stream captures the
// subject, or the stream exists but has no leader yet, or JetStream is
// still starting. Only the first is the message's fault, so the Publisher
// asks the server (StreamNameBySubject) before it blames the message, and
// blames the broker when the server cannot say. Unknown errors count as
// infrastructure on purpose: a pause can delay a message, an attempt can
// bury it.
//
// # What an ack is worth
//
// A PubAck is only as durable as the stream behind it (docs/design.md §8). A
// single server acknowledges once the message is written to the
// operating system and fsyncs every sync_interval (two minutes by
// default): a machine crash or power loss can drop messages that were
// acknowledged, and so marked published, in that interval. For an ack
// that survives a machine loss, either run the server with
// "sync_interval: always" (every write is fsynced before the ack, at a
// cost in throughput) or use a clustered stream with Replicas: 3, where
// the ack means a quorum stored the message. The client cannot see the
// server's sync_interval, so this cannot be checked from here; the
// stream's Replicas can, in its StreamInfo.
//
// Deduplication has a window too: Duplicates on the stream (two minutes
// by default). Keep it at least as long as the relay's redelivery
// horizon, the time a message can take to be sent again after its ack
// was lost (the relay's infrastructure pause, its BatchDeadline, and its
// LeaseDuration when a relay dies mid-batch; under a minute at postbox's
// defaults). A copy sent after the window is stored again, and the
// consumers' inbox (G6) absorbs it.
//
// # Consuming
//
// A Subscriber is the consumer side: it pulls from a durable JetStream
// consumer and hands each delivery to a postbox.Processor, normally
// Inbox.Processor, which runs the handler in a transaction together with
// the inbox record (exactly-once effect, G6). The consumer is topology,
// made once with EnsureConsumer (or by the operator); subscribing creates
// nothing.
//
//	cons, err := postboxnats.EnsureConsumer(ctx, js, "EVENTS", jetstream.ConsumerConfig{
//		Durable:       "billing",
//		FilterSubject: "events.orders.>",
//		AckWait:       time.Minute, // longer than the slowest handler
//		MaxDeliver:    -1,          // the inbox decides when a message is dead
//	})
//	stream, err := js.Stream(ctx, "EVENTS")
//	sub, err := postboxnats.NewSubscriber(cons, &postboxnats.SubscriberConfig{
//		SubjectPrefix: "events.",
//		PerKey:        true,   // one key's messages one at a time, in stream order
//		Stream:        stream, // keeps that order when a delivery is lost on the way
//	})
//	client, err := postbox.NewClient(postboxpgx.New(pool), nil)
//	inbox := client.Inbox()
//	err = sub.Run(ctx, inbox.Processor("billing", handle))
//
// Each delivery's Verdict settles it:
//
//	verdict        what the Subscriber does
//	Ack            DoubleAck: ack and wait for the server's confirmation
//	Retry          NakWithDelay(Delay): the server redelivers after the delay
//	DeadLettered   DoubleAck: the dead message is in the inbox's table
//	(no id)        Term: never redelivered; logged with its stream sequence
//
// The ack is sent only after Process returned, so after the handler's
// transaction committed. If the consumer dies in between, the message
// comes back after AckWait and the inbox absorbs it as a copy. A message
// whose ack is not confirmed is logged and comes back the same way.
//
// The delivery's id is the Nats-Msg-Id header, else ce-id. A message
// with neither (not sent by postbox) could not be recorded by an inbox
// and would be dead-lettered under no name of its own, so it is
// terminated with an error log naming its stream sequence; it stays in
// the stream as long as the stream keeps it.
//
// MaxDeliver must be -1 or well above the inbox's MaxAttempts: the
// server drops a message that reaches MaxDeliver from the consumer with
// no trace but an advisory, where the inbox would have dead-lettered it
// visibly. AckWait bounds one handler run; see EnsureConsumer.
//
// MaxDeliver can stay -1 also for a message that kills the consuming
// process: the inbox reads Delivery.Delivered (NumDelivered), counts the
// run of every redelivery before its handler, and after
// postbox.Config.MaxCrashes runs that never returned since its last
// counted failure, dead-letters
// the message on its next delivery (docs/design.md §4). Deliveries the
// server makes without a handler run (a held message handed back, a pull
// by a process that died first) count nothing. The bound needs a server
// whose count is true: nats-server before 2.10.14 (Debian 12 ships 2.9.10)
// can send a message again with NumDelivered 1 after the process it was
// delivered to died (nats-server#5305), and that run, taken for a first
// delivery, is not counted; so with such a server a message that kills the
// process ends it once more for each such copy.
//
// # Order per key
//
// With SubscriberConfig.PerKey, deliveries that share a key
// (ce-partitionkey) are handled one at a time in stream order, retries
// included; keyless ones stay parallel. JetStream alone does not keep
// that order: a nak'd message is redelivered when its delay is up, after
// later messages of its key may already have been delivered. The
// Subscriber therefore keeps the key's later messages in memory,
// unacknowledged and kept alive with InProgress, until the earlier one
// is acked or dead-lettered. At most half of MaxInFlight is spent on
// such held messages; beyond that a later message is handed back to the
// server (one extra delivery, counted by MaxDeliver) with a delay that
// brings it back about when its turn comes: after the messages ahead of it
// in its key have run, at the pace runs have taken (at most 2 s more),
// and their retries' delays. A retried message whose redelivery has not come
// after its delay plus twice AckWait is looked up: when the consumer's
// ack floor has passed it (another subscriber acknowledged it, or it was
// deleted from the stream) it is given up with a warning and its key
// moves on; otherwise the server still holds it pending and will send it
// again (late when the consumer's leader moved, or when the deliveries
// before were lost), so its key waits another such wait, with a warning
// each time. Under MaxDeliver, whose last delivery the server drops
// without acknowledging it, the message is given up then all the same.
// A server that was out of reach may have lost the nak, or restarted and
// begun its redelivery wait again, so a failed ack (acks wait for the
// server) pushes the wait out to a whole one from then; so does a nak or
// keep-alive the client refuses, or a failed look-up.
//
// A delivery can also be lost on the way: the server sent it, counted it
// as delivered, and the connection through a node that failed or was cut
// off from its cluster dropped it. The server sends it again only after
// AckWait, when later messages of its key have been delivered. With
// SubscriberConfig.Stream set, the Subscriber sees the gap in the
// consumer's delivery numbers (Sequence.Consumer), reads the lost
// messages' keys from the stream, and holds those keys, as behind a
// retried message, until the messages come back; other keys go on. While
// the stream cannot be read (its leader cut off), every key waits, until
// it can be or a retried message's whole wait has passed.
// Without Stream a gap is logged and its keys' order may break, so set it
// wherever the server is a cluster.
//
// The order holds within one Run. It does not hold across competing
// subscribers of one consumer, which JetStream hands different messages
// of one key; for per-key order, run one Subscriber (one Run) per durable
// consumer at a time, and start a replacement only once it has stopped.
// (Competing subscribers also slow each other: a retried message that
// another one took holds its key here until the consumer's ack floor has
// passed it.)
// Nor does it hold across a restart: messages held when a Run ends are
// redelivered after AckWait, and one of them may come back before an
// earlier message of its key whose retry delay is longer.
//
// # Shutdown
//
// Run returns nil when its context ends, once the deliveries being
// processed have finished (the context is theirs too, so a transaction
// that had not committed rolls back and the message is nak'd) and been
// settled; deliveries pulled but not started are left to AckWait. Run
// returns an error when the subscription fails for good: the connection
// closed, the consumer deleted.
//
// # Costs
//
// Acks are awaited without a goroutine per message: the Publisher's own
// JetStream context carries ack and error handlers, and a map from
// message to callback. done is called on a NATS client goroutine and must
// not block. A stream lookup (one per subject at a time) and the report
// of a timed-out publish run on goroutines of their own; Close waits for
// them.
//
// A Subscriber's Run has one goroutine pulling, one per delivery being
// processed (at most MaxInFlight), and with PerKey one more that keeps
// held messages alive; all have ended when Run returns. Here and above,
// MaxInFlight is a Run's window: the configured one, or, when it was
// left at its default, a larger one the Processor asks for
// (postbox.InFlightHinter, as Inbox.BatchProcessor does). Each ack costs a
// round trip to the server, paid concurrently by the deliveries in
// flight.
package postboxnats

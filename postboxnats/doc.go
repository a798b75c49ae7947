// Package postboxnats publishes postbox messages to NATS JetStream.
//
// A Publisher is the relay's postbox.Publisher for JetStream: each
// envelope becomes one JetStream message, published asynchronously, and
// counts as published only once JetStream's PubAck arrives (guarantee G3).
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
// postbox.IsMessageError (see Classify):
//
//	failure                                           class           error
//	PubAck (Duplicate or not)                         success         nil
//	payload + headers over the server's max_payload   message         nats.ErrMaxPayload
//	over the stream's max_msg_size, headers > 64 KiB  message         *jetstream.APIError 10054, 10097
//	expected stream mismatch, sealed stream           message         *jetstream.APIError 10060, 10109
//	invalid subject (topic mapping, Subject func)     message         ErrInvalidSubject
//	invalid or Nats-* header, empty id                message         ErrInvalidHeader, ErrNoID
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
// A PubAck is only as durable as the stream behind it (DESIGN §8). A
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
// # Costs
//
// Acks are awaited without a goroutine per message: the Publisher's own
// JetStream context carries ack and error handlers, and a map from
// message to callback. done is called on a NATS client goroutine and must
// not block. A stream lookup (one per subject at a time) and the report
// of a timed-out publish run on goroutines of their own; Close waits for
// them.
package postboxnats

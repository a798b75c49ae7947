// Package postboxkafka publishes postbox messages to Apache Kafka and
// consumes them into an inbox, over franz-go (github.com/twmb/franz-go).
//
// A Publisher is the relay's postbox.Publisher: each envelope becomes one
// Kafka record, produced by an idempotent producer with acks=all, and
// counts as published only once the partition leader acknowledged it
// after every in-sync replica stored it (guarantee G3 of docs/design.md). A Subscriber is a
// postbox.Subscriber: a consumer-group member that hands each record to a
// Processor, usually Inbox.Processor, and commits a partition's offset
// only once the record and every earlier one of the partition are
// settled.
//
//	cl, _ := kgo.NewClient(kgo.SeedBrokers("k1:9092", "k2:9092", "k3:9092"))
//	err := postboxkafka.EnsureTopic(ctx, cl, "orders.changed", 12, 3, map[string]string{
//		"min.insync.replicas":            "2",
//		"unclean.leader.election.enable": "false",
//	})
//	pub, err := postboxkafka.New(cl, nil)
//	defer pub.Close(ctx) // before cl.Close
//	client, err := postbox.NewClient(postboxpgx.New(pool), &postbox.Config{Publisher: pub})
//
//	sub, err := postboxkafka.NewSubscriber("billing", []string{"orders.changed"}, nil,
//		kgo.SeedBrokers("k1:9092", "k2:9092", "k3:9092"))
//	err = sub.Run(ctx, inbox.Processor("billing", handle))
//
// # The record on the wire
//
// The Kafka topic is the postbox topic, with Config.TopicPrefix in front,
// or whatever Config.Topic returns; it must be a valid Kafka topic name
// (ValidateTopicName: ASCII letters, digits, '.', '_', '-', at most 249
// bytes). Postbox topics may hold ':', which Kafka forbids: such a topic
// fails as a message failure (ErrInvalidTopic) unless Config.Topic maps
// it. Publisher.KafkaTopic tells an application at write time whether a
// topic can be delivered.
//
// The record key is the message key, so one key's messages land in one
// partition, in order (franz-go's default partitioner hashes keys with
// murmur2, as the Java client does; keep a key-hashing partitioner). A
// keyless message has no key (null), and the partitioner spreads keyless
// records over the partitions. The value is the payload, unchanged; an
// empty payload is an empty value, never a null one, which a compacted
// topic would take as a tombstone.
//
// The record timestamp is the time of the publish, not the time the
// message was written. Kafka deletes by timestamp: with a topic's
// retention.ms of, say, 7 days, a relay that catches up on a backlog
// written 8 days ago would otherwise produce records that retention
// deletes on arrival, before any consumer saw them. The write time
// travels in ce_time.
//
// Headers follow the CloudEvents Kafka protocol binding in binary mode:
// each CloudEvents attribute is a header named "ce_" plus the attribute
// (ce_id, ce_specversion, ce_type, ce_source, ce_time, ce_subject,
// ce_partitionkey), and datacontenttype is the content-type header. ce_id
// is the message id (G7): the same on every retry, and what the inbox
// deduplicates on. Other headers (traceparent, the application's own)
// keep their names. A header named "ce_..." that is not a CloudEvents
// attribute would be read back as one, so it is refused (ErrInvalidHeader).
//
// The Subscriber maps it back: ce_X becomes ce-X, the id comes from ce_id,
// the topic from ce_type (the relay sets it to the postbox topic) and the
// key from ce_partitionkey, falling back to the record key. A record
// without ce_id (from another producer) gets the id
// "kafka/<topic>/<partition>/<offset>", stable for as long as the record
// exists, so the inbox still applies it once.
//
// # Topology is explicit
//
// Publishing and subscribing create nothing: New and Run refuse a client
// with kgo.AllowAutoTopicCreation, and never ask for a topic to be
// created. EnsureTopic creates a topic (or checks and updates an existing
// one) as a deploy or start-up step. A message for a topic that does not
// exist fails as a message failure wrapping ErrNoTopic, once a metadata
// lookup confirms the topic is missing: it spends an attempt, backs off,
// and ends in the dead table after the budget, visible and requeueable
// once the topic exists. The client reports a topic as unknown after
// kgo.UnknownTopicRetries metadata loads (4 by default, about a second);
// with -1 it never does, and such messages time out as infrastructure
// failures instead, pausing the relay. Run returns ErrNoTopic for a
// missing topic.
//
// # Failures
//
// done gets nil on the acknowledgement, and otherwise an error the relay
// sorts by postbox.IsPermanent and postbox.IsMessageError (docs/design.md
// §4); the Publisher wraps what Kafka can never accept from the message
// with postbox.Permanent (the relay buries it at once), and every other
// message failure with postbox.NewMessageError:
//
//	failure                                             class           error
//	acknowledged by the leader after all in-sync        success         nil
//	  replicas stored it (acks=all)
//	over the topic's max.message.bytes                  permanent       kerr.MessageTooLarge
//	alone over the client's ProducerBatchMaxBytes       permanent       kerr.MessageTooLarge (before sending)
//	batch over the broker's segment size                permanent       kerr.RecordListTooLarge
//	refused by record validation (keyless message to    message         kerr.InvalidRecord
//	  a compacted topic, ...)
//	topic not writable (internal, invalid)              message         kerr.InvalidTopicException
//	no ACL to write the topic                           message         kerr.TopicAuthorizationFailed
//	refused by a topic policy                           message         kerr.PolicyViolation
//	topic name Kafka forbids, after mapping             permanent       ErrInvalidTopic
//	"ce_" header that is no attribute, non-UTF-8 value  permanent       ErrInvalidHeader
//	no message id                                       permanent       ErrNoID
//	unknown topic, and the cluster says it is missing   message         ErrNoTopic
//	unknown topic, though the lookup finds it           infrastructure  kerr.UnknownTopicOrPartition
//	unknown topic, and the lookup fails                 infrastructure  kerr.UnknownTopicOrPartition + lookup error
//	not enough in-sync replicas, no leader, broker      infrastructure  ErrPublishTimeout (the client retries
//	  timeout, lost connection                                            these until PublishTimeout)
//	no acknowledgement within PublishTimeout            infrastructure  ErrPublishTimeout
//	no ACL for idempotent writes                        infrastructure  kerr.ClusterAuthorizationFailed
//	timestamp refused (the relay's clock is off)        infrastructure  kerr.InvalidTimestamp
//	the client's RecordRetries or                       infrastructure  kgo.ErrRecordRetries, kgo.ErrRecordTimeout
//	  RecordDeliveryTimeout spent
//	client closed                                       infrastructure  kgo.ErrClientClosed
//	the publish's context ended                         infrastructure  ctx.Err()
//	Publisher closed                                    infrastructure  ErrClosed
//	anything else                                       infrastructure
//
// A refused write permission counts against the message, like a missing
// topic: it concerns that topic only, and as an infrastructure failure it
// would pause the relay for every topic and route until an operator
// granted it. Unknown errors count as infrastructure on purpose: a pause
// can delay a message, an attempt can bury it.
//
// The broker refuses a record batch as a whole. The client batches
// records of one partition, so a refusal of a batch (over
// max.message.bytes, an invalid record) fails every message in it, each
// spending an attempt; the innocent ones succeed on their next attempt.
// Keep kgo.ProducerBatchMaxBytes at or under the topics' max.message.bytes
// (franz-go's default of about 1 MB is under Kafka's default), so that only
// a message too large on its own is ever refused for size, by the client,
// alone. CheckTopic reports a topic where this does not hold.
//
// # Settings for a real cluster
//
// An acknowledgement is only as durable as the topic behind it (docs/design.md
// §8). With acks=all the leader acknowledges once every replica in the
// in-sync set has the record, and min.insync.replicas is the smallest
// in-sync set it accepts a write with. For a message that survives the
// loss of a broker:
//
//   - replication factor 3 or more (EnsureTopic's replicationFactor, or
//     default.replication.factor);
//   - min.insync.replicas 2 or more, and under the replication factor, so
//     that one broker down does not stop writes (with 3 and 2, one broker
//     can be lost without losing writes or acknowledged messages);
//   - acks=all and idempotence: franz-go's defaults, which New enforces
//     (it refuses kgo.RequiredAcks other than kgo.AllISRAcks,
//     kgo.DisableIdempotentWrite and
//     kgo.AllowIdempotentProduceCancellation). Idempotence keeps the
//     client's own retries of a produce from storing a record twice or out
//     of order; it does not drop a message the relay publishes again,
//     which the inbox absorbs;
//   - unclean.leader.election.enable=false (Kafka's default): an
//     out-of-sync replica must never become leader, or acknowledged records
//     are lost;
//   - message.timestamp.type=CreateTime (the default; the record timestamp
//     is the publish time, see above) or LogAppendTime, which is about the
//     same; and retention.ms longer than the longest a consumer group may
//     be stopped or held back, because retention deletes by time whether
//     or not a group consumed the record. The relay's own backlog does not
//     count against it: its records are stamped when published;
//   - no compaction (cleanup.policy=delete, the default): compaction keeps
//     only the latest record of a key, and postbox keys order a stream of
//     messages, each of which matters.
//
// CheckTopic reads a topic's replicas and configs and lists the settings
// that weaken the above; run it at start-up and log what it reports.
// Adding partitions to a topic moves keys to other partitions: while the
// old and the new partition both hold messages of a key, consumers may
// handle them out of order. EnsureTopic never changes a partition count.
//
// # Subscribers: commits, retries and order
//
// A Subscriber joins a consumer group (kgo.ConsumerGroup) with automatic
// commits off. Each assigned partition has one worker that processes its
// records one at a time, in offset order, at most MaxInFlight at once
// across partitions. A record is settled when its Verdict is Ack or
// DeadLettered, that is after the handler's transaction committed (or the
// inbox wrote its dead message); a partition's offset is committed only up
// to its last settled record, by a committer that gathers what settled
// each CommitInterval into one commit. A member that dies between its
// handler's commit and the offset commit leaves those records to be
// delivered again: the inbox absorbs them.
//
// Kafka has no redelivery. For a Retry verdict the partition's worker
// keeps the record and waits for the verdict's Delay (at most
// MaxRetryHold), then processes the same record again with
// Delivery.Delivered one higher; Delivered counts this member's attempts
// and starts again at 1 on another member. Later records of the partition
// wait behind it, so a message that keeps failing holds its partition
// through the inbox's backoff until it is dead-lettered (MaxAttempts,
// BackoffMax bound that). Fetching goes on meanwhile until PartitionBuffer
// records wait, and then pauses.
//
// Rebalances: polls and rebalance callbacks exclude each other
// (kgo.BlockRebalanceOnPoll, released as soon as a poll's records are
// queued). When partitions are revoked, their workers finish the record in
// hand (a held retry is cut short), the settled offsets are committed, and
// only then does the group hand the partitions on; the next owner starts
// after the last settled record. Handlers that run longer than the group's
// rebalance timeout (kgo.RebalanceTimeout, 60s by default) get the member
// removed from the group instead. A member that loses its partitions
// without a revocation (its session expired) commits nothing; the next
// owner starts from the last commit, and the inbox absorbs the copies.
//
// Order per key holds through all of this: a key's records are in one
// partition, a partition is processed in offset order by one worker at a
// time, and its next owner starts at the first record not settled. Even
// when two members briefly process one partition (the old owner's session
// expired while it was still processing), the inbox's row for a message id
// serializes them: the second copy waits for the first copy's transaction
// and then finds it done, so the handlers' effects stay in the key's order.
//
// Run returns nil when its context ends, after committing what is settled
// and leaving the group (bounded by CommitTimeout).
package postboxkafka

// Package postboxredis publishes postbox messages to Redis Streams and
// consumes them through consumer groups (github.com/redis/go-redis/v9).
// It needs Redis 7.0 or later.
//
// A Publisher is the relay's postbox.Publisher: each envelope becomes one
// stream entry, added by a script that also guards against adding the
// same message twice, and counts as published once Redis replied that
// the entry is stored (guarantee G3 of docs/design.md; see "What a reply is worth" for
// what that survives). A Subscriber is a postbox.Subscriber: it reads a
// consumer group with XREADGROUP, hands each entry to a Processor
// (usually Inbox.Processor) and acknowledges it with XACK after the
// handler's transaction committed.
//
//	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
//	err := postboxredis.EnsureGroup(ctx, rdb, "events:orders.created", "billing", postboxredis.StartAtBeginning)
//
//	pub, err := postboxredis.New(rdb, &postboxredis.Config{StreamPrefix: "events:"})
//	defer pub.Close(ctx)
//	client, err := postbox.NewClient(postboxpgx.New(pool), &postbox.Config{Publisher: pub})
//
//	sub, err := postboxredis.NewSubscriber(rdb, &postboxredis.SubscriberConfig{
//		Stream: "events:orders.created", Group: "billing", PerKey: true,
//	})
//	err = sub.Run(ctx, inbox.Processor("billing", handle))
//
// # The entry in the stream
//
// The stream is Config.StreamPrefix followed by the topic (one stream per
// topic), or Config.Stream for every topic. Redis makes the entry id
// (XADD *); the message's own id travels in a field. Every entry has the
// same five fields, in this order, so that Redis stores the names once
// per node of the stream rather than once per entry:
//
//	id       the message id (G7: the same on every retry)
//	topic    the topic
//	key      the ordering key, "" for none
//	payload  the payload, byte for byte
//	headers  a JSON object of the headers: the CloudEvents attributes in
//	         binary mode (ce-id, ce-type, ce-source, ce-time,
//	         ce-specversion, ce-partitionkey), content-type and the
//	         message's own headers
//
// One JSON field rather than a field per header keeps the set of field
// names fixed (a field per header would vary it from entry to entry, and
// cost the compaction), and lets a reader in any language take every
// header with one decode. A header name or value that is not valid UTF-8
// cannot travel in JSON unchanged, and fails the message (ErrInvalidHeader).
//
// # Topology is explicit
//
// Publishing creates no stream: the script that adds an entry checks the
// key's type first, and a message whose stream does not exist fails as a
// message failure (ErrNoStream): it spends an attempt, backs off, and
// ends in the dead table after the attempt budget, visible and
// requeueable once the stream exists. Subscribing creates no group: Run
// fails with ErrNoGroup when its first read finds none. EnsureGroup
// creates a group, and its stream with it (XGROUP CREATE ... MKSTREAM), as
// a deploy or start-up step; it is idempotent.
//
// # Deduplication
//
// Redis has no deduplication of its own: XADD always adds. The Publisher
// adds a guard: the script that adds the entry first looks for a key
// named after the stream and the message id
// ("{<stream>}:postbox:dedupe:<id>", in the stream's hash slot), and if
// it exists reports success without adding anything; otherwise it adds
// the entry and sets the key, holding the entry id, to expire after
// Config.DedupeWindow (two minutes by default). Both happen in one
// script, atomically. A publish that succeeded but whose reply was lost
// (a timeout, a dropped connection, the client's own retry of a
// pipeline) is sent again by the relay with the same id, and absorbed.
//
// The guard costs one small key per message for the window: about 100
// bytes each, so 12 MB at 1,000 messages a second and two minutes. Keep
// the window at least as long as the relay's redelivery horizon (its
// infrastructure pause, its BatchDeadline, and its LeaseDuration when a
// relay dies mid-batch: under a minute at postbox's defaults). A copy
// sent after the window is added again, and the consumers' inbox (G6)
// absorbs it. Config.DisableDedupe turns the guard off.
//
// # Pipelining
//
// Publish queues the message and returns. A few goroutines of the
// Publisher (Config.Pipelines) each take whatever queued up while they
// were busy, up to Config.MaxBatch, and send it as one pipeline of
// EVALSHA calls (falling back to EVAL when the server has lost its
// script cache, after a restart or a failover): the relay's hundreds of
// outstanding publishes cost a few round trips, not a connection each.
// Config.MaxPending bounds the publishes awaiting their reply.
//
// # Failures
//
// done gets nil once Redis replied that the entry is stored (or that the
// guard found it stored before), and otherwise an error the relay sorts
// by postbox.IsPermanent and postbox.IsMessageError (docs/design.md §4);
// the Publisher wraps what Redis can never accept from the message with
// postbox.Permanent (the relay buries it at once), and every other message
// failure with postbox.NewMessageError:
//
//	failure                                             class           error
//	entry added, or found by the dedupe guard           success         nil
//	the stream does not exist                           message         ErrNoStream
//	the stream's key holds another type (WRONGTYPE)     message         ErrWrongType
//	invalid stream name (topic mapping)                 permanent       ErrInvalidStream
//	entry over Config.MaxEntryBytes                     permanent       ErrTooLarge
//	argument over the server's proto-max-bulk-len       permanent       error reply
//	header not valid UTF-8; empty or bad message id     permanent       ErrInvalidHeader, ErrNoID
//	CROSSSLOT                                           message         error reply
//	connection refused, reset, EOF, network timeout     infrastructure  net / io errors
//	no reply within Config.PublishTimeout               infrastructure  ErrPublishTimeout
//	fewer replicas than Config.MinReplicas (WAIT)       infrastructure  ErrNotReplicated
//	LOADING, READONLY, MASTERDOWN, CLUSTERDOWN,
//	TRYAGAIN, NOREPLICAS, BUSY                          infrastructure  error reply
//	OOM (maxmemory reached)                             infrastructure  error reply
//	NOAUTH, WRONGPASS, NOPERM, max number of clients    infrastructure  error reply
//	client closed, connection pool timeout              infrastructure  redis.ErrClosed, redis.ErrPoolTimeout
//	the publish's context ended                         infrastructure  ctx.Err()
//	Publisher closed                                    infrastructure  ErrClosed
//	anything else                                       infrastructure
//
// The Publisher is a postbox.MessageChecker: a Client whose route leads to
// it refuses at write time, with a *postbox.ValidationError, an entry over
// MaxEntryBytes, a stream name it refuses and a header that is not UTF-8.
//
// A message failure is one that the same message would meet again; a
// server state that passes (loading a dataset, a replica not yet
// promoted, memory full, a busy script) or a setting an operator must
// fix (credentials, ACLs) spends no attempt and pauses the relay.
// Unknown errors count as infrastructure on purpose: a pause can delay a
// message, an attempt can bury it.
//
// # Subscribers
//
// A Subscriber reads one stream through one group; each Run is a
// consumer of the group, named per Run unless SubscriberConfig.Consumer
// names it, and the group's consumers share its entries. Every group gets
// every entry. XREADGROUP asks for at most the free places of
// SubscriberConfig.MaxInFlight and blocks for SubscriberConfig.Block.
// Here and below, MaxInFlight is a Run's window: the configured one, or,
// when it was left at its default, a larger one the Processor asks for
// (postbox.InFlightHinter, as Inbox.BatchProcessor does).
//
// Ack and DeadLettered verdicts acknowledge the entry (XACK, tried again
// while Redis does not answer). The inbox wrote its dead message first;
// the stream keeps the entry until it is trimmed.
//
// Retry: Redis has no delayed redelivery (an unacknowledged entry stays
// pending until someone claims it). The Run holds the entry, with its
// fields, for the verdict's delay, keeps it from being claimed meanwhile,
// and then delivers it again itself, after raising its delivery count in
// the group (XCLAIM RETRYCOUNT), as a redelivery would (DelayedRedelivery
// in the broker suite). Held entries take places of MaxInFlight.
//
// Claiming: an entry read by a subscriber that died stays pending under
// its consumer. At its start and every SubscriberConfig.ClaimInterval, a
// Run claims entries pending for SubscriberConfig.MinIdle (XAUTOCLAIM)
// and processes them. A live Run keeps the entries it holds (processing,
// held for a retry, queued behind their key) from being claimed by
// resetting their idle time every MinIdle/3 (XCLAIM JUSTID, after
// checking that it still owns them), so a slow handler is not raced by a
// copy. When Run ends it hands back what it still holds: claimable at
// once, or, for a Retry, when its delay is over. Every Run also deletes,
// now and then, the group's consumers that have nothing pending and were
// idle for SubscriberConfig.IdleConsumerTTL (Runs that died, once their
// entries were claimed), and deletes its own consumer when it ends with
// nothing pending.
//
// Delivery.Delivered is the group's delivery count of the entry: 1 for a
// first read, raised by every claim and every retry. With it the inbox
// bounds an entry that kills the consuming process: another subscriber
// claims the dead one's entry after MinIdle, and after
// postbox.Config.MaxCrashes runs in a row that never returned, the
// entry's next delivery becomes a consumer dead message.
//
// # Order per key
//
// With SubscriberConfig.PerKey a Run processes the entries of one key one
// at a time, in stream order, a retry included: a later entry waits while
// an earlier one is processed or waits out its delay (OrderPerKey in the
// broker suite). The relay adds a key's entries in write order, so a
// single Run handles each key's messages in write order. The order holds
// within one Run only:
//
//   - Competing Runs of one group split a key's entries between them, and
//     process them at once. For per-key order across many subscribers,
//     give each a stream of its own (a stream per key range, mapped by
//     topic) or handle order in the handler (a version column).
//   - An entry claimed from a Run that died is older than the entries of
//     its key read since, which may have been processed already.
//   - A Run hands its entries back in stream order, so that the Run that
//     claims them gets a key's head first, but a claim pass that starts
//     mid-way through a long pending list may take a later entry first.
//
// Entries queued behind their key take places of MaxInFlight, at most
// half of them: past that, a queued entry's fields are dropped from
// memory (it stays pending and held, in its place in its key's queue)
// and fetched back when its turn comes. A key whose head waits out a
// long retry so cannot stop the Run from processing other keys.
//
// # What a reply is worth
//
// Redis replies once the entry is in memory (docs/design.md §8). Whether it
// outlives a crash depends on the server's persistence, which
// CheckDurability reads where CONFIG is allowed:
//
//   - No persistence (appendonly no, no snapshots): a restart loses every
//     entry, every group and every dedupe key. The relay marked those
//     messages published; only a replay from the outbox history brings
//     them back.
//   - RDB snapshots only: a crash loses everything since the last
//     snapshot.
//   - appendonly yes with appendfsync everysec (the usual setting): a
//     machine crash can lose about the last second of replies.
//   - appendonly yes with appendfsync always: every write is fsynced
//     before its reply, at a cost in throughput. This is the setting for
//     replies that mean stored.
//
// Replication is asynchronous: a failover to a replica can lose entries
// the old primary acknowledged. Config.MinReplicas ends every pipeline
// with WAIT, so that a publish succeeds only once that many replicas
// have the entry in memory (not on disk), and fails as an infrastructure
// failure otherwise; run the replicas with the append-only file too.
// Redis Cluster is supported (every key of one entry shares the stream's
// slot), except for MinReplicas.
//
// Memory: set maxmemory-policy to noeviction. Any other policy lets Redis
// evict a stream, or a group's pending entries with it, under memory
// pressure; with noeviction a full server refuses writes (OOM), which the
// relay sees as an infrastructure failure and waits out. Config.MaxLen
// trims streams on every add: a trimmed entry is gone for every group,
// also for one that had not read it yet, so size it well above the
// largest backlog a group may fall behind by, or leave it off and trim
// from outside once every group has acknowledged.
package postboxredis

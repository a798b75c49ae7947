package postboxdriver

import (
	"context"
	"time"
)

// Executor is every operation postbox runs against its tables. A Store is
// one, running on the driver's connections; Store.UnwrapExecutor gives one
// running in the caller's transaction. Operations marked "in a
// transaction" are meant for the latter; on a Store's own Executor they run
// in a transaction of their own (savepoints refuse with ErrNotInTx).
//
// Times are the database clock's. Every operation wraps a missing table as
// ErrNotMigrated.
type Executor interface {
	// Dialect names the SQL dialect: "postgres", "mysql" or "sqlite".
	Dialect() string

	// Writing.

	// Insert inserts rows, in one statement where the dialect allows it.
	// The database computes each row's partition (PartitionOf).
	Insert(ctx context.Context, rows []Row) error

	// The relay: membership, leases, reading and recording.

	// Partitions reports the number of partitions the outbox table was
	// migrated with. Rows carry partition = PartitionOf(key, id, n).
	Partitions(ctx context.Context) (int, error)
	// Coordinate is a relay's one round trip to keep its place: it
	// registers relayID as live until now()+ttl; frees drop's leases that
	// relayID holds, so another relay takes them at once; takes or renews
	// the leases on want (those not in drop) until now()+ttl, when free,
	// expired or already relayID's; and returns the membership after all
	// of it: the live relays and every partition's lease. The generation
	// of a partition increases each time its owner changes. A ttl of 0
	// takes relayID out of the live set in the same statement as its
	// releases: a relay leaving does so at once.
	//
	// A lease's Crashed mark says its partition may hold a row whose
	// publish killed a relay: it is set when a lease is taken from an
	// owner whose lease ran out, kept when a lease is released and taken
	// again (the relay releasing it may not have published the suspect
	// rows yet), and cleared on the partitions of settled that relayID
	// holds or releases: those whose crash marks it has settled.
	//
	// A driver that is also a Listener announces a change among the
	// relays (Heard.Relays) when the call registers relayID anew, frees
	// leases or takes relayID out of the live set, and only then: the
	// other relays renew at once instead of at their next renewal.
	Coordinate(ctx context.Context, relayID string, ttl time.Duration, want, drop, settled []int) (Membership, error)
	// Unregister removes relayID from the live set.
	Unregister(ctx context.Context, relayID string) error
	// AcquireLeases takes or renews the leases on partitions for owner until
	// now()+ttl. A partition is taken when it is free, expired or already
	// owner's; others are left alone. The generation of a partition
	// increases each time its owner changes. It returns the leases owner
	// holds among partitions after the call.
	AcquireLeases(ctx context.Context, owner string, partitions []int, ttl time.Duration) ([]Lease, error)
	// ReleaseLeases frees owner's leases on partitions so another relay can
	// take them at once.
	ReleaseLeases(ctx context.Context, owner string, partitions []int) error
	// ExpireLeases passes every partition's lease to owner at a new
	// generation, already expired, as a takeover after a long pause would:
	// the relays holding them are fenced out, and any relay takes them
	// next. It returns how many leases it changed.
	ExpireLeases(ctx context.Context, owner string) (int, error)
	// Fetch reads up to Limit pending rows of the fenced partitions in seq
	// order: available now, and not behind an older row of the same key
	// that is waiting for a retry (or dead, when BlockOnDead is set). It
	// writes nothing.
	Fetch(ctx context.Context, p FetchParams) ([]Record, error)
	// Settle records the outcome of a batch that Fetch read, in one round
	// trip: the rows of o.Published move out of the pending set, recording
	// the publish time; each of o.Failed counts a failed attempt
	// (attempts+1, the error, available_at = now()+Backoff) and moves to the
	// dead messages when attempts reaches maxAttempts or the failure is
	// marked Dead. A dead message of the same id (an id written again after
	// its message died) is replaced by the new one: no row's record may
	// fail the others'. A row that waits for a retry loses its crash mark
	// (NotInFlight): its publish ended, so no crash is laid on it; its
	// crash count stays. Rows of o.Read in neither list were not sent and
	// stay pending, where they were. Only rows whose partition lease still
	// belongs to the fence change. It returns how many rows it marked
	// published and the failures it recorded, with whether each is now dead.
	// Nothing of the outcome is recorded when it returns an error.
	//
	// The outcome is handed whole because a store that keeps a position
	// instead of moving rows (design §3, "The next storage model") must
	// set aside the rows read but not published before its position passes
	// them, in the same statement.
	Settle(ctx context.Context, f Fence, o Outcome, maxAttempts int) (Settled, error)

	// ResolveCrashes reads the crash marks of the rows seqs (fenced like
	// Settle) before a relay that took their partition after an
	// expiry publishes them: a row marked InFlightAlone counts one crash
	// more, a row marked InFlightWithOthers becomes Suspected, and both
	// lose the in-flight mark, so that one crash is counted once; but a
	// mark whose relay (the fence's owner when it marked) is live again,
	// by its heartbeat, is only cleared: that relay was paused or cut off,
	// not dead. It
	// returns the rows that are suspected or were counted in a crash, in
	// seq order; the others are not suspects. It writes only marked rows.
	ResolveCrashes(ctx context.Context, f Fence, seqs []int64) ([]Suspect, error)
	// MarkInFlight sets the crash mark of the rows seqs to mark, fenced
	// like Settle, and clears that of the rows clear
	// (NotInFlight), unfenced: the relay that marked a row clears it once
	// its publish ended, which is true whoever holds the partition by
	// then. One statement; it returns how many rows it changed. It commits
	// before the publish it marks (a crash must find it), and need not
	// wait for a disk flush: a relay's crash keeps a committed mark, and a
	// mark a database crash loses only leaves a crash uncounted.
	MarkInFlight(ctx context.Context, f Fence, seqs []int64, mark InFlight, clear []int64) (int, error)

	// State and maintenance.

	// Stats reports the state of the outbox.
	Stats(ctx context.Context) (Stats, error)
	// TopicStats reports, per topic, what is pending, dead and recently
	// published. Topics with nothing pending, dead or published in the last
	// minute are left out.
	TopicStats(ctx context.Context) ([]TopicStats, error)
	// PrunePublished deletes at most limit published rows older than age
	// (by publish time), one by one. A Store that keeps its history in
	// chunks may also drop whole chunks older than age, whatever rows they
	// hold, and counts those rows too, so the count may pass limit.
	// Pending and dead rows are never touched.
	PrunePublished(ctx context.Context, age time.Duration, limit int) (int, error)
	// PartitionStats reports how many partitions no relay holds a live
	// lease on, and how many relays are live. It only reads.
	PartitionStats(ctx context.Context) (PartitionStats, error)
	// ConsumerDeadStats counts the consumers' dead messages per consumer
	// and topic, ordered by both.
	ConsumerDeadStats(ctx context.Context) ([]ConsumerDeadStat, error)
	// OldestSnapshot reports the oldest transaction of another session
	// that holds a snapshot, if any. Databases without such a horizon
	// (SQLite) report none.
	OldestSnapshot(ctx context.Context) (Snapshot, bool, error)
	// ClaimMaintenance takes or renews the claim on a maintenance task
	// (such as "inbox-prune") for owner until now()+ttl on the database
	// clock, and reports whether owner holds it: a task is taken when it is
	// free, expired or already owner's. Of any number of processes
	// claiming a task at once, at most one holds it while its claim lasts.
	ClaimMaintenance(ctx context.Context, task, owner string, ttl time.Duration) (bool, error)
	// ReleaseMaintenance frees owner's claim on task, so another process
	// may take it at once. A claim owner does not hold is left alone.
	ReleaseMaintenance(ctx context.Context, task, owner string) error
	// DurabilityWarnings says when the database may lose a committed
	// transaction (PostgreSQL with synchronous_commit = off, SQLite below
	// synchronous=FULL): a row the relay published could then vanish in a
	// crash, leaving the broker with an event about a change the database
	// no longer has.
	DurabilityWarnings(ctx context.Context) ([]string, error)
	// CheckConnections reports a set-up of the driver's connections that
	// postbox cannot work with: ErrPooledStatements, PostgreSQL reached
	// through a transaction-pooling pooler (PgBouncer) by a client that
	// prepares named statements, which the pooler loses between
	// transactions; ErrOtherDatabase, a Store's two kinds of connection
	// (postboxsql.WithLog's) on different databases. Nil when there is
	// none. The relay refuses to start on either.
	CheckConnections(ctx context.Context) error

	// Dead messages of the outbox, and replay.

	// ListDeadMessages lists the outbox's dead messages matching f, newest
	// first. f.Consumer is ignored.
	ListDeadMessages(ctx context.Context, f DeadFilter) ([]DeadMessage, error)
	// GetDeadMessage returns one dead message by id, or ErrNotFound.
	GetDeadMessage(ctx context.Context, id string) (DeadMessage, error)
	// RequeueDeadMessages moves the dead messages matching f back to the
	// outbox with their attempts reset and their original seq, so they are
	// published next, in their place among their key's messages. A dead
	// message whose id is pending again (written anew) stays dead and is
	// not counted.
	RequeueDeadMessages(ctx context.Context, f DeadFilter) (int, error)
	// DeleteDeadMessages deletes the dead messages matching f.
	DeleteDeadMessages(ctx context.Context, f DeadFilter) (int, error)
	// Replay moves published messages created in [Since, Until), narrowed
	// by topic and key, back to the outbox under their own ids, in their
	// original order, and records the request in the replay audit. With
	// DryRun it only counts (and audits the count). With AsNew it copies
	// them instead, as new messages (ReplayParams.AsNew), and applies no
	// horizon.
	Replay(ctx context.Context, p ReplayParams) (int, error)
	// ReplayCounts counts, per topic, the messages a replay under their
	// own ids would select (p's window, topic and key; p.DryRun, AsNew,
	// Actor and Horizon ignored), and of those the ones published within
	// the last recent (none when recent is not positive), on the database
	// clock. It records nothing.
	ReplayCounts(ctx context.Context, p ReplayParams, recent time.Duration) ([]ReplayCount, error)
	// ListReplays returns the replay audit, newest first.
	ListReplays(ctx context.Context, limit int) ([]ReplayAudit, error)

	// The inbox.

	// InboxInsert records (consumer, messageID), in a transaction. It
	// reports false, writing nothing, when the record exists (the message
	// is a copy) or when the consumer has a dead message of that id (a
	// late copy of a dead message: the dead message stands until it is
	// requeued or deleted). A copy arriving while the first is still
	// uncommitted waits for it, so at most one handler run per id ever
	// commits.
	InboxInsert(ctx context.Context, consumer, messageID string) (bool, error)
	// InboxInsertMany records (consumer, id) for every id, in a
	// transaction, in one statement where the dialect allows it, and
	// reports for each id, in the order given, whether it was new (as
	// InboxInsert: neither recorded nor dead for the consumer). The
	// records are inserted in id order, so that two transactions recording
	// overlapping sets take the row locks in the same order. ids must hold
	// no duplicates.
	InboxInsertMany(ctx context.Context, consumer string, ids []string) ([]bool, error)
	// InboxDelete deletes the records of ids for consumer, in a
	// transaction: those a batch recorded for messages whose handler then
	// failed, so that their next delivery runs again.
	InboxDelete(ctx context.Context, consumer string, ids []string) error
	// RecordFailure counts a failed handler run for (consumer, messageID)
	// and returns the running totals. It runs outside the handler's
	// transaction, so the count survives its rollback. A failure is an
	// outcome: it sets the message's Crashes count back to zero.
	RecordFailure(ctx context.Context, consumer, messageID, errText string) (Attempts, error)
	// InboxStart records, in one statement outside any transaction, that
	// a handler run of a redelivery of (consumer, messageID) begins, and
	// returns the counts as they stood before it: Crashes is the runs so
	// recorded since the last failure recorded by RecordFailure that were
	// not settled by InboxSettle, that is runs whose process exited before
	// the handler returned (or that are still running).
	InboxStart(ctx context.Context, consumer, messageID string) (Attempts, error)
	// InboxCrashes returns the Crashes count InboxStart would return now,
	// writing nothing: the inbox reads it to know whether a redelivery is
	// a suspect, to run alone, before it counts the run.
	InboxCrashes(ctx context.Context, consumer, messageID string) (int, error)
	// InboxSettle records that a run begun with InboxStart ended with an
	// outcome that records nothing else (a retry that spends no attempt, a
	// store failure): that run no longer counts in the message's Crashes,
	// and the runs counted before it still do. A store failure or an
	// uncounted retry between two crashes must not restart the count, or a
	// message that kills the consumer beside a flapping database would
	// never be bounded.
	InboxSettle(ctx context.Context, consumer, messageID string) error
	// PruneInbox deletes at most limit inbox records (and attempt counts)
	// older than age, and returns how many, leaving the records that
	// InboxKeep holds past now. The inbox runs it under the
	// "inbox-prune" claim (ClaimMaintenance), one process at a time.
	PruneInbox(ctx context.Context, age time.Duration, limit int) (int, error)
	// InboxKeep keeps the records of ids for consumer, in a transaction,
	// at least keep from now on the database clock (forever when keep is
	// negative), so that PruneInbox leaves them however old: the
	// producer's replay horizon (postbox.HeaderReplayHorizon). It never
	// shortens a hold, and ignores ids without a record.
	InboxKeep(ctx context.Context, consumer string, ids []string, keep time.Duration) error

	// Dead messages of consumers.

	// BuryConsumerDead writes a consumer's dead message (d.Consumer set),
	// replacing one for the same (consumer, message id), and forgets its
	// attempts.
	BuryConsumerDead(ctx context.Context, d DeadMessage) error
	// ListConsumerDead lists consumers' dead messages matching f, newest
	// first.
	ListConsumerDead(ctx context.Context, f DeadFilter) ([]DeadMessage, error)
	// GetConsumerDead returns one consumer dead message, or ErrNotFound.
	GetConsumerDead(ctx context.Context, consumer, messageID string) (DeadMessage, error)
	// TakeConsumerDead deletes a consumer dead message and returns it (or
	// ErrNotFound), in a transaction: a requeue runs the handler again in
	// the same one.
	TakeConsumerDead(ctx context.Context, consumer, messageID string) (DeadMessage, error)
	// DeleteConsumerDead deletes one consumer dead message and reports
	// whether it existed.
	DeleteConsumerDead(ctx context.Context, consumer, messageID string) (bool, error)
	// PruneConsumerDead deletes at most limit consumer dead messages older
	// than age.
	PruneConsumerDead(ctx context.Context, age time.Duration, limit int) (int, error)
	// RequestConsumerRequeue marks the consumer dead messages f selects
	// (f.Limit ignored) for a requeue, which the consumer's running Inbox
	// carries out, and returns how many it marked. A message marked again
	// keeps its first request's time.
	RequestConsumerRequeue(ctx context.Context, f DeadFilter) (int, error)
	// ListConsumerRequeues returns at most limit consumer dead messages of
	// the given consumers that are marked for a requeue, oldest request
	// first.
	ListConsumerRequeues(ctx context.Context, consumers []string, limit int) ([]DeadMessage, error)
	// FailConsumerRequeue clears the requeue mark of a consumer dead
	// message whose handler failed again, recording errText as its error,
	// one more attempt and the failure's time. It reports whether the
	// message exists.
	FailConsumerRequeue(ctx context.Context, consumer, messageID, errText string) (bool, error)

	// Savepoints, in a transaction. A savepoint marks a point that
	// RollbackToSavepoint returns to, undoing only what ran after it; on
	// PostgreSQL it also makes a transaction usable again after a failed
	// statement. Savepoints nest: a name used again names the most recent
	// savepoint of that name. name must satisfy ValidSavepointName.

	// Savepoint opens a savepoint called name.
	Savepoint(ctx context.Context, name string) error
	// RollbackToSavepoint undoes everything since the savepoint name was
	// opened, keeping the savepoint itself open.
	RollbackToSavepoint(ctx context.Context, name string) error
	// ReleaseSavepoint ends the savepoint name (and any opened after it),
	// keeping their work.
	ReleaseSavepoint(ctx context.Context, name string) error

	// Idempotency records (postboxidem).

	// LookupIdempotency reads the record of keyHash; found is false when
	// there is none.
	LookupIdempotency(ctx context.Context, keyHash []byte) (rec IdempotencyRecord, found bool, err error)
	// ClaimIdempotency takes a key for a new run and reports whether it
	// did: a fresh record, or a takeover of an expired one, or of one whose
	// claim was released or ran out when the same body comes back. The
	// test and the takeover are one statement, so of two retries racing
	// for a key exactly one gets it.
	ClaimIdempotency(ctx context.Context, c IdempotencyClaim) (bool, error)
	// FinalizeIdempotency stores the response, in the handler's
	// transaction, fenced by the claim token and the processing state. It
	// reports false when the claim is no longer the caller's.
	FinalizeIdempotency(ctx context.Context, r IdempotencyResponse) (bool, error)
	// ReleaseIdempotency marks a claim failed so that a retry may run the
	// request again; status is nil when there was no response. Fenced like
	// FinalizeIdempotency.
	ReleaseIdempotency(ctx context.Context, keyHash []byte, token string, status *int) error
	// PruneIdempotency deletes at most limit expired records, never a
	// claim still held, and returns how many.
	PruneIdempotency(ctx context.Context, limit int) (int, error)

	// Migrations.

	// Migrations lists the dialect's migrations in version order.
	Migrations() []Migration
	// AppliedMigrations returns the versions already applied. A missing
	// migrations table means none.
	AppliedMigrations(ctx context.Context) ([]int, error)
	// ApplyMigration runs one migration and records it, atomically and
	// exclusive of other migrators. Applying an applied version is a no-op.
	ApplyMigration(ctx context.Context, m Migration) error
}

// PartialReader is an Executor whose Fetch can return fewer rows than its
// limit while rows of a fenced partition remain to be read: a read of a
// log by snapshot bands stops at the end of its band, and the rows
// committed after the band's snapshot wait for the next read. It is
// optional. An Executor without it reads its partitions' pending rows in
// seq order up to the limit, so that a read short of its limit read every
// one.
//
// The relay asks it before it ends the crash marks of a partition taken
// after its owner's lease ran out (design §4, "A message that kills the
// relay"): the rows the dead relay had in flight were pending when the
// partition was taken, so they have all been read once a read of the
// partition reads it whole.
type PartialReader interface {
	// ReadWhole reports the fenced partitions of which the read that
	// returned recs read every row pending when it began. It is asked
	// before recs are settled; a read it does not know (settled, or
	// forgotten) read none whole.
	ReadWhole(recs []Record) []int
}

// StorageGuard is an Executor whose database says which storage its
// relays read (design §3, "Switching a database to the log"). It is
// optional. A relay asks CheckStorage before it starts and refuses to
// start on its error, ErrStorageRefused when the database's storage does
// not let this Executor's relay run; the Executor's Coordinate then
// refuses the relay's heartbeat in the same case, with the same error,
// so that a switch racing the start cannot let it through.
type StorageGuard interface {
	CheckStorage(ctx context.Context) error
}

// Warmer is an Executor whose first read on a new database connection
// costs far more than the next ones: the server process the connection
// starts loads the catalog of every table the read touches, and the read
// is prepared and planned on it. It is optional. A relay calls Warm once
// when it starts, before it takes a partition, so that its first batches
// on the partitions it takes (from a relay stopping in a rolling deploy,
// or from one that crashed) do not wait for that while their rows wait to
// be published. An error only costs that wait: the relay logs it and
// starts all the same.
type Warmer interface {
	// Warm readies up to conns connections at once (distinct ones) for
	// reads with p's parameters but its fence, which holds no partition.
	Warm(ctx context.Context, p FetchParams, conns int) error
}

// SettleFetcher is an Executor that can record the publishes of one batch
// and read the next batch in a single round trip. It is optional. A relay
// whose batches are small (a steady trickle rather than a backlog)
// records a batch that only published with its next read, when that read
// comes soon, and so sends one statement a batch instead of two.
type SettleFetcher interface {
	// SettleFetch records o as Settle(ctx, f, o, maxAttempts) does and
	// then reads as Fetch(ctx, p) does; the read never returns a row o
	// published. When the fence refused the record of any of o's
	// publishes it reads nothing: the lease of some partition moved on,
	// and the caller renews before it reads again, as after Settle. o
	// holds no failures: a batch that failed is recorded by Settle. When
	// it returns an error, nothing of o was recorded.
	SettleFetch(ctx context.Context, f Fence, o Outcome, maxAttempts int, p FetchParams) (Settled, []Record, error)
}

// Package postboxdriver is the seam between postbox and a database.
//
// A driver adapts one database client (pgx, database/sql for PostgreSQL,
// MySQL or SQLite) to the operations the Client, the relay, the inbox, the
// operator tools and the Idempotency-Key middleware need. It implements two things:
//
//   - Driver[TTx].Open binds it to a table prefix and returns a Store;
//   - the Store is an Executor on the driver's own connections, and
//     UnwrapExecutor gives the same Executor inside the caller's
//     transaction. Everything postbox runs in a user's transaction (the
//     outbox insert of WriteTx, the inbox record and the savepoints of a
//     handler's transaction, the stored response of an idempotent request)
//     goes through that one step.
//
// Every operation is required: a driver that has the tables has them all.
// Drivers are thin: the semantics live in the postbox package and are
// pinned down by the conformance suite in postboxdrivertest, which every
// driver runs against its real database and which tests the Executor's
// operations directly as well as end to end.
//
// Most programs never use this package directly; they construct a driver
// with postboxpgx.New, postboxsql.New, postboxmysql.New or
// postboxsqlite.New and hand it to postbox.NewClient.
package postboxdriver

import (
	"context"
	"errors"
	"time"
)

// Errors drivers return, wrapped, for states callers act on.
var (
	// ErrNotMigrated means the tables a call needs do not exist yet. Run
	// the migrations (postboxmigrate, or `postbox migrate up`).
	ErrNotMigrated = errors.New("postbox: tables not migrated")
	// ErrNotFound means a dead message or record does not exist.
	ErrNotFound = errors.New("postbox: not found")
	// ErrBeyondHorizon is returned by Replay for a window that starts
	// before the horizon: re-sending messages that old could reach
	// consumers whose inbox has already forgotten them, and run their
	// handlers twice.
	ErrBeyondHorizon = errors.New("postbox: replay window starts before the retention horizon")
	// ErrNotInTx is returned by the operations that only make sense in a
	// transaction (savepoints) when called on a Store's own Executor.
	ErrNotInTx = errors.New("postbox: the operation needs a transaction (UnwrapExecutor)")
	// ErrPooledStatements means the driver's connections go through a
	// pooler in transaction pooling mode (PgBouncer's pool_mode =
	// transaction) while the client prepares named statements (pgx's
	// default, cache_statement): a statement prepared on one server
	// connection is missing on the next. Set default_query_exec_mode to
	// cache_describe (or exec, or simple_protocol) in the connection
	// string, or use session pooling.
	ErrPooledStatements = errors.New("postbox: PostgreSQL is reached through a transaction-pooling pooler and the client prepares named statements; set default_query_exec_mode=cache_describe in the connection string")
	// ErrStorageRefused means the storage the database's relays read
	// (design §3, "Switching a database to the log") does not let a
	// relay run, or a switch happen: a relay over the table while the
	// database says log, or while the log holds a message no relay over
	// it has passed; a switch to the log while a relay over the table
	// runs. The message names both sides.
	ErrStorageRefused = errors.New("postbox: refused by the database's storage setting")
	// ErrOtherDatabase means the connections one Store runs its
	// statements on reach different databases: postboxsql.WithLog's pgx
	// pool and the *sql.DB beside it. The relay refuses to start on it
	// (Executor.CheckConnections); the message names both databases.
	ErrOtherDatabase = errors.New("postbox: the driver's connections reach different databases")
	// ErrNoSignals is returned by Listener.Listen when the connections
	// cannot carry change signals: a signal sent on another connection did
	// not arrive (a transaction pooler such as PgBouncer's pool_mode =
	// transaction gives LISTEN a server connection that goes on to serve
	// others). The relay then finds new rows by polling alone.
	ErrNoSignals = errors.New("postbox: change signals do not reach this connection (a transaction pooler?); the relay polls")
)

// Driver opens a Store for one table prefix. TTx is the transaction type of
// the database client (pgx.Tx, *sql.Tx).
type Driver[TTx any] interface {
	// Open returns a Store whose statements use the tables named with prefix.
	// The prefix has already been validated as an identifier by the caller,
	// but drivers check it again: it is spliced into SQL.
	Open(prefix string) (Store[TTx], error)
}

// Store is a driver bound to a table prefix. Its own Executor runs each
// operation on the driver's connections, in a transaction of its own where
// the operation needs one.
type Store[TTx any] interface {
	Executor

	// UnwrapExecutor returns an Executor whose statements run in tx, the
	// caller's transaction: they commit or roll back with it. It is cheap
	// (no I/O) and the result is used for the duration of one call.
	UnwrapExecutor(tx TTx) Executor

	// InTx runs fn in a transaction of the store's own, committing when fn
	// returns nil and rolling back otherwise.
	InTx(ctx context.Context, fn func(tx TTx) error) error
}

// ConnChecker is implemented by a Store that can tell when one of its
// transactions has lost its connection to the database: the server ended
// it (a restart, an administrator's kill) or the network did. The inbox
// asks after a handler returned an error: a run whose transaction lost its
// connection failed in the database, not in the handler, so it is settled
// as a store failure, spending none of the message's attempts and keeping
// its count of crashes. Without it, every handler error is the handler's.
type ConnChecker[TTx any] interface {
	// ConnLost reports whether tx's connection is gone. It may ask the
	// database with a statement in tx, which has failed already, within
	// ctx.
	ConnLost(ctx context.Context, tx TTx) bool
}

// Row is one message to insert.
type Row struct {
	ID      string // UUID, canonical text form
	Topic   string
	Key     string // "" stores NULL: no ordering key
	Payload []byte
	Headers []byte // JSON object of string values
}

// Record is one pending row as read by the relay.
type Record struct {
	Seq       int64
	ID        string
	Topic     string
	Key       string
	Payload   []byte
	Headers   []byte
	Partition int
	Attempts  int
	CreatedAt time.Time
}

// Lease is a relay's hold on one partition.
type Lease struct {
	Partition  int
	Owner      string // "" when free; Coordinate reports every partition's
	Generation int64
	ExpiresAt  time.Time // database clock, informational
	// Expired is true when any relay may take the lease: it is free, or
	// it ran out. Only Coordinate and PartitionStats report such leases.
	Expired bool
	// Crashed is true when the owner took the partition after the
	// previous owner's lease ran out instead of being released: that
	// owner may have died publishing one of its rows. Only Coordinate
	// reports it; it holds for the owner's generation.
	Crashed bool
}

// Membership is what Coordinate returns: the relays' shared view, from
// which each relay works out its share of the partitions.
type Membership struct {
	Live   []string // the live relays' ids, sorted; the caller among them
	Leases []Lease  // every partition's lease, in partition order
	// Now is the database's clock when it answered: a lease has
	// Leases[i].ExpiresAt - Now left, whatever the caller's clock says.
	Now time.Time
}

// Fence identifies the leases a write-back must still hold to apply.
type Fence struct {
	Owner string
	// Generations maps partition to the generation the owner holds. A row
	// whose partition is absent, or whose lease has moved on to another
	// generation or owner, is left alone.
	Generations map[int]int64
}

// FetchParams selects what Fetch reads.
type FetchParams struct {
	Fence       Fence
	Limit       int
	BlockOnDead bool
	// Topics, when not nil, limits the read to topics matching one of these
	// patterns: an exact topic, or a prefix ending in "*" ("orders.*"; "*"
	// alone matches every topic). An older row of a key whose topic matches
	// no pattern holds back the later rows of that key. Empty reads nothing.
	Topics []string
}

// Failure is one failed publish to record.
type Failure struct {
	Seq     int64
	Error   string
	Backoff time.Duration
	// Dead moves the row to the dead messages now, whatever its attempts:
	// the failure is permanent.
	Dead bool
}

// Outcome is what a relay made of one batch Fetch read (Settle).
type Outcome struct {
	// Read are the seqs of the rows the batch read, in the order read.
	Read []int64
	// Published are those the broker acknowledged.
	Published []int64
	// Failed are those whose publish failed as a message (an attempt
	// spent, or dead). A row of Read in neither list was not sent.
	Failed []Failure
}

// Settled is what Settle recorded.
type Settled struct {
	// Published counts the rows marked published: fewer than Outcome's
	// when a lease moved on (the new owner publishes those again).
	Published int
	// Failed are the failures recorded, with whether each row is now
	// dead.
	Failed []FailResult
}

// InFlight is a row's crash mark (MarkInFlight): what a relay that took
// the row's partition after an expiry was doing with it.
type InFlight int

// The crash marks, in the inflight column.
const (
	// NotInFlight: no mark.
	NotInFlight InFlight = 0
	// InFlightWithOthers: published together with other marked rows; a
	// relay dying now makes each of them a suspect.
	InFlightWithOthers InFlight = 1
	// InFlightAlone: published with no other marked row in flight; a
	// relay dying now counts one crash against this row.
	InFlightAlone InFlight = 2
	// Suspected: in flight with others when a relay died, not yet
	// published alone.
	Suspected InFlight = 3
)

// Suspect is a row ResolveCrashes found suspected: marked in flight when
// a relay died, or counted in a crash before.
type Suspect struct {
	Seq int64
	// Crashes counts the relays that died while the row was in flight
	// alone.
	Crashes int
}

// FailResult is a failure Settle recorded, for one row.
type FailResult struct {
	Seq      int64
	Attempts int
	Dead     bool
}

// Migration is one versioned schema change, as SQL with the table prefix
// already substituted.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Stats is a snapshot of the outbox.
//
// Pending and Published are exact up to StatsExactUpTo rows. Above it,
// a driver that can read the database's own estimate of a table's rows
// (PostgreSQL: the planner's, from the table's statistics scaled to its
// current size) reports that instead and sets PendingEstimated or
// PublishedEstimated, so that reading the status costs the same whatever
// the backlog and the history hold; one that cannot (MySQL, SQLite), or
// a table never analyzed, counts every row.
type Stats struct {
	Pending          int64
	Dead             int64
	OldestPendingAge time.Duration // database clock; zero when nothing is pending
	Published        int64         // rows kept in the published history

	PendingEstimated   bool
	PublishedEstimated bool
}

// StatsExactUpTo is how many pending or published rows Stats counts
// exactly before it may report an estimate.
const StatsExactUpTo = 10_000

// PartitionStats is the state of the partitions' leases, on the database
// clock.
type PartitionStats struct {
	Total   int // partitions
	Unowned int // partitions no relay holds a live lease on
	Relays  int // relays whose heartbeat is live
	// Leases is every partition's lease, in partition order, Expired set
	// where no relay holds it live.
	Leases []Lease
	// Now is the database's clock when it answered, to read
	// Leases[i].ExpiresAt against.
	Now time.Time
}

// ConsumerDeadStat counts one consumer's dead messages of one topic.
type ConsumerDeadStat struct {
	Consumer, Topic string
	Count           int64
	// RequeueRequested counts those an operator asked to requeue that the
	// consumer's Inbox has not carried out yet.
	RequeueRequested int64
}

// Snapshot is the oldest transaction of another session that holds a
// snapshot, and so the database's xmin horizon (PostgreSQL).
type Snapshot struct {
	Age   time.Duration // since the transaction began, on the database clock
	PID   int           // its backend
	State string        // "active", "idle in transaction", ...
}

// Package postboxdriver is the seam between postbox and a database.
//
// A driver adapts one database client (pgx, database/sql, SQLite) to the
// operations the Client, the relay and the tools need. Drivers are thin: the
// semantics live in the postbox package and are pinned down by the
// conformance suite in postboxdrivertest, which every driver must pass.
//
// Most programs never use this package directly; they construct a driver
// with postboxpgx.New, postboxsql.New or postboxsqlite.New and hand it to
// postbox.NewClient.
package postboxdriver

import (
	"context"
	"errors"
	"time"
)

// ErrNotMigrated is returned (wrapped) when the tables a call needs do not
// exist yet. Run the migrations (postboxmigrate, or `postbox migrate up`).
var ErrNotMigrated = errors.New("postbox: tables not migrated")

// Driver opens a Store for one table prefix. TTx is the transaction type of
// the database client (pgx.Tx, *sql.Tx).
type Driver[TTx any] interface {
	// Open returns a Store whose statements use the tables named with prefix.
	// The prefix has already been validated as an identifier by the caller,
	// but drivers check it again: it is spliced into SQL.
	Open(prefix string) (Store[TTx], error)
}

// Store is a driver bound to a table prefix.
type Store[TTx any] interface {
	Executor

	// InsertTx inserts rows in the caller's transaction, in one statement
	// where the dialect allows it.
	InsertTx(ctx context.Context, tx TTx, rows []Row) error

	// InTx runs fn in a transaction of the store's own, committing when fn
	// returns nil and rolling back otherwise.
	InTx(ctx context.Context, fn func(tx TTx) error) error
}

// Executor holds every operation that runs outside the user's transaction:
// the relay's cycle, leases, and migrations.
type Executor interface {
	// Dialect names the SQL dialect: "postgres" or "sqlite".
	Dialect() string

	// Partitions reports the number of partitions the outbox table was
	// migrated with. Rows carry partition = hash(key or id) mod Partitions.
	Partitions(ctx context.Context) (int, error)

	// Heartbeat registers relayID as live until now()+ttl on the database
	// clock and returns the ids of every live relay, sorted.
	Heartbeat(ctx context.Context, relayID string, ttl time.Duration) ([]string, error)

	// Unregister removes relayID from the live set.
	Unregister(ctx context.Context, relayID string) error

	// AcquireLeases takes or renews the leases on partitions for owner until
	// now()+ttl on the database clock. A partition is taken when it is free,
	// expired or already owner's; others are left alone. The generation of a
	// partition increases each time its owner changes. It returns the leases
	// owner holds among partitions after the call.
	AcquireLeases(ctx context.Context, owner string, partitions []int, ttl time.Duration) ([]Lease, error)

	// ReleaseLeases frees owner's leases on partitions so another relay can
	// take them at once.
	ReleaseLeases(ctx context.Context, owner string, partitions []int) error

	// Fetch reads up to Limit pending rows of the fenced partitions in seq
	// order: not dead, available now (database clock), and not behind an
	// older row of the same key that is waiting for a retry (or dead, when
	// BlockOnDead is set). It writes nothing.
	Fetch(ctx context.Context, p FetchParams) ([]Record, error)

	// MarkPublished moves the rows with the given seqs out of the pending
	// set, recording the publish time, but only those whose partition lease
	// still belongs to the fence. It returns how many rows it changed.
	MarkPublished(ctx context.Context, f Fence, seqs []int64) (int, error)

	// MarkFailed records a failed attempt for each row: attempts+1, the
	// error, available_at = now()+Backoff, and dead_at when attempts reaches
	// maxAttempts. Fenced like MarkPublished. It returns the rows changed,
	// with whether each is now dead.
	MarkFailed(ctx context.Context, f Fence, failures []Failure, maxAttempts int) ([]FailResult, error)

	// Migrations lists the dialect's migrations in version order.
	Migrations() []Migration

	// AppliedMigrations returns the versions already applied. A missing
	// migrations table means none.
	AppliedMigrations(ctx context.Context) ([]int, error)

	// ApplyMigration runs one migration and records it, atomically and
	// exclusive of other migrators. Applying an applied version is a no-op.
	ApplyMigration(ctx context.Context, m Migration) error

	// Stats reports the state of the outbox.
	Stats(ctx context.Context) (Stats, error)
}

// Row is one message to insert.
type Row struct {
	ID        string // UUID, canonical text form
	Topic     string
	Key       string // "" stores NULL: no ordering key
	Payload   []byte
	Headers   []byte // JSON object of string values
	Partition int    // computed by the writer where the database cannot
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
	Generation int64
	ExpiresAt  time.Time // database clock, informational
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
}

// FailResult is the outcome of MarkFailed for one row.
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
type Stats struct {
	Pending          int64
	Dead             int64
	OldestPendingAge time.Duration // database clock; zero when nothing is pending
	Published        int64         // rows kept in the published history
}

// DurabilityChecker is implemented by stores that can tell when the
// database may lose a committed transaction (PostgreSQL with
// synchronous_commit = off, SQLite below synchronous=FULL): a row the relay
// published could then vanish in a crash, leaving the broker with an event
// about a change the database no longer has. The relay logs each warning
// at start.
type DurabilityChecker interface {
	DurabilityWarnings(ctx context.Context) ([]string, error)
}

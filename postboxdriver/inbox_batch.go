package postboxdriver

import (
	"context"
	"regexp"
)

// InboxBatcher is implemented by stores that can record many deliveries
// in one transaction and isolate each handler run in a savepoint: what
// postbox's batching inbox processor (Inbox.BatchProcessor) needs to
// commit many messages at once while a failing handler rolls back only
// its own message.
type InboxBatcher[TTx any] interface {
	Savepointer[TTx]

	// InboxInsertManyTx records (consumer, id) in tx for every id, in one
	// statement where the dialect allows it, and reports for each id, in
	// the order given, whether it was new. An id already recorded writes
	// nothing and reports false. The records are inserted in id order, so
	// that two transactions recording overlapping sets take the row locks
	// in the same order. ids must hold no duplicates. As with
	// InboxInsertTx, an id recorded by a transaction still open waits for
	// it, so at most one handler run per id ever commits.
	InboxInsertManyTx(ctx context.Context, tx TTx, consumer string, ids []string) ([]bool, error)

	// InboxDeleteTx deletes the records of ids for consumer in tx: the
	// ones a batch recorded for messages whose handler then failed, so
	// that their next delivery runs again.
	InboxDeleteTx(ctx context.Context, tx TTx, consumer string, ids []string) error
}

// Savepointer runs savepoints in the user's transaction. A savepoint
// marks a point in tx that RollbackToSavepointTx returns to, undoing only
// what ran after it; on PostgreSQL it also makes a transaction usable
// again after a failed statement. Savepoints nest: a name used again
// names the most recent savepoint of that name.
type Savepointer[TTx any] interface {
	// SavepointTx opens a savepoint called name in tx. name must satisfy
	// ValidSavepointName; drivers refuse others.
	SavepointTx(ctx context.Context, tx TTx, name string) error
	// RollbackToSavepointTx undoes everything tx did since the savepoint
	// name was opened, keeping the savepoint itself open.
	RollbackToSavepointTx(ctx context.Context, tx TTx, name string) error
	// ReleaseSavepointTx ends the savepoint name (and any opened after
	// it), keeping their work in tx.
	ReleaseSavepointTx(ctx context.Context, tx TTx, name string) error
}

var savepointRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ValidSavepointName reports whether name can name a savepoint: lower-case
// letters, digits and underscores, not starting with a digit, at most 63
// bytes. Drivers splice it into SQL, so they check it.
func ValidSavepointName(name string) bool { return savepointRE.MatchString(name) }

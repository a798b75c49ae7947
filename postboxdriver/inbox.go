package postboxdriver

import (
	"context"
	"errors"
	"time"
)

// ErrNotFound is returned when a dead letter or message does not exist.
var ErrNotFound = errors.New("postbox: not found")

// Inboxer is the consumer side of a store: the inbox, attempt counting and
// consumer dead letters.
type Inboxer[TTx any] interface {
	InboxExecutor

	// InboxInsertTx records (consumer, messageID) in tx. It reports false,
	// writing nothing, when the record exists: the message is a copy. A copy
	// arriving while the first is still uncommitted waits for it, so at most
	// one handler run per id ever commits.
	InboxInsertTx(ctx context.Context, tx TTx, consumer, messageID string) (bool, error)

	// TakeDeadTx deletes a consumer dead letter in tx and returns it, for a
	// requeue that runs the handler again in the same transaction.
	TakeDeadTx(ctx context.Context, tx TTx, consumer, messageID string) (DeadLetter, error)
}

// InboxExecutor holds the consumer-side operations that run outside the
// handler's transaction.
type InboxExecutor interface {
	// RecordFailure counts a failed handler run for (consumer, messageID),
	// on a connection of its own so the count survives the handler's
	// rollback, and returns the running totals.
	RecordFailure(ctx context.Context, consumer, messageID, errText string) (Attempts, error)

	// Bury writes a consumer dead letter, replacing one for the same
	// (consumer, message id), and forgets its attempts.
	Bury(ctx context.Context, d DeadLetter) error

	// ListDead lists dead letters matching f, newest first.
	ListDead(ctx context.Context, f DeadFilter) ([]DeadLetter, error)

	// GetDead returns one dead letter, or ErrNotFound.
	GetDead(ctx context.Context, consumer, messageID string) (DeadLetter, error)

	// DeleteDead deletes one dead letter and reports whether it existed.
	DeleteDead(ctx context.Context, consumer, messageID string) (bool, error)

	// PruneInbox deletes at most limit inbox records (and attempt counts)
	// older than age on the database clock, and returns how many.
	PruneInbox(ctx context.Context, age time.Duration, limit int) (int, error)

	// PruneConsumerDead deletes at most limit dead letters older than age.
	PruneConsumerDead(ctx context.Context, age time.Duration, limit int) (int, error)
}

// Attempts is the failure count of one message at one consumer.
type Attempts struct {
	Attempts       int
	FirstFailureAt time.Time
	LastFailureAt  time.Time
}

// DeadLetter is a message a consumer gave up on.
type DeadLetter struct {
	Consumer       string
	MessageID      string
	Topic          string
	Key            string
	Payload        []byte
	Headers        []byte // JSON object of strings
	Error          string
	Attempts       int
	FirstFailureAt time.Time
	LastFailureAt  time.Time
	DeadAt         time.Time
}

// DeadFilter selects dead letters. Zero fields match everything.
type DeadFilter struct {
	Consumer string
	Topic    string
	Since    time.Time // dead at or after
	Until    time.Time // dead before
	Limit    int       // default 100
}

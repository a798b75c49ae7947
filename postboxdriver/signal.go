package postboxdriver

import "context"

// Signaler is an Executor that can tell relays in other processes that
// rows were written, so that they read at once instead of at their next
// poll (PostgreSQL's NOTIFY). It is optional: without it, a relay finds
// rows written by other processes within its PollInterval.
//
// A Client calls Signal after each write, outside the writer's
// transaction and never on the writer's goroutine, one call at a time:
// writes made while a signal is on its way share the next. A signal may
// arrive before the writer's transaction commits; the relay then reads
// again on its fast poll, unless the signal says the writes it announces
// had committed. A lost signal costs latency, never a message.
type Signaler interface {
	// Signal sends the change signal on the prefix's channel, naming the
	// partitions written since the last one where the driver knows them,
	// and whether every write it announces had committed when the Client
	// asked for it. It must not wait for a disk flush of its own.
	Signal(ctx context.Context, committed bool) error
}

// Heard is a change signal as a Listener hears it.
type Heard struct {
	// Partitions are the partitions written, nil when the signal does
	// not say (every partition).
	Partitions []int
	// Committed says the writes the signal announces had committed: a
	// relay reads once for it instead of polling fast.
	Committed bool
	// Relays says the signal announces no write but a change among the
	// relays: one joined or left, or let partitions go (Executor.Coordinate
	// on a driver that is also a Listener sends it). A relay hearing it
	// renews its leases at once instead of at its next renewal, so that
	// a partition changing hands waits for a few statements rather than
	// a renewal interval.
	Relays bool
}

// Listener is an Executor on which a relay can hear the signals of
// Signaler, sent by any process writing to the same tables. It is
// optional.
type Listener interface {
	// Listen calls heard for each signal until ctx ends or the connection
	// it listens on fails, and returns ctx's error or the failure. Signals
	// of the Executor's own Signal are not
	// heard: its writes wake their relay directly. It calls ready once
	// signals sent from then on are heard. It returns ErrNoSignals,
	// wrapped, when the connections cannot carry signals (a transaction
	// pooler hands each transaction another server connection, and the
	// one listening with it).
	Listen(ctx context.Context, ready func(), heard func(Heard)) error
}

// AfterCommitter is an Executor, made by UnwrapExecutor for a transaction
// whose commit the driver runs itself (postboxpgx.Begin's Tx), that can
// tell when that transaction has committed. It is optional. A Client that
// wrote through one wakes its relay after the commit instead of before
// it: the woken relay reads once and finds the rows, where a wake-up
// before the commit makes it read again on its fast poll until they are
// there.
type AfterCommitter interface {
	// AfterCommit arranges for fn to run once the transaction has
	// committed, and reports whether it will: false when the driver
	// cannot tell when the transaction commits. fn does not run when the
	// transaction rolls back or its commit fails; it must not block.
	AfterCommit(fn func()) bool
}

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
// again on its fast poll. A lost signal costs latency, never a message.
type Signaler interface {
	// Signal sends the change signal on the prefix's channel, naming the
	// partitions written since the last one where the driver knows them.
	// It must not wait for a disk flush of its own.
	Signal(ctx context.Context) error
}

// Listener is an Executor on which a relay can hear the signals of
// Signaler, sent by any process writing to the same tables. It is
// optional.
type Listener interface {
	// Listen calls heard for each signal until ctx ends or the connection
	// it listens on fails, and returns ctx's error or the failure; heard
	// gets the partitions written, or nil when the signal does not say
	// (every partition). Signals of the Executor's own Signal are not
	// heard: its writes wake their relay directly. It calls ready once
	// signals sent from then on are heard. It returns ErrNoSignals,
	// wrapped, when the connections cannot carry signals (a transaction
	// pooler hands each transaction another server connection, and the
	// one listening with it).
	Listen(ctx context.Context, ready func(), heard func(partitions []int)) error
}

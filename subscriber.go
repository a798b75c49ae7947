package postbox

import "context"

// Subscriber is the seam every broker's consumer implements (the
// in-memory one in postboxtest, and each broker adapter's): it receives
// deliveries and hands each to a Processor, usually Inbox.Processor, then
// settles it with the broker as the Verdict says — ack, redeliver after the
// delay, or ack a message that became a dead message. It acknowledges
// only after the Processor returns, that is after the handler's
// transaction committed.
//
// Subscribers call Process from several goroutines at once, up to their
// in-flight bound; that is what lets Inbox.BatchProcessor gather the
// deliveries that arrive together into one transaction and one commit.
type Subscriber interface {
	// Run consumes until ctx ends or the subscription fails, returning nil
	// when ctx ended it.
	Run(ctx context.Context, p Processor) error
}

// InFlightHinter is implemented by a Processor that needs a number of
// deliveries in flight at once to work as designed: Inbox.BatchProcessor,
// whose batches form only from deliveries the subscriber holds together.
// A Subscriber whose in-flight bound was left at its default raises it to
// the hint for a Run of such a Processor (see InFlight); a bound set in
// its config is kept. A Processor that wraps another should forward the
// hint of the one it wraps.
type InFlightHinter interface {
	// InFlightHint returns the deliveries the Processor wants in flight
	// at once.
	InFlightHint() int
}

// InFlight returns the in-flight bound of a Run of p for a Subscriber
// whose bound was left at its default def: the larger of def and p's
// InFlightHint, at most limit, the Subscriber's own maximum.
func InFlight(p Processor, def, limit int) int {
	n := def
	if h, ok := p.(InFlightHinter); ok {
		n = max(n, h.InFlightHint())
	}
	return min(n, limit)
}

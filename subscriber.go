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

package postboxtest

import (
	"context"
	"fmt"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxdriver"
)

// ExpiredOwner is the owner ExpireLeases writes on the partitions it takes
// away: no relay has this id, and its leases have already run out.
const ExpiredOwner = "postboxtest:expired"

// ExpireLeases takes every partition of the outbox named by prefix ("" for
// postbox.DefaultPrefix) away from the relay holding it, as if that relay
// had paused past its lease (a long GC pause, a frozen VM, SIGSTOP) and
// another relay had taken over: each lease passes to ExpiredOwner at a new
// generation, already expired. It returns the number of partitions taken.
//
// What follows is what a real takeover does. The relay's marks for the
// batches it has in flight are fenced out and change nothing, so the rows
// stay pending; a running relay then renews at once (a Drain returns
// ErrLeaseLost, and its next call does the same), takes the expired leases
// back at yet another generation and publishes those rows once more,
// under the same ids. A consumer therefore sees copies, which
// its Inbox must absorb. Combine it with Faulty.AfterPublish to expire the
// leases between a broker's ack and the relay's mark:
//
//	faulty.AfterPublish(func(*postbox.Envelope) {
//		_, _ = postboxtest.ExpireLeases(ctx, driver, "")
//	})
func ExpireLeases[TTx any](ctx context.Context, d postboxdriver.Driver[TTx], prefix string) (int, error) {
	if prefix == "" {
		prefix = postbox.DefaultPrefix
	}
	if err := postbox.ValidatePrefix(prefix); err != nil {
		return 0, err
	}
	store, err := d.Open(prefix)
	if err != nil {
		return 0, err
	}
	n, err := store.ExpireLeases(ctx, ExpiredOwner)
	if err != nil {
		return 0, fmt.Errorf("postboxtest: ExpireLeases: %w", err)
	}
	return n, nil
}

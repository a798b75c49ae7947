// Package postbox is a transactional outbox: it makes "the database
// changed" and "the world was told" agree.
//
// An application writes its domain rows and its outgoing messages in one
// database transaction. The messages exist if and only if the transaction
// commits. A relay then moves committed messages to a broker, at least once
// and in order per key, surviving crashes of the relay, broker outages and
// database restarts.
//
// # Writing
//
// A Client is generic over the driver's transaction type:
//
//	client, err := postbox.NewClient(postboxpgx.New(pool), &postbox.Config{Publisher: pub})
//
//	tx, err := pool.Begin(ctx)
//	// ... write the order with tx ...
//	err = client.WriteTx(ctx, tx, postbox.Message{
//		Topic:   "orders.created",
//		Key:     orderID, // messages of one key are published in write order
//		Payload: body,
//	})
//	err = tx.Commit(ctx)
//
// Write does the same in a transaction of its own. Every message is
// validated before anything is written (topic, key, payload size, headers,
// and an optional JSON Schema per topic); a bad one returns a
// *ValidationError naming the field, and nothing of the call is written.
//
// # Relaying
//
// Start runs the relay until Stop. Any number of replicas can run against
// one table: rows are spread over partitions by key, each replica leases a
// share of the partitions on the database clock, publishes its partitions'
// pending rows outside any transaction, and moves the acknowledged ones to
// the published history with one statement fenced by the lease's
// generation. A replica that crashes loses its partitions when its lease
// expires; one that stalls past its lease writes nothing back.
//
// A publish failure caused by the message (rejected, too large,
// unroutable) spends one attempt and backs off (equal jitter, capped); after
// MaxAttempts the message moves to the dead table. Any other failure
// (broker unreachable, timeout) spends nothing, leaves the message pending
// and pauses the relay.
//
// # Ordering
//
// Messages with the same key are published in write order: a message is
// sent only after the previous one of its key was acknowledged. Write order
// is insert order, so two transactions that write one key at the same moment
// have no order between them; lock the entity's row in the transaction
// (SELECT ... FOR UPDATE) when the order of its messages matters.
//
// # Guarantees
//
// At least once: a message acknowledged by the broker but not yet recorded
// as published when a relay dies is published again, with the same id.
// Consumers absorb such copies by id (the broker's dedupe, and the inbox).
//
// The guarantees G1 to G9 that comments across the project cite are
// defined in docs/design.md §1, with the tests that try to break each.
package postbox

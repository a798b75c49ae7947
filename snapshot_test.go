package postbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxpgx"
)

// Admin.Status names the oldest snapshot another session holds: the
// forgotten "idle in transaction" that keeps vacuum off the outbox.
func TestStatusReportsHeldSnapshot(t *testing.T) {
	pool, prefix := testdb.Migrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := postbox.NewClient(postboxpgx.New(pool), &postbox.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	admin := client.Admin()
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var pid int
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	const held = postbox.HeldSnapshotMinAge + 200*time.Millisecond
	time.Sleep(held)
	st, err := admin.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h := st.HeldSnapshot
	// Other tests' sessions may hold an older one; ours at least is there.
	if h == nil || h.Age < held {
		t.Fatalf("HeldSnapshot = %+v, want one at least %s old (ours is pid %d)", h, held, pid)
	}
	if h.PID == pid && h.State != "idle in transaction" {
		t.Fatalf("our transaction's state = %q, want idle in transaction", h.State)
	}
}

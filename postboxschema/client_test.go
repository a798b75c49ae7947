package postboxschema_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxpgx"
	"github.com/postbox-go/postbox/postboxschema"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestClientWritesNothingOnSchemaViolation wires a Registry into a Client
// on PostgreSQL and checks G9: a rejected message is a
// *postbox.ValidationError and no row of its batch is written, even when
// the caller commits its transaction anyway.
func TestClientWritesNothingOnSchemaViolation(t *testing.T) {
	ctx := context.Background()
	pool, prefix := testdb.Migrated(t)
	d := postboxpgx.New(pool)
	reg := mustLoad(t, &postboxschema.Options{RequireSchema: true})
	c, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Validator: reg})
	if err != nil {
		t.Fatal(err)
	}

	rows := func() int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+prefix+`outbox`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	good := func(id string) postbox.Message {
		return postbox.Message{Topic: "orders.created", Key: id, Payload: []byte(`{"id":"` + id + `","amount":10,"currency":"EUR"}`)}
	}
	negative := postbox.Message{Topic: "orders.created", Payload: []byte(`{"id":"ord_3","amount":-1,"currency":"EUR"}`)}

	for _, tc := range []struct {
		name   string
		msgs   []postbox.Message
		field  string
		reason string
	}{
		{"schema violation", []postbox.Message{negative}, "messages[0].payload", "at /amount: must be >= 0 (minimum)"},
		{"third of three", []postbox.Message{good("ord_1"), good("ord_2"), negative}, "messages[2].payload", "at /amount: must be >= 0 (minimum)"},
		{"not JSON", []postbox.Message{good("ord_1"), {Topic: "orders.created", Payload: []byte("id=ord_1")}}, "messages[1].payload",
			"is not JSON: invalid character 'i' looking for beginning of value (line 1, column 1)"},
		{"no schema, schemas required", []postbox.Message{good("ord_1"), good("ord_2"), {Topic: "audit.logged", Payload: []byte(`{}`)}}, "messages[2].topic",
			"has no schema, and schemas are required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check := func(how string, err error) {
				t.Helper()
				var ve *postbox.ValidationError
				if !errors.As(err, &ve) {
					t.Fatalf("%s: got %v (%T), want a *postbox.ValidationError", how, err, err)
				}
				if ve.Field != tc.field || ve.Reason != tc.reason {
					t.Errorf("%s: got %s: %s\nwant %s: %s", how, ve.Field, ve.Reason, tc.field, tc.reason)
				}
				if n := rows(); n != 0 {
					t.Fatalf("%s: %d rows written by a rejected batch", how, n)
				}
			}
			check("Write", c.Write(ctx, tc.msgs...))
			check("WriteTx", writeTxAndCommit(ctx, t, pool, c, tc.msgs))
		})
	}

	// The same client writes a valid batch, so the count above could see rows.
	if err := c.Write(ctx, good("ord_1"), good("ord_2"), good("ord_3")); err != nil {
		t.Fatal(err)
	}
	if n := rows(); n != 3 {
		t.Fatalf("%d rows after a valid batch of 3", n)
	}
}

// writeTxAndCommit calls WriteTx in a transaction and commits it whatever
// WriteTx returned: validation must leave the caller's transaction usable
// and write nothing into it.
func writeTxAndCommit(ctx context.Context, t *testing.T, pool *pgxpool.Pool, c *postbox.Client[pgx.Tx], msgs []postbox.Message) error {
	t.Helper()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	werr := c.WriteTx(ctx, tx, msgs...)
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit after WriteTx returned %v: %v", werr, err)
	}
	return werr
}

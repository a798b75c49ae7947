package postboxsqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxdriver/postboxdrivertest"
	"github.com/postbox-go/postbox/postboxsqlite"
)

func TestConformance(t *testing.T) {
	postboxdrivertest.Run(t, postboxdrivertest.Harness[*sql.Tx]{
		New: func(t *testing.T) (postboxdriver.Driver[*sql.Tx], string) {
			db, _ := openDB(t)
			d, err := postboxsqlite.New(db)
			if err != nil {
				t.Fatal(err)
			}
			return d, prefix
		},
		Begin: func(t *testing.T, ctx context.Context, d postboxdriver.Driver[*sql.Tx]) (*sql.Tx, func() error, func() error) {
			tx, err := d.(*postboxsqlite.Driver).DB().BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tx.Rollback() })
			return tx, tx.Commit, tx.Rollback
		},
		// SQLite has one writer at a time: a transaction that inserted
		// holds the write lock until it ends, so no later one can commit
		// a higher seq first.
		Backdate: func(t *testing.T, d postboxdriver.Driver[*sql.Tx], prefix, table, column string, age time.Duration) {
			q := fmt.Sprintf("UPDATE %s%s SET %s = %s - %d", prefix, table, column, column, age.Milliseconds())
			if _, err := d.(*postboxsqlite.Driver).DB().ExecContext(context.Background(), q); err != nil {
				t.Fatal(err)
			}
		},
		Exec: func(_ *testing.T, d postboxdriver.Driver[*sql.Tx], query string, args ...any) error {
			_, err := d.(*postboxsqlite.Driver).DB().ExecContext(context.Background(), query, args...)
			return err
		},
		Locate: func(t *testing.T, d postboxdriver.Driver[*sql.Tx]) string {
			var path string
			if err := d.(*postboxsqlite.Driver).DB().QueryRow(`SELECT file FROM pragma_database_list WHERE name = 'main'`).Scan(&path); err != nil {
				t.Fatal(err)
			}
			return path
		},
		Features: postboxdrivertest.Features{ConcurrentWriters: false},
	})
}

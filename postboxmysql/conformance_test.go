package postboxmysql_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/postbox-go/postbox/internal/mysqltest"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxdriver/postboxdrivertest"
	"github.com/postbox-go/postbox/postboxmysql"
)

func TestMain(m *testing.M) {
	postboxdrivertest.Child(func(dsn string) (postboxdriver.Driver[*sql.Tx], error) {
		db, err := postboxmysql.Open(dsn)
		if err != nil {
			return nil, err
		}
		return postboxmysql.New(db)
	})
	if err := mysqltest.RaisePacketLimit(); err != nil {
		fmt.Fprintln(os.Stderr, "raise max_allowed_packet:", err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m)
}

func TestConformance(t *testing.T) {
	postboxdrivertest.Run(t, postboxdrivertest.Harness[*sql.Tx]{
		New: func(t *testing.T) (postboxdriver.Driver[*sql.Tx], string) {
			return mysqltest.Driver(t)
		},
		Begin: func(t *testing.T, ctx context.Context, d postboxdriver.Driver[*sql.Tx]) (*sql.Tx, func() error, func() error) {
			tx, err := d.(*postboxmysql.Driver).DB().BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tx.Rollback() })
			return tx, tx.Commit, tx.Rollback
		},
		Backdate: func(t *testing.T, d postboxdriver.Driver[*sql.Tx], prefix, table, column string, age time.Duration) {
			q := fmt.Sprintf("UPDATE %s%s SET %s = %s - %d", prefix, table, column, column, age.Milliseconds())
			if _, err := d.(*postboxmysql.Driver).DB().ExecContext(context.Background(), q); err != nil {
				t.Fatal(err)
			}
		},
		Exec: func(_ *testing.T, d postboxdriver.Driver[*sql.Tx], query string, args ...any) error {
			_, err := d.(*postboxmysql.Driver).DB().ExecContext(context.Background(), query, args...)
			return err
		},
		Locate: func(*testing.T, postboxdriver.Driver[*sql.Tx]) string { return mysqltest.DSN() },
		Sever: func(t *testing.T, d postboxdriver.Driver[*sql.Tx], tx *sql.Tx) {
			ctx := context.Background()
			var id int64
			if err := tx.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
				t.Fatal(err)
			}
			db := d.(*postboxmysql.Driver).DB()
			if _, err := db.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
				t.Fatal(err)
			}
			// KILL marks the thread; it ends when it next looks.
			for {
				var n int
				if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?", id).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n == 0 {
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		},
		Features: postboxdrivertest.Features{ConcurrentWriters: true},
	})
}

// fakeDriver is a database/sql driver that is not MySQL's.
type fakeDriver struct{}

func (fakeDriver) Open(string) (driver.Conn, error) { return nil, errors.New("never connected") }

func (d fakeDriver) Connect(context.Context) (driver.Conn, error) { return d.Open("") }

func (d fakeDriver) Driver() driver.Driver { return d }

func TestRefusesOtherDrivers(t *testing.T) {
	db := sql.OpenDB(fakeDriver{})
	defer db.Close()
	if _, err := postboxmysql.New(db); !errors.Is(err, postboxmysql.ErrUnsupportedDriver) {
		t.Fatalf("err = %v, want ErrUnsupportedDriver", err)
	}
}

// Package mysqltest gives tests isolated tables on the machine's MariaDB
// (or MySQL): each test gets a table prefix of its own, and its tables are
// dropped when it ends. It is a module of its own so that the core
// module's tests never need the MySQL client.
package mysqltest

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxmysql"
)

// DSN is the database tests use; POSTBOX_TEST_MYSQL_URL overrides it.
// maxAllowedPacket=0 makes the client take the server's limit, which
// RaisePacketLimit raises to carry the largest payload the table's rules
// admit.
func DSN() string {
	if d := os.Getenv("POSTBOX_TEST_MYSQL_URL"); d != "" {
		return d
	}
	return "mysql://root@127.0.0.1:3306/test?maxAllowedPacket=0"
}

// LargestPacket is what the server must carry for the table contract's
// largest row: the rules' 64 MiB payload and the rest of its statement.
const LargestPacket = 80 << 20

// RaisePacketLimit raises the server's max_allowed_packet to
// LargestPacket, for connections opened from then on, when it is lower.
func RaisePacketLimit() error {
	db, err := postboxmysql.Open(DSN())
	if err != nil {
		return err
	}
	defer db.Close()
	var cur int64
	if err := db.QueryRow(`SELECT @@GLOBAL.max_allowed_packet`).Scan(&cur); err != nil {
		return err
	}
	if cur >= LargestPacket {
		return nil
	}
	_, err = db.Exec(fmt.Sprintf("SET GLOBAL max_allowed_packet = %d", LargestPacket))
	return err
}

var counter atomic.Int64

// Prefix returns a table prefix unique to this test process and call.
func Prefix() string {
	return fmt.Sprintf("t%d_%d_", os.Getpid()%100000, counter.Add(1))
}

// Open opens the test database, closed when t ends.
func Open(t testing.TB) *sql.DB {
	t.Helper()
	db, err := postboxmysql.Open(DSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// Driver opens the test database's driver, closed when t ends, and a fresh
// prefix whose tables are dropped when t ends. They are not migrated.
func Driver(t testing.TB) (*postboxmysql.Driver, string) {
	t.Helper()
	db := Open(t)
	p := Prefix()
	DropPrefix(t, db, p)
	d, err := postboxmysql.New(db)
	if err != nil {
		t.Fatal(err)
	}
	return d, p
}

// Migrated is Driver with the prefix's tables migrated.
func Migrated(t testing.TB) (*postboxmysql.Driver, string) {
	t.Helper()
	d, p := Driver(t)
	m, err := postboxmigrate.New(d, &postboxmigrate.Config{Prefix: p})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(context.Background()); err != nil {
		t.Fatal(err)
	}
	return d, p
}

// DropPrefix registers a cleanup that drops every table and routine named
// with p (the triggers go with their table).
func DropPrefix(t testing.TB, db *sql.DB, p string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := DropTables(ctx, db, p); err != nil {
			t.Logf("mysqltest: drop %s: %v", p, err)
		}
	})
}

// DropTables drops every table of the database named with p, and the
// outbox rules' procedure.
func DropTables(ctx context.Context, db *sql.DB, p string) error {
	like := strings.ReplaceAll(p, "_", `\_`) + "%"
	rows, err := db.QueryContext(ctx, `SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE ?`, like)
	if err != nil {
		return err
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			_ = rows.Close()
			return err
		}
		names = append(names, n)
	}
	if err := rows.Close(); err != nil {
		return err
	}
	if len(names) > 0 {
		if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+strings.Join(names, ", ")); err != nil {
			return err
		}
	}
	_, err = db.ExecContext(ctx, "DROP PROCEDURE IF EXISTS "+p+"outbox_rules")
	return err
}

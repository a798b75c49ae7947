// Package testdb gives tests isolated tables on the machine's real
// databases: each test gets a table prefix of its own, and its tables are
// dropped when it ends.
package testdb

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx" for database/sql
)

// PostgresURL is the database tests use; POSTBOX_TEST_DATABASE_URL
// overrides it.
func PostgresURL() string {
	if u := os.Getenv("POSTBOX_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

var counter atomic.Int64

// Prefix returns a table prefix unique to this test process and call.
func Prefix(t testing.TB) string {
	return fmt.Sprintf("t%d_%d_", os.Getpid()%100000, counter.Add(1))
}

// Pool opens a pgx pool on the test database, closed when t ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, PostgresURL())
	if err != nil {
		t.Fatalf("testdb: connect to PostgreSQL: %v", err)
	}
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("testdb: PostgreSQL at %s is not reachable: %v", PostgresURL(), err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// SQLDB opens a database/sql handle on the test database through pgx's
// stdlib driver, closed when t ends.
func SQLDB(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", PostgresURL())
	if err != nil {
		t.Fatalf("testdb: open: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// DropPrefix registers a cleanup that drops every table named with prefix
// in the PostgreSQL test database.
func DropPrefix(t testing.TB, pool *pgxpool.Pool, prefix string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		rows, err := pool.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND starts_with(tablename, $1)`, prefix)
		if err != nil {
			t.Logf("testdb: list tables: %v", err)
			return
		}
		var names []string
		for rows.Next() {
			var n string
			if rows.Scan(&n) == nil {
				names = append(names, n)
			}
		}
		rows.Close()
		if len(names) > 0 {
			if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+strings.Join(names, ", ")+" CASCADE"); err != nil {
				t.Logf("testdb: drop tables: %v", err)
			}
		}
	})
}

// SQLitePath returns a path for a fresh SQLite database file in t's
// temporary directory.
func SQLitePath(t testing.TB) string {
	return filepath.Join(t.TempDir(), "postbox.db")
}

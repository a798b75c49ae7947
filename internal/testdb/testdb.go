// Package testdb gives tests isolated tables on the machine's real
// databases: each test gets a table prefix of its own, and its tables are
// dropped when it ends.
package testdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx" for database/sql

	"github.com/postbox-go/postbox/internal/pgbouncer"
	"github.com/postbox-go/postbox/internal/pgxdriver"
	"github.com/postbox-go/postbox/internal/tcpproxy"
	"github.com/postbox-go/postbox/postboxmigrate"
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
	return PoolAt(t, PostgresURL())
}

// SQLDB opens a database/sql handle on the test database through pgx's
// stdlib driver, closed when t ends.
func SQLDB(t testing.TB) *sql.DB {
	t.Helper()
	return SQLDBAt(t, PostgresURL())
}

// SQLDBAt opens a database/sql handle on databaseURL through pgx's stdlib
// driver, closed when t ends.
func SQLDBAt(t testing.TB, databaseURL string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", databaseURL)
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
		if err := DropTables(ctx, pool, prefix); err != nil {
			t.Logf("testdb: %v", err)
		}
	})
}

// DropTables drops every table of the current schema named with prefix,
// and the functions named with it (the outbox's rules trigger).
func DropTables(ctx context.Context, pool *pgxpool.Pool, prefix string) error {
	rows, err := pool.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND starts_with(tablename, $1)`, prefix)
	if err != nil {
		return fmt.Errorf("list tables: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("list tables: %w", err)
	}
	if len(names) > 0 {
		if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+strings.Join(names, ", ")+" CASCADE"); err != nil {
			return fmt.Errorf("drop tables: %w", err)
		}
	}
	rows, err = pool.Query(ctx, `SELECT p.oid::regprocedure::text FROM pg_proc p
WHERE p.pronamespace = current_schema()::regnamespace AND starts_with(p.proname, $1)`, prefix)
	if err != nil {
		return fmt.Errorf("list functions: %w", err)
	}
	funcs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("list functions: %w", err)
	}
	if len(funcs) > 0 {
		if _, err := pool.Exec(ctx, "DROP FUNCTION IF EXISTS "+strings.Join(funcs, ", ")+" CASCADE"); err != nil {
			return fmt.Errorf("drop functions: %w", err)
		}
	}
	return nil
}

// Migrated returns a pool on the test database and a table prefix of its
// own with postbox's tables migrated, dropped when t ends.
func Migrated(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	pool := Pool(t)
	prefix := Prefix(t)
	DropPrefix(t, pool, prefix)
	m, err := postboxmigrate.New(pgxdriver.New(pool, nil), &postboxmigrate.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(context.Background()); err != nil {
		t.Fatalf("testdb: migrate: %v", err)
	}
	return pool, prefix
}

// BouncerURL starts a PgBouncer in transaction pooling mode in front of the
// test database, stopped when t ends, and returns the test database's URL
// through it with the query parameters params added (for example
// "default_query_exec_mode=cache_describe"). Without PgBouncer installed it
// skips t, unless POSTBOX_REQUIRE_PGBOUNCER is set (CI sets it): then it
// fails.
func BouncerURL(t testing.TB, params string) string {
	t.Helper()
	if _, err := pgbouncer.Binary(); errors.Is(err, pgbouncer.ErrNotInstalled) {
		if os.Getenv("POSTBOX_REQUIRE_PGBOUNCER") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	u, err := url.Parse(PostgresURL())
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := pgbouncer.Start(ctx, pgbouncer.Config{Upstream: u.Host, Databases: []string{strings.TrimPrefix(u.Path, "/")}})
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	t.Cleanup(func() {
		// A pooler that ended on its own fails every later connection of
		// the test with "connection refused": say why it ended.
		if why, ended := s.Exited(); ended {
			t.Error(why)
		}
		s.Stop()
	})
	through, err := s.URL(PostgresURL())
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	if params != "" {
		sep := "?"
		if strings.Contains(through, "?") {
			sep = "&"
		}
		through += sep + params
	}
	return through
}

// PoolAt opens a pgx pool on databaseURL, closed when t ends.
func PoolAt(t testing.TB, databaseURL string) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		t.Fatalf("testdb: connect to PostgreSQL: %v", err)
	}
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("testdb: PostgreSQL at %s is not reachable: %v", databaseURL, err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Proxied is databaseURL reached through a TCP proxy of its own on
// loopback, which the test cuts, stalls or resets (tcpproxy), and the
// proxy. The proxy closes when t ends, after the cleanups registered
// after this call.
func Proxied(t testing.TB, databaseURL string) (string, *tcpproxy.Proxy) {
	t.Helper()
	u, err := url.Parse(databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := tcpproxy.New(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	u.Host = proxy.Addr()
	return u.String(), proxy
}

// Terminate ends the PostgreSQL backend pid from a connection of its own,
// as an administrator's pg_terminate_backend or a restart of the server
// does, and returns once the backend has exited.
func Terminate(t testing.TB, pid int) {
	t.Helper()
	ctx := context.Background()
	pool := Pool(t)
	defer pool.Close()
	var ended bool
	if err := pool.QueryRow(ctx, "SELECT pg_terminate_backend($1, 60000)", pid).Scan(&ended); err != nil || !ended {
		t.Fatalf("testdb: terminate backend %d: %v, %v", pid, ended, err)
	}
}

// Package postboxsqlite is the postbox driver for SQLite through
// database/sql, over modernc.org/sqlite: pure Go, no cgo, driver name
// "sqlite". Transactions are *sql.Tx.
//
// The schema and the semantics are those of the PostgreSQL driver, table
// for table; times are INTEGER unix milliseconds taken from the database
// clock, which for an embedded database is the clock of the host the file
// lives on.
//
// # Opening the database
//
// Open opens a file with the settings below (see DSN). A *sql.DB opened
// some other way and handed to New needs the same settings, for these
// reasons:
//
//   - busy_timeout of several seconds. SQLite has one writer at a time, and
//     a connection that finds the write lock taken fails at once with
//     SQLITE_BUSY unless a busy timeout makes it wait. The relay's writes
//     and the application's transactions take turns on the lock; without
//     the timeout they fail each other instead.
//   - WAL journal mode, so the relay's reads never block writers and
//     writers never block its reads. Only the writers take turns.
//   - Write transactions that start with BEGIN IMMEDIATE (_txlock=immediate).
//     A transaction begun DEFERRED takes a read snapshot first and the write
//     lock only at its first write; if another writer committed in between,
//     that upgrade fails with SQLITE_BUSY at once, and no busy timeout helps.
//     BEGIN IMMEDIATE takes the write lock at the start, where waiting works,
//     so writers queue up one at a time instead of failing. Transactions of
//     this package's own (InTx, and every multi-statement write of the
//     relay) take the lock at the start whatever the DSN says; the setting
//     matters for the application's transactions that WriteTx joins.
//
// Do not limit the pool to a single connection (SetMaxOpenConns(1)) to get
// one writer at a time: SQLite already admits one writer at a time, and the
// relay needs a connection of its own while an application transaction
// holds another, so a one-connection pool stalls the relay behind every
// open transaction. The busy timeout and IMMEDIATE transactions give the
// one-writer order without that.
//
// A database file on a network file system, and ":memory:" databases (one
// per connection), are not supported.
package postboxsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"

	"modernc.org/sqlite"

	"github.com/postbox-go/postbox/postboxdriver"
)

// ErrUnsupportedDriver is returned by New for a *sql.DB that is not backed
// by modernc.org/sqlite.
var ErrUnsupportedDriver = errors.New("postboxsqlite: the *sql.DB must use modernc.org/sqlite (driver name \"sqlite\")")

// BusyTimeoutMillis is how long a connection opened by Open waits for the
// write lock before failing with SQLITE_BUSY.
const BusyTimeoutMillis = 10_000

// DSN returns the data source name Open uses for the database file at
// path, for programs that open the *sql.DB themselves:
//
//	db, err := sql.Open("sqlite", postboxsqlite.DSN(path))
//
// Durability: synchronous=FULL, which in WAL mode syncs the log at every
// commit. NORMAL would sync only at checkpoints, so a power failure or an
// OS crash could undo transactions that had already committed, after the
// relay had published their messages: the broker would then carry events
// about changes the database no longer has, which is what an outbox exists
// to prevent (the same hazard as PostgreSQL with synchronous_commit=off).
// The price is one fsync per commit; writing many messages per transaction
// amortizes it.
func DSN(path string) string {
	// A "file:" URI, so that a path holding '?' cannot be taken for the
	// start of the parameters; SQLite decodes the %-escapes.
	esc := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path)
	return fmt.Sprintf("file:%s?_pragma=busy_timeout(%d)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_txlock=immediate",
		esc, BusyTimeoutMillis)
}

// Open opens (creating it if needed) the SQLite database file at path with
// the settings DSN describes, durability included.
func Open(path string) (*sql.DB, error) {
	db, err := sql.Open("sqlite", DSN(path))
	if err != nil {
		return nil, err
	}
	if err := db.Ping(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("postboxsqlite: open %s: %w", path, err)
	}
	return db, nil
}

// Driver adapts a *sql.DB opened with modernc.org/sqlite.
type Driver struct {
	db *sql.DB
}

var _ postboxdriver.Driver[*sql.Tx] = (*Driver)(nil)

// New returns a driver over db. See the package documentation for the
// settings db needs.
func New(db *sql.DB) (*Driver, error) {
	if _, ok := db.Driver().(*sqlite.Driver); !ok {
		return nil, fmt.Errorf("%w; got %T", ErrUnsupportedDriver, db.Driver())
	}
	return &Driver{db: db}, nil
}

// DB returns the database the driver uses.
func (d *Driver) DB() *sql.DB { return d.db }

// Open implements postboxdriver.Driver.
func (d *Driver) Open(prefix string) (postboxdriver.Store[*sql.Tx], error) {
	if err := postboxdriver.CheckPrefix(prefix); err != nil {
		return nil, err
	}
	return &store{shared: &shared{
		db: d.db, prefix: prefix,
		q: makeQueries(prefix), iq: makeInboxQueries(prefix), aq: makeAdminQueries(prefix), idq: makeIdempotencyQueries(prefix),
	}}, nil
}

// shared is what the Executors of one prefix share: the database and the
// statements.
type shared struct {
	db      *sql.DB
	prefix  string
	q       queries
	iq      inboxQueries
	aq      adminQueries
	idq     idempotencyQueries
	inserts sync.Map // row count -> INSERT statement
}

// store implements postboxdriver.Store[*sql.Tx] for one table prefix: on
// the database's pool, or (tx set) in the caller's transaction.
type store struct {
	*shared
	tx *sql.Tx
}

var _ postboxdriver.Store[*sql.Tx] = (*store)(nil)

// conn is what *sql.DB, *sql.Tx and *sql.Conn share.
type conn interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// UnwrapExecutor implements postboxdriver.Store.
func (s *store) UnwrapExecutor(tx *sql.Tx) postboxdriver.Executor {
	return &store{shared: s.shared, tx: tx}
}

// conn returns what single statements run on: the caller's transaction,
// or the pool.
func (s *store) conn() conn {
	if s.tx != nil {
		return s.tx
	}
	return s.db
}

// maxInsertRows bounds the rows of one INSERT: six variables a row keeps a
// chunk at 3,000, well under SQLite's limit of 32,766 variables.
const maxInsertRows = 500

// Insert implements postboxdriver.Executor. Rows go in with multi-row
// INSERT statements of at most maxInsertRows rows, whose text is built once
// per row count. Every row is checked before anything runs, and a write in
// several statements into the caller's transaction runs under a savepoint,
// so a failure leaves that transaction as it was: nothing of the batch is
// in it.
func (s *store) Insert(ctx context.Context, rows []postboxdriver.Row) error {
	if len(rows) == 0 {
		return nil
	}
	args := make([]any, 0, 6*len(rows))
	for i := range rows {
		r := &rows[i]
		id, err := postboxdriver.CanonicalID(r.ID)
		if err != nil {
			return fmt.Errorf("postboxsqlite: row %d: %w", i, err)
		}
		var key any
		if r.Key != "" {
			key = r.Key
		}
		payload := r.Payload
		if payload == nil {
			payload = []byte{} // nil would bind NULL
		}
		// The row's partition is computed here, from the id as stored, as
		// PostgreSQL's generated column does.
		args = append(args, id, r.Topic, key, payload, string(r.Headers), postboxdriver.PartitionOf(r.Key, id, partitions))
	}
	if len(rows) <= maxInsertRows {
		_, err := s.conn().ExecContext(ctx, s.insertSQL(len(rows)), args...)
		return s.wrap(err)
	}
	if s.tx == nil {
		return s.write(ctx, func(c conn) error { return s.insertChunks(ctx, c, args, len(rows)) })
	}
	return s.inSavepoint(ctx, "postbox_insert", func() error { return s.wrap(s.insertChunks(ctx, s.tx, args, len(rows))) })
}

func (s *store) insertChunks(ctx context.Context, c conn, args []any, n int) error {
	for start := 0; start < n; start += maxInsertRows {
		k := min(maxInsertRows, n-start)
		if _, err := c.ExecContext(ctx, s.insertSQL(k), args[6*start:6*(start+k)]...); err != nil {
			return err
		}
	}
	return nil
}

// inSavepoint runs fn in the caller's transaction under a savepoint, and
// rolls back to it if fn fails.
func (s *store) inSavepoint(ctx context.Context, name string, fn func() error) (err error) {
	if _, err := s.tx.ExecContext(ctx, "SAVEPOINT "+name); err != nil {
		return s.wrap(err)
	}
	defer func() {
		if err != nil {
			// ROLLBACK TO leaves the savepoint open; RELEASE ends it.
			// Both run even when ctx has ended, to leave tx clean.
			bg := context.WithoutCancel(ctx)
			if _, rbErr := s.tx.ExecContext(bg, "ROLLBACK TO "+name); rbErr != nil {
				err = errors.Join(err, rbErr)
				return
			}
			_, _ = s.tx.ExecContext(bg, "RELEASE "+name)
		}
	}()
	if err := fn(); err != nil {
		return err
	}
	_, err = s.tx.ExecContext(ctx, "RELEASE "+name)
	return s.wrap(err)
}

// insertSQL returns the INSERT statement for n rows, building it once.
func (s *store) insertSQL(n int) string {
	if q, ok := s.inserts.Load(n); ok {
		return q.(string)
	}
	var b strings.Builder
	b.WriteString("INSERT INTO " + s.prefix + "outbox (id, topic, key, payload, headers, partition) VALUES ")
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("(?,?,?,?,?,?)")
	}
	q, _ := s.inserts.LoadOrStore(n, b.String())
	return q.(string)
}

// InTx implements postboxdriver.Store. The transaction takes the write lock
// at once, as BEGIN IMMEDIATE would, even on a *sql.DB whose transactions
// begin DEFERRED: its first statement is a write that changes nothing. A
// transaction that read first and wrote later could otherwise fail at its
// first write with SQLITE_BUSY, which no busy timeout retries.
func (s *store) InTx(ctx context.Context, fn func(tx *sql.Tx) error) (err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return s.wrap(err)
	}
	done := false
	defer func() {
		if !done {
			_ = tx.Rollback()
		}
	}()
	if _, err := tx.ExecContext(ctx, s.q.lock); err != nil {
		return s.wrap(err)
	}
	if err := fn(tx); err != nil {
		return err
	}
	done = true
	return s.wrap(tx.Commit())
}

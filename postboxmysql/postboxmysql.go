// Package postboxmysql is the postbox driver for MySQL 8.0 and later and
// MariaDB 10.6 and later, through database/sql with go-sql-driver/mysql
// (driver name "mysql"). Transactions are *sql.Tx.
//
// The schema and the semantics are those of the PostgreSQL driver, table
// for table; times are BIGINT unix milliseconds taken from the database
// clock (UTC_TIMESTAMP, whatever the session's time zone), and the
// database computes each row's partition in a stored generated column, so
// that writers in other languages agree with Go.
//
// # The server and the connections
//
//   - InnoDB, with innodb_flush_log_at_trx_commit = 1 and, when the binary
//     log is on, sync_binlog = 1: otherwise a crash can undo transactions
//     that committed after the relay published their messages. The relay
//     warns at start when they are not so (DurabilityWarnings).
//   - max_allowed_packet above the largest message a writer sends (the
//     server's default is 16 MiB on MariaDB and 64 MiB on MySQL):
//     a larger packet is refused by the client before it reaches the
//     table's rules.
//   - Any transaction isolation for the application's transactions. The
//     relay reads with single statements outside any transaction of its
//     own, consistent reads that take no locks, so writers' gap locks never
//     block them; its writes run in transactions at READ COMMITTED, which
//     lock only the rows they name.
//
// Nothing is needed in the DSN: times travel as integers, and statements
// use only positional parameters. Open and ParseDSN send each statement's
// arguments with it (interpolateParams) unless the DSN says otherwise.
package postboxmysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/go-sql-driver/mysql"

	"github.com/postbox-go/postbox/internal/sqlkit"
	"github.com/postbox-go/postbox/postboxdriver"
)

// ErrUnsupportedDriver is returned by New for a *sql.DB that is not backed
// by go-sql-driver/mysql.
var ErrUnsupportedDriver = errors.New("postboxmysql: the *sql.DB must use github.com/go-sql-driver/mysql (driver name \"mysql\")")

// Driver adapts a *sql.DB opened with go-sql-driver/mysql.
type Driver struct {
	db *sql.DB
}

var _ postboxdriver.Driver[*sql.Tx] = (*Driver)(nil)

// New returns a driver over db.
func New(db *sql.DB) (*Driver, error) {
	if _, ok := db.Driver().(*mysql.MySQLDriver); !ok {
		return nil, fmt.Errorf("%w; got %T", ErrUnsupportedDriver, db.Driver())
	}
	return &Driver{db: db}, nil
}

// Open returns a *sql.DB for a MySQL or MariaDB DSN in go-sql-driver/mysql's
// form ("user:password@tcp(host:3306)/dbname"), or a URL
// ("mysql://user:password@host:3306/dbname?param=value", the parameters
// being the driver's). Like sql.Open, it connects on first use: a server
// that is down is an error of the first statement, which a relay retries.
func Open(dsn string) (*sql.DB, error) {
	cfg, err := ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(c), nil
}

// ParseDSN reads a DSN in go-sql-driver/mysql's form, or a mysql:// URL,
// into the client's configuration. Unless the DSN says otherwise
// (interpolateParams, or a charset or collation of its own), statements
// are sent with their arguments in one round trip (interpolateParams),
// instead of a prepare, an execute and a close for each: the driver
// escapes the arguments for utf8mb4, the connection's character set.
func ParseDSN(dsn string) (*mysql.Config, error) {
	var user *url.Userinfo
	if strings.HasPrefix(dsn, "mysql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return nil, fmt.Errorf("postboxmysql: %w", err)
		}
		host := u.Host
		if host == "" {
			host = "127.0.0.1:3306"
		}
		if u.Port() == "" && !strings.HasSuffix(host, ":") {
			host += ":3306"
		}
		user = u.User
		dsn = "tcp(" + host + ")/" + strings.TrimPrefix(u.Path, "/")
		if u.RawQuery != "" {
			dsn += "?" + u.RawQuery
		}
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("postboxmysql: %w", err)
	}
	if user != nil {
		cfg.User = user.Username()
		cfg.Passwd, _ = user.Password()
	}
	if !strings.Contains(dsn, "interpolateParams") && !strings.Contains(dsn, "charset") && !strings.Contains(dsn, "collation") {
		cfg.InterpolateParams = true
	}
	return cfg, nil
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

var (
	_ postboxdriver.Store[*sql.Tx]       = (*store)(nil)
	_ postboxdriver.ConnChecker[*sql.Tx] = (*store)(nil)
)

// conn is what *sql.DB, *sql.Tx and *sql.Conn share.
type conn = sqlkit.Conn

// UnwrapExecutor implements postboxdriver.Store.
func (s *store) UnwrapExecutor(tx *sql.Tx) postboxdriver.Executor {
	return &store{shared: s.shared, tx: tx}
}

// Dialect implements postboxdriver.Executor.
func (s *store) Dialect() string { return "mysql" }

// conn returns what single statements run on: the caller's transaction,
// or the pool.
func (s *store) conn() conn {
	if s.tx != nil {
		return s.tx
	}
	return s.db
}

// InTx implements postboxdriver.Store.
func (s *store) InTx(ctx context.Context, fn func(tx *sql.Tx) error) (err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return s.wrap(err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	if err = fn(tx); err != nil {
		return err
	}
	return s.wrap(tx.Commit())
}

// ConnLost implements postboxdriver.ConnChecker.
func (s *store) ConnLost(ctx context.Context, tx *sql.Tx) bool {
	return sqlkit.ConnLost(ctx, tx)
}

// maxInsertRows bounds the rows of one INSERT: five placeholders a row
// keep a statement at 5,000, under the protocol's 65,535.
const maxInsertRows = 1000

// Insert implements postboxdriver.Executor. Rows go in with multi-row
// INSERT statements of at most maxInsertRows rows, whose text is built once
// per row count; the server computes each row's partition. The rows were
// held to the table's rules in Go (the Client validates every message),
// so they are marked checked and the insert trigger skips them. A write in
// several statements into the caller's transaction runs under a savepoint,
// so a failure leaves that transaction as it was.
func (s *store) Insert(ctx context.Context, rows []postboxdriver.Row) error {
	if len(rows) == 0 {
		return nil
	}
	args := make([]any, 0, 5*len(rows))
	for i := range rows {
		r := &rows[i]
		id, err := postboxdriver.CanonicalID(r.ID)
		if err != nil {
			return fmt.Errorf("postboxmysql: row %d: %w", i, err)
		}
		var key any
		if r.Key != "" {
			key = r.Key
		}
		payload := r.Payload
		if payload == nil {
			payload = []byte{} // nil would bind NULL
		}
		args = append(args, id, r.Topic, key, payload, string(r.Headers))
	}
	if len(rows) <= maxInsertRows {
		_, err := s.conn().ExecContext(ctx, s.insertSQL(len(rows)), args...)
		return s.wrap(err)
	}
	return s.write(ctx, func(c conn) error {
		for start := 0; start < len(rows); start += maxInsertRows {
			k := min(maxInsertRows, len(rows)-start)
			if _, err := c.ExecContext(ctx, s.insertSQL(k), args[5*start:5*(start+k)]...); err != nil {
				return err
			}
		}
		return nil
	})
}

// insertSQL returns the INSERT statement for n rows, building it once.
func (s *store) insertSQL(n int) string {
	if q, ok := s.inserts.Load(n); ok {
		return q.(string)
	}
	var b strings.Builder
	b.WriteString("INSERT INTO " + s.prefix + "outbox (id, topic, `key`, payload, headers, checked) VALUES ")
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("(?,?,?,?,?,TRUE)")
	}
	q, _ := s.inserts.LoadOrStore(n, b.String())
	return q.(string)
}

// write runs fn in a transaction: the caller's, under a savepoint, so that
// an operation of several statements happens whole or leaves the
// transaction as it was; or one of its own at READ COMMITTED, retried when
// InnoDB chose it as a deadlock's victim (which rolled it back whole).
func (s *store) write(ctx context.Context, fn func(c conn) error) error {
	if s.tx != nil {
		return s.inSavepoint(ctx, "postbox_write", func() error { return fn(s.tx) })
	}
	var err error
	for attempt := 0; ; attempt++ {
		err = s.writeOnce(ctx, fn)
		if !isDeadlock(err) || attempt == 4 || ctx.Err() != nil {
			return s.wrap(err)
		}
	}
}

func (s *store) writeOnce(ctx context.Context, fn func(c conn) error) (err error) {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	if err = fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// inSavepoint runs fn in the caller's transaction under a savepoint, and
// rolls back to it if fn fails.
func (s *store) inSavepoint(ctx context.Context, name string, fn func() error) (err error) {
	if _, err := s.tx.ExecContext(ctx, "SAVEPOINT "+name); err != nil {
		return s.wrap(err)
	}
	defer func() {
		if err != nil {
			// Both run even when ctx has ended, to leave tx clean. A
			// deadlock has already rolled the whole transaction back, and
			// the savepoint with it.
			bg := context.WithoutCancel(ctx)
			if _, rbErr := s.tx.ExecContext(bg, "ROLLBACK TO SAVEPOINT "+name); rbErr != nil && !isDeadlock(err) {
				err = errors.Join(err, rbErr)
				return
			}
			_, _ = s.tx.ExecContext(bg, "RELEASE SAVEPOINT "+name)
		}
	}()
	if err := fn(); err != nil {
		return s.wrap(err)
	}
	_, err = s.tx.ExecContext(ctx, "RELEASE SAVEPOINT "+name)
	return s.wrap(err)
}

// MySQL's error numbers the driver acts on.
const (
	errNoSuchTable = 1146 // ER_NO_SUCH_TABLE
	errDupEntry    = 1062 // ER_DUP_ENTRY
	errDeadlock    = 1213 // ER_LOCK_DEADLOCK
)

func errNumber(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

func isDeadlock(err error) bool { return err != nil && errNumber(err) == errDeadlock }

// wrap maps a missing table to ErrNotMigrated.
func (s *store) wrap(err error) error {
	if err != nil && errNumber(err) == errNoSuchTable {
		return fmt.Errorf("%w (prefix %q): %w", postboxdriver.ErrNotMigrated, s.prefix, err)
	}
	return err
}

// stmt is a statement written with numbered placeholders (?1, ?2, as
// SQLite and PostgreSQL number theirs), which MySQL does not have: the
// text carries plain ? marks and idx says which argument each one takes.
type stmt struct {
	sql string
	idx []int
}

var numbered = regexp.MustCompile(`\?([0-9]+)`)

// prep turns a statement with numbered placeholders into a stmt.
func prep(q string) stmt {
	var idx []int
	out := numbered.ReplaceAllStringFunc(q, func(m string) string {
		n, _ := strconv.Atoi(m[1:])
		idx = append(idx, n-1)
		return "?"
	})
	return stmt{sql: out, idx: idx}
}

// args lays a out in the order of the statement's placeholders.
func (st stmt) args(a ...any) []any {
	out := make([]any, len(st.idx))
	for i, j := range st.idx {
		out[i] = a[j]
	}
	return out
}

func (st stmt) exec(ctx context.Context, c conn, a ...any) (int64, error) {
	return sqlkit.Affected(c.ExecContext(ctx, st.sql, st.args(a...)...))
}

func (st stmt) row(ctx context.Context, c conn, a ...any) *sql.Row {
	return c.QueryRowContext(ctx, st.sql, st.args(a...)...)
}

// query runs st on c and scans every row with scan.
func query[T any](ctx context.Context, c conn, st stmt, args []any, scan func(r *sql.Rows) (T, error)) ([]T, error) {
	return sqlkit.QueryAll(ctx, c, st.sql, st.args(args...), scan)
}

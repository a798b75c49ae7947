package postboxidem_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/mysqltest"
	"github.com/postbox-go/postbox/internal/sqlitetest"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxidem"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxmysql"
	"github.com/postbox-go/postbox/postboxpgx"
	"github.com/postbox-go/postbox/postboxsql"
	"github.com/postbox-go/postbox/postboxsqlite"
)

func TestMain(m *testing.M) {
	if os.Getenv(killHelperEnv) != "" {
		os.Exit(runKilledServer())
	}
	goleak.VerifyTestMain(m)
}

// wait bounds every wait in these tests.
const wait = 20 * time.Second

// env is one backend: a migrated table prefix, a domain table "orders",
// and a postbox Client that writes outbox messages.
type env[TTx any] struct {
	name   string
	prefix string
	path   string // the database file, on SQLite
	driver postboxdriver.Driver[TTx]
	store  postboxdriver.Store[TTx]
	db     backendDB[TTx]
	client *postbox.Client[TTx]
	sql    dialectSQL
}

// backendDB runs the tests' own SQL with the backend's database client:
// the example app's orders, and time passing on the database clock.
type backendDB[TTx any] struct {
	dialect string
	exec    func(ctx context.Context, query string, args ...any) (int64, error)
	// queryInt runs a query returning one integer, in tx unless tx is the
	// zero value.
	queryInt func(ctx context.Context, tx TTx, query string, args ...any) (int64, error)
}

// dbOf reaches the database behind one of postbox's drivers.
func dbOf[TTx any](d postboxdriver.Driver[TTx]) (backendDB[TTx], error) {
	var db backendDB[TTx]
	switch d := any(d).(type) {
	case *postboxpgx.Driver:
		pool := d.Pool()
		db.dialect = "postgres"
		db.exec = func(ctx context.Context, query string, args ...any) (int64, error) {
			tag, err := pool.Exec(ctx, query, args...)
			return tag.RowsAffected(), err
		}
		db.queryInt = func(ctx context.Context, tx TTx, query string, args ...any) (int64, error) {
			var n int64
			if t, ok := any(tx).(pgx.Tx); ok && t != nil {
				return n, t.QueryRow(ctx, query, args...).Scan(&n)
			}
			return n, pool.QueryRow(ctx, query, args...).Scan(&n)
		}
	case *postboxsql.Driver:
		db = sqlBackend[TTx]("postgres", d.DB())
	case *postboxsqlite.Driver:
		db = sqlBackend[TTx]("sqlite", d.DB())
	case *postboxmysql.Driver:
		db = sqlBackend[TTx]("mysql", d.DB())
	default:
		return db, fmt.Errorf("no database client for %T", d)
	}
	return db, nil
}

func sqlBackend[TTx any](dialect string, sdb *sql.DB) backendDB[TTx] {
	return backendDB[TTx]{
		dialect: dialect,
		exec: func(ctx context.Context, query string, args ...any) (int64, error) {
			res, err := sdb.ExecContext(ctx, query, args...)
			if err != nil {
				return 0, err
			}
			return res.RowsAffected()
		},
		queryInt: func(ctx context.Context, tx TTx, query string, args ...any) (int64, error) {
			var n int64
			if t, ok := any(tx).(*sql.Tx); ok && t != nil {
				return n, t.QueryRowContext(ctx, query, args...).Scan(&n)
			}
			return n, sdb.QueryRowContext(ctx, query, args...).Scan(&n)
		},
	}
}

// dialectSQL is the SQL the tests run themselves, per dialect.
type dialectSQL struct {
	createOrders, insertOrder string
	// expireRecords moves every record's TTL into the past; expireClaims
	// does the same to the claims still processing. They stand for time
	// passing on the database clock.
	expireRecords, expireClaims string
	// holdClaims turns the records of /reject into claims held for an
	// hour more, as a server that dies leaves its claim.
	holdClaims string
}

var postgresSQL = dialectSQL{
	createOrders:  `CREATE TABLE {p}orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, body bytea NOT NULL)`,
	insertOrder:   `INSERT INTO {p}orders (body) VALUES ($1) RETURNING id`,
	expireRecords: `UPDATE {p}idempotency SET expires_at = now() - interval '1 second'`,
	expireClaims:  `UPDATE {p}idempotency SET claim_expires_at = now() - interval '1 second' WHERE state = 'processing'`,
	holdClaims:    `UPDATE {p}idempotency SET state = 'processing', claim_expires_at = now() + interval '1 hour' WHERE path = '/reject'`,
}

const sqliteNow = `(SELECT CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER))`

var sqliteSQL = dialectSQL{
	createOrders:  `CREATE TABLE {p}orders (id INTEGER PRIMARY KEY, body BLOB NOT NULL) STRICT`,
	insertOrder:   `INSERT INTO {p}orders (body) VALUES (?1) RETURNING id`,
	expireRecords: `UPDATE {p}idempotency SET expires_at = ` + sqliteNow + ` - 1000`,
	expireClaims:  `UPDATE {p}idempotency SET claim_expires_at = ` + sqliteNow + ` - 1000 WHERE state = 'processing'`,
	holdClaims:    `UPDATE {p}idempotency SET state = 'processing', claim_expires_at = ` + sqliteNow + ` + 3600000 WHERE path = '/reject'`,
}

const mysqlNow = `(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000)`

// mysqlSQL is MariaDB's (INSERT ... RETURNING is MariaDB's, not MySQL's).
var mysqlSQL = dialectSQL{
	createOrders:  `CREATE TABLE {p}orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, body LONGBLOB NOT NULL) ENGINE = InnoDB`,
	insertOrder:   `INSERT INTO {p}orders (body) VALUES (?) RETURNING id`,
	expireRecords: `UPDATE {p}idempotency SET expires_at = ` + mysqlNow + ` - 1000`,
	expireClaims:  `UPDATE {p}idempotency SET claim_expires_at = ` + mysqlNow + ` - 1000 WHERE state = 'processing'`,
	holdClaims:    `UPDATE {p}idempotency SET state = 'processing', claim_expires_at = ` + mysqlNow + ` + 3600000 WHERE path = '/reject'`,
}

func newPgx(t *testing.T) *env[pgx.Tx] {
	pool := testdb.Pool(t)
	prefix := testdb.Prefix(t)
	testdb.DropPrefix(t, pool, prefix)
	return setup(t, "pgx", postboxpgx.New(pool), prefix)
}

func newSQL(t *testing.T) *env[*sql.Tx] {
	pool := testdb.Pool(t)
	prefix := testdb.Prefix(t)
	testdb.DropPrefix(t, pool, prefix)
	db := testdb.SQLDB(t)
	db.SetMaxOpenConns(8) // the concurrency tests must not exhaust the server's connections
	d, err := postboxsql.New(db)
	if err != nil {
		t.Fatal(err)
	}
	return setup(t, "sql", d, prefix)
}

func newMySQL(t *testing.T) *env[*sql.Tx] {
	d, prefix := mysqltest.Driver(t)
	d.DB().SetMaxOpenConns(8)
	return setup(t, "mysql", d, prefix)
}

func newSQLite(t *testing.T) *env[*sql.Tx] {
	path := sqlitetest.Path(t)
	e := setup(t, "sqlite", sqlitetest.DriverAt(t, path), "pb_")
	e.path = path
	return e
}

// setup migrates prefix's tables, adds the orders table, and returns the
// env over them.
func setup[TTx any](t *testing.T, name string, d postboxdriver.Driver[TTx], prefix string) *env[TTx] {
	t.Helper()
	m, err := postboxmigrate.New(d, &postboxmigrate.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(context.Background()); err != nil {
		t.Fatal(err)
	}
	e, err := openEnv(name, d, prefix)
	if err != nil {
		t.Fatal(err)
	}
	e.exec(t, e.sql.createOrders)
	return e
}

// openEnv returns the env over tables that exist already.
func openEnv[TTx any](name string, d postboxdriver.Driver[TTx], prefix string) (*env[TTx], error) {
	store, err := d.Open(prefix)
	if err != nil {
		return nil, err
	}
	db, err := dbOf(d)
	if err != nil {
		return nil, err
	}
	client, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix})
	if err != nil {
		return nil, err
	}
	e := &env[TTx]{name: name, prefix: prefix, driver: d, store: store, db: db, client: client}
	base := postgresSQL
	switch db.dialect {
	case "sqlite":
		base = sqliteSQL
	case "mysql":
		base = mysqlSQL
	}
	r := strings.NewReplacer("{p}", prefix)
	e.sql = dialectSQL{
		createOrders: r.Replace(base.createOrders), insertOrder: r.Replace(base.insertOrder),
		expireRecords: r.Replace(base.expireRecords), expireClaims: r.Replace(base.expireClaims),
		holdClaims: r.Replace(base.holdClaims),
	}
	return e, nil
}

// each runs a test on PostgreSQL through pgx, through database/sql, on
// MariaDB and on SQLite.
func each(t *testing.T, pg func(*testing.T, *env[pgx.Tx]), sq func(*testing.T, *env[*sql.Tx])) {
	t.Run("pgx", func(t *testing.T) { pg(t, newPgx(t)) })
	t.Run("sql", func(t *testing.T) { sq(t, newSQL(t)) })
	t.Run("mysql", func(t *testing.T) { sq(t, newMySQL(t)) })
	t.Run("sqlite", func(t *testing.T) { sq(t, newSQLite(t)) })
}

func (e *env[TTx]) exec(t *testing.T, query string, args ...any) int64 {
	t.Helper()
	n, err := e.db.exec(context.Background(), query, args...)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// count counts the rows of one of the prefix's tables.
func (e *env[TTx]) count(t *testing.T, table, where string) int {
	t.Helper()
	q := "SELECT count(*) FROM " + e.prefix + table
	if where != "" {
		q += " WHERE " + where
	}
	var none TTx
	n, err := e.db.queryInt(context.Background(), none, q)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return int(n)
}

// outbox counts the outbox messages written.
func (e *env[TTx]) outbox(t *testing.T) int64 {
	t.Helper()
	st, err := e.client.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st.Pending
}

// middleware builds a Middleware over e's tables; cfg may be nil.
func (e *env[TTx]) middleware(t *testing.T, cfg *postboxidem.Config) *postboxidem.Middleware[TTx] {
	t.Helper()
	var c postboxidem.Config
	if cfg != nil {
		c = *cfg
	}
	c.Prefix = e.prefix
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	m, err := postboxidem.New(e.driver, &c)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// app is the service under test: handlers that write an order and an
// outbox message in the middleware's transaction, and fail in the ways the
// rules care about.
type app[TTx any] struct {
	e       *env[TTx]
	runs    atomic.Int64 // handler executions, every route
	firsts  map[string]*atomic.Int64
	started chan struct{} // /block: the handler has written its order
	release chan struct{} // /block: closed by unblock to let it finish
	unblock func()
	gate    chan struct{} // /gate: closed when every concurrent request is in
}

func newApp[TTx any](e *env[TTx]) *app[TTx] {
	a := &app[TTx]{e: e, firsts: map[string]*atomic.Int64{"flaky": {}, "throttle": {}, "panic": {}},
		started: make(chan struct{}, 64), release: make(chan struct{}), gate: make(chan struct{})}
	a.unblock = sync.OnceFunc(func() { close(a.release) })
	return a
}

// insert writes an order and its outbox message in the middleware's
// transaction, or in one of its own when the request passed through.
func (a *app[TTx]) insert(r *http.Request) (int64, error) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return 0, err
	}
	var id int64
	write := func(tx TTx) error {
		var err error
		if id, err = a.e.db.queryInt(r.Context(), tx, a.e.sql.insertOrder, body); err != nil {
			return err
		}
		return a.e.client.WriteTx(r.Context(), tx, postbox.Message{Topic: "orders.created", Key: strconv.FormatInt(id, 10), Payload: body})
	}
	if tx, ok := postboxidem.TxFromContext[TTx](r.Context()); ok {
		return id, write(tx)
	}
	return id, a.e.store.InTx(r.Context(), write)
}

func (a *app[TTx]) created(w http.ResponseWriter, id, run int64) {
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", id))
	w.Header().Set("X-Run", strconv.FormatInt(run, 10))
	http.SetCookie(w, &http.Cookie{Name: "session", Value: fmt.Sprintf("s%d", run)})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order":%d,"run":%d}`, id, run)
}

func (a *app[TTx]) createOrder(w http.ResponseWriter, r *http.Request) {
	run := a.runs.Add(1)
	id, err := a.insert(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	a.created(w, id, run)
}

// firstFails answers the first call with fail, after writing an order
// (which the release must roll back), and creates an order afterwards.
func (a *app[TTx]) firstFails(name string, fail func(w http.ResponseWriter)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if a.firsts[name].Add(1) > 1 {
			a.createOrder(w, r)
			return
		}
		a.runs.Add(1)
		if _, err := a.insert(r); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fail(w)
	}
}

func (a *app[TTx]) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", a.createOrder)
	mux.HandleFunc("PUT /orders", a.createOrder)
	mux.HandleFunc("POST /fail", func(w http.ResponseWriter, r *http.Request) {
		a.runs.Add(1)
		_, _ = a.insert(r)
		http.Error(w, "down", http.StatusInternalServerError)
	})
	mux.HandleFunc("POST /reject", func(w http.ResponseWriter, r *http.Request) {
		a.runs.Add(1)
		if _, err := a.insert(r); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		http.Error(w, "rejected", http.StatusBadRequest)
	})
	mux.HandleFunc("POST /flaky", a.firstFails("flaky", func(w http.ResponseWriter) {
		http.Error(w, "flaky", http.StatusBadGateway)
	}))
	mux.HandleFunc("POST /throttle", a.firstFails("throttle", func(w http.ResponseWriter) {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "slow down", http.StatusTooManyRequests)
	}))
	mux.HandleFunc("POST /panic", a.firstFails("panic", func(http.ResponseWriter) { panic("boom") }))
	mux.HandleFunc("POST /big", func(w http.ResponseWriter, r *http.Request) {
		run := a.runs.Add(1)
		id, err := a.insert(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("X-Run", strconv.FormatInt(run, 10))
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(bigBody(id))
	})
	mux.HandleFunc("POST /block", func(w http.ResponseWriter, r *http.Request) {
		run := a.runs.Add(1)
		id, err := a.insert(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		a.started <- struct{}{}
		<-a.release
		a.created(w, id, run)
	})
	mux.HandleFunc("POST /gate", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-a.gate:
		case <-time.After(wait):
			http.Error(w, "the gate never opened", http.StatusInternalServerError)
			return
		}
		a.createOrder(w, r)
	})
	return mux
}

// bigBody is 4 KiB, over the tests' MaxResponseBytes, and names its order.
func bigBody(id int64) []byte {
	b := []byte(strings.Repeat(fmt.Sprintf("order %08d\n", id), 4096/15+1))
	return b[:4096]
}

// testConfig is the middleware configuration of most tests: small caps,
// a claim that does not expire by itself during a test, and the caller's
// identity from a header.
func testConfig() *postboxidem.Config {
	return &postboxidem.Config{
		MaxBodyBytes:     1024,
		MaxResponseBytes: 1024,
		ClaimExpiry:      time.Hour,
		Identity:         func(r *http.Request) string { return r.Header.Get("X-User") },
	}
}

// serve starts a server for a's routes behind h, closed when t ends. Its
// blocked handlers are let go first, so that a test that fails while one
// waits does not hang in closing the server.
func serve[TTx any](t *testing.T, a *app[TTx], h http.Handler) *httptest.Server {
	srv := httptest.NewUnstartedServer(h)
	// Panicking handlers are part of the tests; their stack traces are not.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	t.Cleanup(func() {
		a.unblock()
		srv.Close()
	})
	return srv
}

// client sends each request on a fresh connection: net/http retries a
// request carrying an Idempotency-Key by itself when a reused connection
// fails, which would hide what the tests look at.
var client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: wait}

type reply struct {
	status  int // 0 when the request failed
	err     error
	header  http.Header
	body    string
	problem struct {
		Error          string `json:"error"`
		Field          string `json:"field"`
		Code           string `json:"code"`
		OriginalStatus int    `json:"original_status"`
	}
}

func (r reply) replayed() bool { return r.header.Get(postboxidem.HeaderReplayed) == "true" }

func (r reply) String() string {
	return fmt.Sprintf("%d %q replayed=%t err=%v", r.status, r.body, r.header != nil && r.replayed(), r.err)
}

// send makes one request. keys are the Idempotency-Key header values;
// more headers come as name, value pairs after a "" separator.
func send(url, method, path, body string, keys ...string) reply {
	req, err := http.NewRequest(method, url+path, strings.NewReader(body))
	if err != nil {
		return reply{err: err}
	}
	extra := false
	for i := 0; i < len(keys); i++ {
		switch {
		case keys[i] == "" && !extra:
			extra = true
		case extra:
			req.Header.Add(keys[i], keys[i+1])
			i++
		default:
			req.Header.Add(postboxidem.HeaderKey, keys[i])
		}
	}
	resp, err := client.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, header: resp.Header, body: string(b), err: err}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		_ = json.Unmarshal(b, &r.problem)
	}
	return r
}

// recv waits for ch, failing t after the bound.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(wait):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

//go:build faults

package faults

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/sqlkit"
	"github.com/postbox-go/postbox/postboxmysql"
)

// The database users of a run on MariaDB: the relays and the consumer
// connect as users of their own, so that a connection kill finds their
// connections, and nobody else's, in the process list; the writers and
// the harness connect as root.
const (
	mariaDBName   = "fx"
	mariaRelay    = "fxrelay"
	mariaConsumer = "fxconsumer"
)

// mariaNow is the database clock in unix microseconds, for the effects'
// applied_at.
const mariaNow = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))"

// mariaServer is a mariadbd made for the run (mariadb-install-db) on a
// data directory, port and socket of its own, with
// innodb_flush_log_at_trx_commit = 1 and no binary log, which the
// database faults restart: fast (SIGTERM, a clean shutdown) or immediate
// (SIGKILL, a crash recovered from InnoDB's redo log at start). It runs
// in the foreground as the harness's child, so it dies with the harness
// however that ends; as root it runs as the mysql user. The machine's own
// MariaDB is never touched. POSTBOX_FAULTS_MARIADB_BINDIR names the
// directory of mariadbd and mariadb-install-db (default: /usr/sbin and
// /usr/bin).
type mariaServer struct {
	mariadbd, installDB   string
	base, data, sock, log string
	port                  int
	runAs                 *user.User // nil: the current user
	proc                  child
}

func startMariaDB(t *testing.T, ctx context.Context) *mariaServer {
	t.Helper()
	s := &mariaServer{mariadbd: "/usr/sbin/mariadbd", installDB: "/usr/bin/mariadb-install-db"}
	if dir := os.Getenv("POSTBOX_FAULTS_MARIADB_BINDIR"); dir != "" {
		s.mariadbd, s.installDB = filepath.Join(dir, "mariadbd"), filepath.Join(dir, "mariadb-install-db")
	}
	for _, bin := range []string{s.mariadbd, s.installDB} {
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("MariaDB: %v (set POSTBOX_FAULTS_MARIADB_BINDIR)", err)
		}
	}
	if os.Geteuid() == 0 {
		var err error
		if s.runAs, err = user.Lookup("mysql"); err != nil {
			t.Fatalf("running as root needs a mysql user to run the server: %v", err)
		}
	}
	// Not under the test's temporary directory: that one is private to
	// root, and the server runs as mysql.
	var err error
	if s.base, err = os.MkdirTemp("", "postbox-faults-mariadb-"); err != nil {
		t.Fatal(err)
	}
	if s.port, err = freePort(); err != nil {
		t.Fatal(err)
	}
	s.data, s.sock, s.log = filepath.Join(s.base, "data"), filepath.Join(s.base, "mariadbd.sock"), filepath.Join(s.base, "mariadbd.log")
	if err := chown(s.base, s.runAs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.stop("immediate")
		_ = os.RemoveAll(s.base)
	})
	// root@127.0.0.1 without a password (normal authentication): the
	// harness's user, which makes the others once the server runs.
	if out, err := s.command(ctx, s.installDB, "--no-defaults", "--datadir="+s.data,
		"--auth-root-authentication-method=normal", "--skip-test-db", "--skip-name-resolve").CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	if err := s.start(ctx); err != nil {
		t.Fatalf("start MariaDB at %s: %v", s.data, err)
	}
	return s
}

// command makes a command for one of the server's programs, as the mysql
// user when the harness runs as root.
func (s *mariaServer) command(ctx context.Context, bin string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = os.Environ()
	runAs(cmd, s.runAs, s.base, s.base)
	return cmd
}

func (s *mariaServer) addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

// url is user's URL for the database db ("" for none) on the server.
func (s *mariaServer) url(u, db string) string { return mariaURL(u, s.addr(), db) }

// mariaURL is user's URL for the database db at addr: root has no
// password, the others their name.
func mariaURL(u, addr, db string) string {
	cred := u
	if u != "root" {
		cred += ":" + u
	}
	return fmt.Sprintf("mysql://%s@%s/%s", cred, addr, db)
}

// start runs the server and waits until it answers a query.
func (s *mariaServer) start(ctx context.Context) error {
	cmd := s.command(context.WithoutCancel(ctx), s.mariadbd, "--no-defaults", "--datadir="+s.data,
		"--port="+strconv.Itoa(s.port), "--bind-address=127.0.0.1", "--socket="+s.sock,
		"--pid-file="+filepath.Join(s.base, "mariadbd.pid"), "--skip-name-resolve", "--skip-log-bin",
		"--innodb-flush-log-at-trx-commit=1", "--innodb-buffer-pool-size=64M", "--max-connections=300")
	done, err := s.proc.launch(cmd, s.log)
	if err != nil {
		return err
	}
	db, err := postboxmysql.Open(s.url("root", ""))
	if err != nil {
		return err
	}
	defer db.Close()
	return waitReady(ctx, done, "mariadbd", s.log, func() error {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return db.PingContext(pctx)
	})
}

// stop shuts the server down: "fast" (SIGTERM: a clean shutdown) or
// "immediate" (SIGKILL: recovery from the redo log at the next start, as
// after a crash).
func (s *mariaServer) stop(mode string) error {
	return stopServer(&s.proc, "mariadbd", mode, syscall.SIGTERM, syscall.SIGKILL)
}

// restart stops the server in mode ("fast" or "immediate"), waits hold,
// and starts it again.
func (s *mariaServer) restart(ctx context.Context, mode string, hold time.Duration) error {
	if err := s.stop(mode); err != nil {
		return err
	}
	sleep(ctx, hold)
	return s.start(context.WithoutCancel(ctx))
}

// mariaDatabase is MariaDB: the run's server, the writers' pool as root.
type mariaDatabase struct {
	srv    *mariaServer
	db     *sql.DB
	prefix string
	client *postbox.Client[*sql.Tx]
}

func newMariaDatabase(ctx context.Context, h *harness) *mariaDatabase {
	t := h.t
	t.Helper()
	srv := startMariaDB(t, ctx)
	root, err := postboxmysql.Open(srv.url("root", ""))
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	// The users the relays and the consumer connect as.
	stmts := []string{"CREATE DATABASE " + mariaDBName}
	for _, u := range []string{mariaRelay, mariaConsumer} {
		stmts = append(stmts,
			fmt.Sprintf("CREATE USER '%s'@'127.0.0.1' IDENTIFIED BY '%s'", u, u),
			fmt.Sprintf("GRANT ALL PRIVILEGES ON %s.* TO '%s'@'127.0.0.1'", mariaDBName, u))
	}
	for _, q := range stmts {
		if _, err := root.ExecContext(ctx, q); err != nil {
			t.Fatalf("MariaDB: %s: %v", q, err)
		}
	}
	d := &mariaDatabase{srv: srv, prefix: h.prefix}
	if d.db, err = postboxmysql.Open(srv.url("root", mariaDBName)); err != nil {
		t.Fatal(err)
	}
	d.db.SetMaxOpenConns(h.prof.Writers + 4)
	t.Cleanup(func() { _ = d.db.Close() })
	driver, err := postboxmysql.New(d.db)
	if err != nil {
		t.Fatal(err)
	}
	p := h.prefix
	const table = " ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin"
	keys := make([]string, h.prof.Keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("('k%04d')", i)
	}
	// The same tables as on PostgreSQL (newPGDatabase says what each is
	// for); applied_at in unix microseconds on the database clock.
	domain := []string{
		"CREATE TABLE " + p + "entities (`key` VARCHAR(64) PRIMARY KEY, seq INT NOT NULL DEFAULT 0)" + table,
		"CREATE TABLE " + p + "writes (message_id VARCHAR(36) PRIMARY KEY, `key` VARCHAR(64) NOT NULL, seq INT NOT NULL)" + table,
		"CREATE TABLE " + p + "effects (message_id VARCHAR(36) PRIMARY KEY, `key` VARCHAR(64) NOT NULL, seq INT NOT NULL, applied_at BIGINT NOT NULL)" + table,
		"CREATE TABLE " + p + "dup_effects (message_id VARCHAR(36) NOT NULL, applied_at BIGINT NOT NULL)" + table,
		"INSERT INTO " + p + "entities (`key`) VALUES " + strings.Join(keys, ", "),
	}
	exec := func(ctx context.Context, q string) error {
		_, err := d.db.ExecContext(ctx, q)
		return err
	}
	if d.client, err = prepare(ctx, driver, p, exec, domain); err != nil {
		t.Fatal(err)
	}
	return d
}

func (d *mariaDatabase) name() string    { return "MariaDB" }
func (d *mariaDatabase) hosts() []string { return []string{d.srv.addr()} }

func (d *mariaDatabase) relayURL(via []string, _ int) string {
	return mariaURL(mariaRelay, via[0], mariaDBName)
}

func (d *mariaDatabase) consumer() consumerDB {
	return consumerDB{Kind: dbMariaDB, URL: d.srv.url(mariaConsumer, mariaDBName)}
}

func (d *mariaDatabase) begin(ctx context.Context) (dbTx, error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return &mariaTx{tx: tx, d: d}, nil
}

func (d *mariaDatabase) pending(ctx context.Context) (int64, error) {
	st, err := d.client.Stats(ctx)
	return st.Pending, err
}

func (d *mariaDatabase) count(ctx context.Context, table string) (int, error) {
	var n int
	err := d.db.QueryRowContext(ctx, "SELECT count(*) FROM "+d.prefix+table).Scan(&n)
	return n, err
}

func (d *mariaDatabase) column(ctx context.Context, table, col, cond string) ([]string, error) {
	q := "SELECT " + col + " FROM " + d.prefix + table
	if cond != "" {
		q += " WHERE " + cond
	}
	return sqlkit.QueryAll(ctx, d.db, q, nil, sqlkit.ScanString)
}

func (d *mariaDatabase) effects(ctx context.Context) ([]effectRow, error) {
	return sqlkit.QueryAll(ctx, d.db, "SELECT message_id, `key`, seq, applied_at FROM "+d.prefix+"effects", nil, func(r *sql.Rows) (effectRow, error) {
		var e effectRow
		var us int64
		err := r.Scan(&e.ID, &e.Key, &e.Seq, &us)
		e.At = time.UnixMicro(us)
		return e, err
	})
}

// terminate kills the connections of the relays' user, and of the
// consumer's when consumer is set.
func (d *mariaDatabase) terminate(ctx context.Context, consumer bool) (int, error) {
	users := "'" + mariaRelay + "'"
	if consumer {
		users += ", '" + mariaConsumer + "'"
	}
	ids, err := sqlkit.QueryAll(ctx, d.db, "SELECT id FROM information_schema.processlist WHERE user IN ("+users+")", nil, func(r *sql.Rows) (int64, error) {
		var id int64
		return id, r.Scan(&id)
	})
	n := 0
	for _, id := range ids {
		// A connection that ended meanwhile is an unknown thread.
		if _, err := d.db.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id)); err == nil {
			n++
		}
	}
	return n, err
}

// snapshot opens START TRANSACTION WITH CONSISTENT SNAPSHOT on a
// connection of its own: its read view holds InnoDB's purge back.
func (d *mariaDatabase) snapshot(ctx context.Context) (func(), error) {
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	release := func() {
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
		_ = conn.Close()
	}
	var n int
	if _, err := conn.ExecContext(ctx, "START TRANSACTION WITH CONSISTENT SNAPSHOT"); err != nil {
		release()
		return nil, err
	}
	if err := conn.QueryRowContext(ctx, "SELECT count(*) FROM "+d.prefix+"outbox").Scan(&n); err != nil {
		release()
		return nil, err
	}
	return release, nil
}

func (d *mariaDatabase) restart(ctx context.Context, mode string, hold time.Duration) error {
	return d.srv.restart(ctx, mode, hold)
}

// mariaTx is a writer's transaction on MariaDB, whose UPDATE returns no
// rows: the seq is read back under the row lock the UPDATE took.
type mariaTx struct {
	tx *sql.Tx
	d  *mariaDatabase
}

func (x *mariaTx) lock(ctx context.Context, key string, n int) (int, error) {
	if _, err := x.tx.ExecContext(ctx, "UPDATE "+x.d.prefix+"entities SET seq = seq + ? WHERE `key` = ?", n, key); err != nil {
		return 0, err
	}
	var last int
	err := x.tx.QueryRowContext(ctx, "SELECT seq FROM "+x.d.prefix+"entities WHERE `key` = ?", key).Scan(&last)
	return last, err
}

func (x *mariaTx) write(ctx context.Context, key string, msgs []postbox.Message, seqs []int) error {
	if err := x.d.client.WriteTx(ctx, x.tx, msgs...); err != nil {
		return err
	}
	rows := make([]string, len(msgs))
	args := make([]any, 0, 3*len(msgs))
	for i, m := range msgs {
		rows[i] = "(?, ?, ?)"
		args = append(args, m.ID, key, seqs[i])
	}
	_, err := x.tx.ExecContext(ctx, "INSERT INTO "+x.d.prefix+"writes (message_id, `key`, seq) VALUES "+strings.Join(rows, ", "), args...)
	return err
}

func (x *mariaTx) commit(context.Context) error { return x.tx.Commit() }

func (x *mariaTx) rollback(context.Context) error {
	if err := x.tx.Rollback(); !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return nil
}

// openMariaConsumer is the consumer process's processor on MariaDB, and
// what closes its pool. A duplicate effect updates nothing, so that it
// counts no row (go-sql-driver reports changed rows, not found ones).
func openMariaConsumer(_ context.Context, c consumerCase, cfg *postbox.Config, a applier) (postbox.Processor, func(), error) {
	db, err := postboxmysql.Open(c.DB.URL)
	if err != nil {
		return nil, nil, err
	}
	db.SetMaxOpenConns(8)
	closeDB := func() { _ = db.Close() }
	driver, err := postboxmysql.New(db)
	if err != nil {
		closeDB()
		return nil, nil, err
	}
	client, err := postbox.NewClient(driver, cfg)
	if err != nil {
		closeDB()
		return nil, nil, err
	}
	a.effect = "INSERT INTO " + c.Prefix + "effects (message_id, `key`, seq, applied_at) VALUES (?, ?, ?, " + mariaNow + ") ON DUPLICATE KEY UPDATE message_id = message_id"
	a.dup = "INSERT INTO " + c.Prefix + "dup_effects (message_id, applied_at) VALUES (?, " + mariaNow + ")"
	return client.Inbox().Processor(consumerName, func(ctx context.Context, tx *sql.Tx, d *postbox.Delivery) error {
		return a.apply(func(q string, args ...any) (int64, error) {
			res, err := tx.ExecContext(ctx, q, args...)
			if err != nil {
				return 0, err
			}
			return res.RowsAffected()
		}, d)
	}), closeDB, nil
}

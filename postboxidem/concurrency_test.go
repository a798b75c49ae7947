package postboxidem_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox/internal/mysqltest"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxidem"
	"github.com/postbox-go/postbox/postboxmysql"
	"github.com/postbox-go/postbox/postboxpgx"
	"github.com/postbox-go/postbox/postboxsql"
	"github.com/postbox-go/postbox/postboxsqlite"
)

const duplicates = 50

func TestConcurrentDuplicates(t *testing.T) {
	each(t, testConcurrentDuplicates[pgx.Tx], testConcurrentDuplicates[*sql.Tx])
}

// testConcurrentDuplicates: 50 copies of one request at once run the
// handler once. The handler waits until every copy has reached the server,
// so all of them meet a request in progress.
func testConcurrentDuplicates[TTx any](t *testing.T, e *env[TTx]) {
	a := newApp(e)
	h := e.middleware(t, testConfig()).Handler(a.routes())
	var arrived atomic.Int64
	srv := serve(t, a, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if arrived.Add(1) == duplicates {
			close(a.gate)
		}
		h.ServeHTTP(w, r)
	}))
	replies := race(srv.URL, "/gate", "dup-1")
	checkOneRun(t, replies)
	if a.runs.Load() != 1 || e.count(t, "orders", "") != 1 || e.outbox(t) != 1 {
		t.Errorf("runs %d, orders %d, outbox %d; want 1 each", a.runs.Load(), e.count(t, "orders", ""), e.outbox(t))
	}
}

// race sends duplicates copies of one request at once.
func race(url, path, key string) []reply {
	replies := make([]reply, duplicates)
	var wg sync.WaitGroup
	for i := range replies {
		wg.Go(func() { replies[i] = send(url, "POST", path, `{"item":"book"}`, key) })
	}
	wg.Wait()
	return replies
}

// checkOneRun checks that exactly one reply comes from a run and every
// other one is a 409 or a replay of it.
func checkOneRun(t *testing.T, replies []reply) {
	t.Helper()
	var original reply
	originals, conflicts, replays := 0, 0, 0
	for _, r := range replies {
		switch {
		case r.status == 201 && !r.replayed():
			originals++
			original = r
		case r.status == 201:
			replays++
		case r.status == 409 && r.problem.Code == postboxidem.CodeInProgress:
			conflicts++
		default:
			t.Errorf("unexpected reply %s", r)
		}
	}
	for _, r := range replies {
		if r.status == 201 && r.replayed() && r.body != original.body {
			t.Errorf("replay %q differs from the run's %q", r.body, original.body)
		}
	}
	if originals != 1 {
		t.Errorf("%d replies from a run, want 1 (%d conflicts, %d replays)", originals, conflicts, replays)
	}
	t.Logf("1 run, %d conflicts, %d replays", conflicts, replays)
}

func TestOvertakenHandlerRollsBack(t *testing.T) {
	// Not on SQLite: there a running handler holds the database's one
	// write lock, so nothing can take its claim over while it runs. A
	// crash releases the lock; TestServerKilledMidRequest covers that.
	t.Run("pgx", func(t *testing.T) { testOvertaken(t, newPgx(t)) })
	t.Run("sql", func(t *testing.T) { testOvertaken(t, newSQL(t)) })
}

// testOvertaken: a handler that outlives its claim (a hung replica) is
// overtaken by a retry on another replica. The run holding the claim is
// the one that may commit: the late handler finishes first, yet its fenced
// record write finds the claim gone, and its writes roll back.
func testOvertaken[TTx any](t *testing.T, e *env[TTx]) {
	slow, fast := newApp(e), newApp(e)
	replicaA := serve(t, slow, e.middleware(t, testConfig()).Handler(slow.routes()))
	replicaB := serve(t, fast, e.middleware(t, testConfig()).Handler(fast.routes()))

	lateDone := make(chan reply, 1)
	go func() { lateDone <- send(replicaA.URL, "POST", "/block", "x", "z1") }()
	recv(t, slow.started, "the slow handler to write its order")
	if r := send(replicaB.URL, "POST", "/block", "x", "z1"); r.status != 409 {
		t.Fatalf("while the claim holds: %s, want 409", r)
	}
	e.exec(t, e.sql.expireClaims) // the claim runs out on the database clock
	wonDone := make(chan reply, 1)
	go func() { wonDone <- send(replicaB.URL, "POST", "/block", "x", "z1") }()
	recv(t, fast.started, "the retry to take the claim over and run")

	slow.unblock()
	late := recv(t, lateDone, "the overtaken request")
	if late.status != 409 || late.problem.Code != postboxidem.CodeInProgress {
		t.Errorf("the overtaken request got %s, want 409: the retry holds the claim", late)
	}
	if n := e.count(t, "orders", ""); n != 0 {
		t.Errorf("%d orders committed by the overtaken run", n)
	}
	fast.unblock()
	won := recv(t, wonDone, "the retry")
	if won.status != 201 || won.replayed() {
		t.Fatalf("the retry holding the claim got %s, want its own run", won)
	}
	if r := send(replicaA.URL, "POST", "/block", "x", "z1"); !r.replayed() || r.body != won.body {
		t.Errorf("afterwards: %s, want the replay of %s", r, won)
	}
	if slow.runs.Load() != 1 || fast.runs.Load() != 1 {
		t.Errorf("runs %d + %d, want 1 + 1", slow.runs.Load(), fast.runs.Load())
	}
	if e.count(t, "orders", "") != 1 || e.outbox(t) != 1 {
		t.Errorf("orders %d, outbox %d; want 1 each", e.count(t, "orders", ""), e.outbox(t))
	}
}

// The killed server runs in a child process: this test binary, started
// with these variables, serves one route whose handler writes an order and
// an outbox message, says "running", and blocks until it is killed.
const (
	killHelperEnv = "POSTBOXIDEM_KILL_HELPER" // the backend: pgx, sql, mysql or sqlite
	killPrefixEnv = "POSTBOXIDEM_KILL_PREFIX"
	killPathEnv   = "POSTBOXIDEM_KILL_PATH" // the SQLite file
)

func TestServerKilledMidRequest(t *testing.T) {
	each(t, testKilled[pgx.Tx], testKilled[*sql.Tx])
}

// testKilled: a server killed mid-request leaves its claim processing and
// nothing of the request committed. Retries get 409 until the claim
// expires; then 50 of them race to take it over, and exactly one runs.
func testKilled[TTx any](t *testing.T, e *env[TTx]) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), killHelperEnv+"="+e.name, killPrefixEnv+"="+e.prefix, killPathEnv+"="+e.path)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
	}()
	kill := sync.OnceFunc(func() {
		_ = cmd.Process.Kill()
		<-readerDone
		_ = cmd.Wait()
	})
	t.Cleanup(kill)

	addr, ok := strings.CutPrefix(recv(t, lines, "the server's address"), "listening ")
	if !ok {
		t.Fatalf("helper: unexpected output; stderr: %s", stderr.String())
	}
	done := make(chan reply, 1)
	go func() { done <- send("http://"+addr, "POST", "/orders", `{"item":"book"}`, "crash-1") }()
	if l := recv(t, lines, "the handler to run"); l != "running" {
		t.Fatalf("helper said %q; stderr: %s", l, stderr.String())
	}
	if n := e.count(t, "idempotency", "state = 'processing'"); n != 1 {
		t.Fatalf("%d claims processing, want the running request's", n)
	}
	kill()
	if r := recv(t, done, "the killed request to fail"); r.err == nil {
		t.Fatalf("the killed server answered: %s", r)
	}

	a := newApp(e)
	srv := serve(t, a, e.middleware(t, testConfig()).Handler(a.routes()))
	r := send(srv.URL, "POST", "/orders", `{"item":"book"}`, "crash-1")
	if r.status != 409 || r.problem.Code != postboxidem.CodeInProgress || r.header.Get("Retry-After") == "" {
		t.Fatalf("retry while the dead server's claim holds: %s, want 409 with Retry-After", r)
	}
	if n := e.count(t, "orders", ""); n != 0 {
		t.Fatalf("%d orders: the dead server's transaction must not have committed", n)
	}

	e.exec(t, e.sql.expireClaims) // the claim runs out on the database clock
	checkOneRun(t, race(srv.URL, "/orders", "crash-1"))
	if a.runs.Load() != 1 || e.count(t, "orders", "") != 1 || e.outbox(t) != 1 {
		t.Errorf("runs %d, orders %d, outbox %d; want 1 each", a.runs.Load(), e.count(t, "orders", ""), e.outbox(t))
	}
	if r := send(srv.URL, "POST", "/orders", `{"item":"book"}`, "crash-1"); !r.replayed() {
		t.Errorf("after the takeover: %s, want a replay", r)
	}
}

// runKilledServer is the child process of testKilled.
func runKilledServer() int {
	prefix, path := os.Getenv(killPrefixEnv), os.Getenv(killPathEnv)
	var err error
	switch os.Getenv(killHelperEnv) {
	case "pgx":
		var pool *pgxpool.Pool
		if pool, err = pgxpool.New(context.Background(), testdb.PostgresURL()); err == nil {
			err = killedServer(postboxpgx.New(pool), prefix)
		}
	case "sql":
		var d *postboxsql.Driver
		if d, err = postboxsql.New(sqlOpen()); err == nil {
			err = killedServer(d, prefix)
		}
	case "mysql":
		var d *postboxmysql.Driver
		if d, err = postboxmysql.New(mysqlOpen()); err == nil {
			err = killedServer(d, prefix)
		}
	case "sqlite":
		var db *sql.DB
		if db, err = postboxsqlite.Open(path); err == nil {
			var d *postboxsqlite.Driver
			if d, err = postboxsqlite.New(db); err == nil {
				err = killedServer(d, prefix)
			}
		}
	default:
		err = fmt.Errorf("unknown backend %q", os.Getenv(killHelperEnv))
	}
	fmt.Fprintln(os.Stderr, "helper:", err)
	return 1
}

func sqlOpen() *sql.DB {
	db, err := sql.Open("pgx", testdb.PostgresURL())
	if err != nil {
		panic(err)
	}
	return db
}

func mysqlOpen() *sql.DB {
	db, err := postboxmysql.Open(mysqltest.DSN())
	if err != nil {
		panic(err)
	}
	return db
}

func killedServer[TTx any](d postboxdriver.Driver[TTx], prefix string) error {
	e, err := openEnv("helper", d, prefix)
	if err != nil {
		return err
	}
	mw, err := postboxidem.New(d, &postboxidem.Config{Prefix: prefix, ClaimExpiry: time.Hour})
	if err != nil {
		return err
	}
	a := newApp(e)
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := a.insert(r); err != nil {
			fmt.Println("insert failed:", err)
			return
		}
		fmt.Println("running")
		select {} // until the process is killed
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Println("listening", ln.Addr())
	srv := &http.Server{Handler: h, ReadHeaderTimeout: wait}
	return srv.Serve(ln)
}

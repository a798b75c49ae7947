package pglog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pgsql"
	"github.com/postbox-go/postbox/internal/pgxdriver"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxdriver"
)

// storageClients opens, over one migrated database, a table Store (with
// the storage setting) and Clients over the table and over the log.
func storageClients(t *testing.T) (pool *pgxpool.Pool, prefix string, setting pgsql.StorageSetting, table, log func() *postbox.Client[pgx.Tx]) {
	t.Helper()
	pool, prefix = testdb.Migrated(t)
	st, err := pgxdriver.New(pool, nil).Open(prefix)
	if err != nil {
		t.Fatal(err)
	}
	setting = st.(pgsql.StorageSetting)
	client := func(d postboxdriver.Driver[pgx.Tx]) func() *postbox.Client[pgx.Tx] {
		return func() *postbox.Client[pgx.Tx] {
			c, err := postbox.NewClient(d, &postbox.Config{
				Prefix: prefix, PollInterval: 20 * time.Millisecond,
				Publisher: postbox.PublisherFunc(func(context.Context, *postbox.Envelope) error { return nil }),
				Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
			})
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
	}
	return pool, prefix, setting, client(pgxdriver.New(pool, nil)), client(New[pgx.Tx](nil, pool, 0))
}

// The database says what its relays read (migration 13). A switch to the
// log is refused while a relay over the table runs; once it says log, a
// relay over the table is refused at its start, and a relay over the log
// runs under either setting. The way back is never refused, but a relay
// over the table waits for the log to drain.
func TestStorageSwitch(t *testing.T) {
	ctx := context.Background()
	pool, prefix, setting, tableClient, logClient := storageClients(t)

	st, err := setting.Storage(ctx)
	if err != nil || st.Storage != pgsql.StorageTable || len(st.Relays) != 0 {
		t.Fatalf("a new database: %+v, %v; want table and no relay", st, err)
	}

	tc := tableClient()
	if err := tc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitRelays(t, setting, 1)
	_, err = setting.SwitchStorage(ctx, pgsql.StorageLog)
	if !errors.Is(err, postboxdriver.ErrStorageRefused) || !strings.Contains(err.Error(), "read the table") {
		t.Fatalf("a switch to the log beside a relay over the table: %v, want ErrStorageRefused naming it", err)
	}
	if st, _ := setting.Storage(ctx); st.Storage != pgsql.StorageTable || len(st.Relays) != 1 || st.Relays[0].Storage != pgsql.StorageTable {
		t.Fatalf("after the refused switch: %+v", st)
	}
	if err := tc.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	if st, err = setting.SwitchStorage(ctx, pgsql.StorageLog); err != nil || st.Storage != pgsql.StorageLog {
		t.Fatalf("the switch to the log with no relay: %+v, %v", st, err)
	}
	if err := tableClient().Start(ctx); !errors.Is(err, postboxdriver.ErrStorageRefused) || !strings.Contains(err.Error(), "says its relays read the log") {
		t.Fatalf("a relay over the table on a database that says log: %v, want ErrStorageRefused", err)
	}
	lc := logClient()
	if err := lc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitRelays(t, setting, 1)
	if st, _ := setting.Storage(ctx); st.Relays[0].Storage != pgsql.StorageLog {
		t.Fatalf("the relay over the log registered %+v", st.Relays)
	}

	// The log's writer follows the setting: while it says log, a write
	// goes to the log (and waits there, no relay running).
	if err := lc.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	lw := logClient()
	if err := lw.Write(ctx, postbox.Message{Topic: "t", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	if got := rowsIn(t, pool, prefix); got != [2]int{1, 0} {
		t.Fatalf("a write while the database says log: %v rows in the log and the outbox, want 1 and 0", got)
	}

	// Back to the table: writers first, at once; the message the log
	// still holds keeps relays over the table from starting until the
	// relays over the log pass it.
	if st, err = setting.SwitchStorage(ctx, pgsql.StorageTable); err != nil || st.Storage != pgsql.StorageTable {
		t.Fatalf("the switch back: %+v, %v", st, err)
	}
	if err := lw.Write(ctx, postbox.Message{Topic: "t", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	if got := rowsIn(t, pool, prefix); got != [2]int{1, 1} {
		t.Fatalf("a write once the database says table: %v rows in the log and the outbox, want 1 and 1", got)
	}
	if err := tableClient().Start(ctx); !errors.Is(err, postboxdriver.ErrStorageRefused) || !strings.Contains(err.Error(), "log holds messages") {
		t.Fatalf("a relay over the table while the log holds a message: %v, want ErrStorageRefused", err)
	}
	lc = logClient()
	if err := lc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	tc = tableClient()
	for err = tc.Start(ctx); err != nil; err = tc.Start(ctx) {
		if !errors.Is(err, postboxdriver.ErrStorageRefused) || time.Now().After(deadline) {
			t.Fatalf("a relay over the table once the log is drained: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, c := range []*postbox.Client[pgx.Tx]{tc, lc} {
		if err := c.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// rowsIn counts the rows of the log and of the outbox.
func rowsIn(t *testing.T, pool *pgxpool.Pool, prefix string) (n [2]int) {
	t.Helper()
	if err := pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM `+prefix+`log), (SELECT count(*) FROM `+prefix+`outbox)`).Scan(&n[0], &n[1]); err != nil {
		t.Fatal(err)
	}
	return n
}

// A switch waits for the writes that read the setting before it, so that
// none of them adds to the log once the switch back to the table has
// committed; it gives up, switching nothing, when one outlasts the lock
// timeout.
func TestStorageSwitchWaitsForWriters(t *testing.T) {
	ctx := context.Background()
	pool, _, setting, _, logClient := storageClients(t)
	lw := logClient()
	if _, err := setting.SwitchStorage(ctx, pgsql.StorageLog); err != nil {
		t.Fatal(err)
	}
	write := func() pgx.Tx {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := lw.WriteTx(ctx, tx, postbox.Message{Topic: "t"}); err != nil {
			t.Fatal(err)
		}
		return tx
	}

	switchWaits(t, setting, write(), func() error { return write().Commit(ctx) })

	if _, err := setting.SwitchStorage(ctx, pgsql.StorageLog); err != nil {
		t.Fatal(err)
	}
	tx := write()
	defer func() { _ = tx.Rollback(ctx) }()
	_, err := setting.SwitchStorage(ctx, pgsql.StorageTable)
	if err == nil || !strings.Contains(err.Error(), "did not end within") {
		t.Fatalf("a switch behind a write open past the lock timeout: %v", err)
	}
	if st, err := setting.Storage(ctx); err != nil || st.Storage != pgsql.StorageLog {
		t.Fatalf("after the switch gave up: %+v, %v; want log still", st, err)
	}
}

// A writer in another language inserts into the outbox, leaving the
// partition out: the rules trigger checks the row, and while the database
// says log moves it into the log (migration 14), computing its partition
// as postbox's writer does; a row that breaks a rule is refused either
// way, writing nothing; a switch waits for the writer's transaction as
// for postbox's writer's; and a replay as new messages, whose copies the
// trigger moves, still counts them.
func TestStorageOtherWriters(t *testing.T) {
	ctx := context.Background()
	pool, prefix, setting, _, logClient := storageClients(t)
	insert := func(q interface {
		Query(context.Context, string, ...any) (pgx.Rows, error)
	}, key, headers string) (returned int, err error) {
		rows, err := q.Query(ctx, `INSERT INTO `+prefix+`outbox (id, topic, key, payload, headers)
  VALUES (gen_random_uuid(), 'orders.paid', $1, '\x7b7d', $2::jsonb) RETURNING id`, key, headers)
		if err != nil {
			return 0, err
		}
		defer rows.Close()
		for rows.Next() {
			returned++
		}
		return returned, rows.Err()
	}

	if n, err := insert(pool, "k1", `{}`); err != nil || n != 1 {
		t.Fatalf("a row while the database says table: %d returned, %v; want 1", n, err)
	}
	if got := rowsIn(t, pool, prefix); got != [2]int{0, 1} {
		t.Fatalf("while the database says table: %v rows in the log and the outbox, want 0 and 1", got)
	}
	if _, err := setting.SwitchStorage(ctx, pgsql.StorageLog); err != nil {
		t.Fatal(err)
	}
	if n, err := insert(pool, "k2", `{"ce-source":"billing"}`); err != nil || n != 0 {
		t.Fatalf("a row while the database says log: %d returned, %v; want none, the row moved", n, err)
	}
	if got := rowsIn(t, pool, prefix); got != [2]int{1, 1} {
		t.Fatalf("while the database says log: %v rows in the log and the outbox, want 1 and 1", got)
	}
	var part int
	var headers string
	if err := pool.QueryRow(ctx, `SELECT partition, headers::text FROM `+prefix+`log WHERE key = 'k2'`).Scan(&part, &headers); err != nil {
		t.Fatal(err)
	}
	// The log draws the moved row's seq itself, after the outbox's default
	// drew one and the log's xid default gave the transaction its id (the
	// log's first column): a row whose transaction got its id after a
	// reader's snapshot then has a seq above every seq that reader read
	// (design §3, "The position"). The outbox's insert is the
	// transaction's first write; no other session draws from the sequence.
	var drawn, seq int64
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT nextval('`+prefix+`outbox_seq_seq')`).Scan(&drawn); err != nil {
			return err
		}
		if _, err := insert(tx, "k5", `{}`); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT seq FROM `+prefix+`log WHERE key = 'k5'`).Scan(&seq)
	}); err != nil {
		t.Fatal(err)
	}
	if seq != drawn+2 {
		t.Fatalf("the moved row has seq %d after the sequence's %d; want %d, drawn by the log after the outbox's default drew %d", seq, drawn, drawn+2, drawn+1)
	}
	if want := postboxdriver.PartitionOf("k2", "", 64); part != want || headers != `{"ce-source": "billing"}` {
		t.Fatalf("the moved row: partition %d, headers %s; want %d and the writer's headers", part, headers, want)
	}
	_, err := insert(pool, "k3", `{"nats-x":"v"}`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.ConstraintName != prefix+"outbox_header_reserved_check" {
		t.Fatalf("a row breaking a rule while the database says log: %v, want the rule's check_violation", err)
	}
	if got := rowsIn(t, pool, prefix); got != [2]int{2, 1} {
		t.Fatalf("after the refused row: %v rows in the log and the outbox, want 2 and 1", got)
	}
	// An update of a message in the log is held to the rules, and keeps
	// it in its partition.
	moved := "k2-1"
	for i := 2; postboxdriver.PartitionOf(moved, "", 64) == part; i++ {
		moved = fmt.Sprint("k2-", i)
	}
	for _, u := range []struct{ set, constraint string }{
		{`headers = '{"nats-x":"v"}'`, "outbox_header_reserved_check"},
		{`key = '` + moved + `'`, "log_partition_check"},
	} {
		_, err := pool.Exec(ctx, `UPDATE `+prefix+`log SET `+u.set+` WHERE key = 'k2'`)
		if !errors.As(err, &pgErr) || pgErr.ConstraintName != prefix+u.constraint {
			t.Fatalf("an update of a message in the log setting %s: %v, want the check_violation of %s", u.set, err, u.constraint)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE `+prefix+`log SET headers = '{"ce-source":"billing","a":"b"}' WHERE key = 'k2'`); err != nil {
		t.Fatalf("an update of a message in the log within the rules: %v", err)
	}

	// The relay over the log publishes both; a replay of them as new
	// messages moves its copies into the log and counts them.
	lc := logClient()
	if err := lc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		s, err := lc.Admin().Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if s.Pending == 0 && s.Published == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status %+v, want the three rows published", s.Stats)
		}
	}
	if err := lc.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	n, err := lc.Admin().Replay(ctx, postbox.ReplayRequest{Since: time.Now().Add(-time.Hour), Until: time.Now().Add(time.Minute), AsNew: true, Actor: "test"})
	if err != nil || n != 3 {
		t.Fatalf("a replay as new messages: %d, %v; want 3", n, err)
	}
	if got := rowsIn(t, pool, prefix); got[0] != 5 {
		t.Fatalf("after the replay: %v rows in the log and the outbox, want the copies in the log", got)
	}

	// A switch waits for a writer's transaction that read the setting.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := insert(tx, "k4", `{}`); err != nil {
		t.Fatal(err)
	}
	switchWaits(t, setting, tx, func() error {
		_, err := insert(pool, "k5", `{}`)
		return err
	})
}

// switchWaits checks that a switch to the table waits for tx, a writer's
// transaction that read the setting, while other writes (write, one
// committed write) go on, then commits tx: the switch ends once it has
// committed. A switch that waited for the lock in one try made every
// write that began meanwhile wait behind it, until it gave up.
func switchWaits(t *testing.T, setting pgsql.StorageSetting, tx pgx.Tx, write func() error) {
	t.Helper()
	ctx := context.Background()
	defer func() { _ = tx.Rollback(ctx) }() // on a failure; a no-op once committed
	switched := make(chan error, 1)
	go func() {
		_, err := setting.SwitchStorage(ctx, pgsql.StorageTable)
		switched <- err
	}()
	select {
	case err := <-switched:
		t.Fatalf("the switch ended (%v) while a write that read the setting was open", err)
	case <-time.After(300 * time.Millisecond):
	}
	// A write behind a switch that waits in one try goes through only
	// when that try gives up (5 s): the switch then ends, or ends with an
	// error once tx has committed.
	wrote := make(chan error, 1)
	go func() { wrote <- write() }()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case err := <-switched:
		t.Fatalf("the switch ended (%v) while a write that read the setting was open", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-switched; err != nil {
		t.Fatal(err)
	}
}

// waitRelays waits until n relays are live.
func waitRelays(t *testing.T, setting pgsql.StorageSetting, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st, err := setting.Storage(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Relays) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d live relays, want %d", len(st.Relays), n)
		}
	}
}

// A relay over the table whose start raced a switch to the log is refused
// at its next heartbeat, and takes no lease with it; and no heartbeat
// registers a relay over the table between a switch's check and its
// commit: heartbeats of relays over the table (each registered for a
// minute, then leaving) race switches to the log and back, and after each
// switch that went through no relay over the table is live.
func TestStorageHeartbeatRefused(t *testing.T) {
	ctx := context.Background()
	pool, prefix, setting, _, _ := storageClients(t)
	st, err := pgxdriver.New(pool, nil).Open(prefix)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := setting.SwitchStorage(ctx, pgsql.StorageLog); err != nil {
		t.Fatal(err)
	}
	m, err := st.Coordinate(ctx, "late", time.Minute, []int{0, 1, 2}, nil, nil)
	if !errors.Is(err, postboxdriver.ErrStorageRefused) {
		t.Fatalf("a heartbeat over the table on a database that says log: %v", err)
	}
	for _, l := range m.Leases {
		if l.Owner == "late" {
			t.Fatalf("the refused heartbeat took partition %d", l.Partition)
		}
	}
	if _, err := st.Coordinate(ctx, "late", 0, nil, []int{0}, nil); err != nil {
		t.Fatalf("a refused relay's leave: %v", err)
	}
	if _, err := setting.SwitchStorage(ctx, pgsql.StorageTable); err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var stopOnce sync.Once
	halt := func() { stopOnce.Do(func() { close(stop) }); wg.Wait() }
	defer halt()
	beats := make([]int, 2)
	for w := range beats {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("t%d-%d", w, i)
				if _, err := st.Coordinate(ctx, id, time.Minute, nil, nil, nil); err == nil {
					beats[w]++
				} else if !errors.Is(err, postboxdriver.ErrStorageRefused) {
					t.Error(err)
					return
				}
				if _, err := st.Coordinate(ctx, id, 0, nil, nil, nil); err != nil {
					t.Error(err)
					return
				}
				time.Sleep(time.Millisecond)
			}
		}()
	}
	switched := 0
	for range 200 {
		after, err := setting.SwitchStorage(ctx, pgsql.StorageLog)
		if errors.Is(err, postboxdriver.ErrStorageRefused) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		switched++
		var live int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+prefix+`relays WHERE storage = 'table' AND expires_at > now()`).Scan(&live); err != nil {
			t.Fatal(err)
		}
		if live > 0 {
			t.Fatalf("%d relays over the table live after a switch to the log went through (%+v)", live, after)
		}
		if _, err := setting.SwitchStorage(ctx, pgsql.StorageTable); err != nil {
			t.Fatal(err)
		}
	}
	halt()
	if switched == 0 || beats[0] == 0 {
		t.Fatalf("%d switches went through, %v heartbeats registered: the race was not exercised", switched, beats)
	}
	t.Logf("%d of 200 switches went through; heartbeats registered by worker: %v", switched, beats)
}

// A relay of this version on tables migrated before migration 13 is told
// to migrate: the heartbeat's missing column and the start's missing table
// are ErrNotMigrated.
func TestStorageNotMigrated(t *testing.T) {
	ctx := context.Background()
	pool, prefix, _, tableClient, _ := storageClients(t)
	if _, err := pool.Exec(ctx, `ALTER TABLE `+prefix+`relays DROP COLUMN storage`); err != nil {
		t.Fatal(err)
	}
	st, err := pgxdriver.New(pool, nil).Open(prefix)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Coordinate(ctx, "old", time.Minute, nil, nil, nil); !errors.Is(err, postboxdriver.ErrNotMigrated) {
		t.Fatalf("a heartbeat without relays.storage: %v, want ErrNotMigrated", err)
	}
	if _, err := pool.Exec(ctx, `DROP TABLE `+prefix+`storage`); err != nil {
		t.Fatal(err)
	}
	if err := tableClient().Start(ctx); !errors.Is(err, postboxdriver.ErrNotMigrated) {
		t.Fatalf("a start without the storage table: %v, want ErrNotMigrated", err)
	}
}

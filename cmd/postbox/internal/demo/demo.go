// Package demo is `postbox demo`: an orders service on an SQLite file and an
// embedded NATS server with JetStream, with no setup at all. Orders and their
// events are written in transactions, some rolled back on purpose; the relay
// publishes; a consumer counts what arrives; mid-run the relay is stopped
// hard and started again. The run ends with a verification summary.
package demo

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"modernc.org/sqlite"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/natsembed"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxnats"
	"github.com/postbox-go/postbox/postboxsqlite"
)

// Options configure a demo run.
type Options struct {
	Orders       int           // orders to place; default 5000
	Writers      int           // concurrent writers; default 4
	RollbackRate float64       // share of transactions rolled back on purpose; default 0.1
	Dir          string        // where the SQLite file and JetStream data go; default a temporary directory, removed after
	Progress     time.Duration // progress line interval; default 500ms; negative disables
	Timeout      time.Duration // limit on the whole run; default 2m
}

// Summary is the verification at the end of a run.
type Summary struct {
	Committed          int64 `json:"committed"`
	RolledBack         int64 `json:"rolled_back_messages"`
	Published          int64 `json:"published"`
	Consumed           int64 `json:"consumed_unique"`
	Duplicates         int64 `json:"duplicates_absorbed"`
	PublishedRolledBak int64 `json:"published_but_rolled_back"`
	Lost               int64 `json:"lost"`
	OrderViolations    int64 `json:"per_key_order_violations"`
	RelayRestarts      int   `json:"relay_restarts"`
	Elapsed            time.Duration
}

// OK reports whether every guarantee held.
func (s Summary) OK() bool {
	return s.PublishedRolledBak == 0 && s.Lost == 0 && s.OrderViolations == 0 && s.Consumed == s.Committed && s.Committed > 0
}

func (o *Options) defaults() {
	if o.Orders <= 0 {
		o.Orders = 5000
	}
	if o.Writers <= 0 {
		o.Writers = 4
	}
	if o.RollbackRate == 0 {
		o.RollbackRate = 0.1
	}
	if o.Progress == 0 {
		o.Progress = 500 * time.Millisecond
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Minute
	}
}

// event is the payload of every message: which order, and its place in
// the order's history.
type event struct {
	Order string `json:"order"`
	Seq   int    `json:"seq"`
	Kind  string `json:"kind"`
}

var kinds = []string{"orders.created", "orders.paid", "orders.packed", "orders.shipped"}

// Run runs the demo, writing progress and the summary to out.
func Run(ctx context.Context, opts Options, out io.Writer) (Summary, error) {
	opts.defaults()
	// The progress goroutine and this one both write.
	out = &lockedWriter{w: out}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	began := time.Now()

	dir := opts.Dir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "postbox-demo-")
		if err != nil {
			return Summary{}, err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	fmt.Fprintf(out, "postbox demo: SQLite and JetStream data in %s\n", dir)

	srv, url, err := natsembed.Start(dir + "/jetstream")
	if err != nil {
		return Summary{}, fmt.Errorf("start embedded NATS: %w", err)
	}
	defer natsembed.Shutdown(srv)
	nc, err := nats.Connect(url)
	if err != nil {
		return Summary{}, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return Summary{}, err
	}
	if _, err := postboxnats.EnsureStream(ctx, js, jetstream.StreamConfig{
		Name: "DEMO_ORDERS", Subjects: []string{"demo.>"}, Duplicates: 10 * time.Minute,
	}); err != nil {
		return Summary{}, err
	}
	fmt.Fprintf(out, "postbox demo: embedded NATS with JetStream at %s, stream DEMO_ORDERS\n", url)

	db, err := postboxsqlite.Open(dir + "/orders.db")
	if err != nil {
		return Summary{}, err
	}
	defer db.Close()
	driver, err := postboxsqlite.New(db)
	if err != nil {
		return Summary{}, err
	}
	m, err := postboxmigrate.New(driver, nil)
	if err != nil {
		return Summary{}, err
	}
	if _, err := m.Up(ctx); err != nil {
		return Summary{}, err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (
  id TEXT PRIMARY KEY, customer TEXT NOT NULL, status TEXT NOT NULL, version INTEGER NOT NULL)`); err != nil {
		return Summary{}, err
	}

	pub, err := postboxnats.New(js, &postboxnats.Config{SubjectPrefix: "demo."})
	if err != nil {
		return Summary{}, err
	}
	defer func() { _ = pub.Close(context.WithoutCancel(ctx)) }()
	cfg := &postbox.Config{
		Publisher: pub, LeaseDuration: 3 * time.Second, PollInterval: 20 * time.Millisecond,
		Logger: quietLogger(),
	}
	client, err := postbox.NewClient(driver, cfg)
	if err != nil {
		return Summary{}, err
	}

	st := &state{committed: map[string]bool{}, rolledBack: map[string]bool{}}
	cons, err := consume(ctx, js, st)
	if err != nil {
		return Summary{}, err
	}
	defer cons.Stop()

	if err := client.Start(ctx); err != nil {
		return Summary{}, err
	}
	relayRunning := true
	defer func() {
		if relayRunning {
			_ = client.Stop(context.Background())
		}
	}()

	stopProgress := progress(out, opts.Progress, st, client)
	defer stopProgress()

	// The writers place orders; when a share of them is placed, the relay
	// is stopped hard (its in-flight publishes abandoned) and restarted.
	var placed atomic.Int64
	restartAt := int64(opts.Orders * 2 / 5)
	restarted := make(chan struct{})
	var restartOnce sync.Once
	writeErr := make(chan error, opts.Writers)
	var wg sync.WaitGroup
	for w := 0; w < opts.Writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				n := placed.Add(1)
				if n > int64(opts.Orders) {
					return
				}
				if err := placeOrder(ctx, db, client, st, fmt.Sprintf("order-%05d", n), opts.RollbackRate); err != nil {
					writeErr <- err
					return
				}
				if n == restartAt {
					restartOnce.Do(func() { close(restarted) })
				}
			}
		}()
	}
	var sum Summary
	select {
	case <-restarted:
		hard, cancelHard := context.WithCancel(ctx)
		cancelHard()
		_ = client.Stop(hard) // hard: abandon what is in flight
		fmt.Fprintln(out, "postbox demo: relay stopped hard mid-run; starting it again")
		if err := client.Start(ctx); err != nil {
			relayRunning = false
			return sum, err
		}
		sum.RelayRestarts++
	case <-ctx.Done():
	}
	wg.Wait()
	close(writeErr)
	for err := range writeErr {
		return sum, fmt.Errorf("writer: %w", err)
	}

	// Wait until everything committed has been consumed, or the run's time
	// is up; the summary tells which.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for ctx.Err() == nil && !st.consumedAll() {
		select {
		case <-tick.C:
		case <-ctx.Done():
		}
	}
	stats, _ := client.Stats(context.Background())
	if err := client.Stop(context.Background()); err != nil {
		return sum, err
	}
	relayRunning = false
	stopProgress()

	st.mu.Lock()
	defer st.mu.Unlock()
	sum.Committed = int64(len(st.committed))
	sum.RolledBack = int64(len(st.rolledBack))
	sum.Published = stats.Published
	sum.Consumed = int64(len(st.seen))
	sum.Duplicates = st.duplicates
	sum.PublishedRolledBak = st.publishedRolledBack
	sum.OrderViolations = st.orderViolations
	for id := range st.committed {
		if !st.seen[id] {
			sum.Lost++
		}
	}
	sum.Elapsed = time.Since(began)
	printSummary(out, sum)
	return sum, nil
}

type state struct {
	mu                  sync.Mutex
	committed           map[string]bool // message ids whose transaction committed
	rolledBack          map[string]bool // message ids whose transaction rolled back
	seen                map[string]bool
	nextSeq             map[string]int
	duplicates          int64
	publishedRolledBack int64
	orderViolations     int64
}

func (s *state) consumedAll() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range s.committed {
		if !s.seen[id] {
			return false
		}
	}
	return true
}

// placeOrder writes an order and its first events in one transaction, then
// more events in later transactions, each rolled back with the given
// chance. The order row's version numbers the events of its key, so a
// rolled-back event leaves no gap.
func placeOrder(ctx context.Context, db *sql.DB, client *postbox.Client[*sql.Tx], st *state, order string, rollbackRate float64) error {
	steps := 1 + rand.IntN(len(kinds)) //nolint:gosec // demo mix
	for step := 0; step < steps; step++ {
		// A transaction that cannot get SQLite's write lock within the busy
		// timeout (a loaded machine) is tried again, as a service would.
		for attempt := 1; ; attempt++ {
			err := writeEvent(ctx, db, client, st, order, rollbackRate)
			if err == nil {
				break
			}
			if !busy(err) || attempt == 5 || ctx.Err() != nil {
				return err
			}
			time.Sleep(time.Duration(attempt) * 50 * time.Millisecond)
		}
	}
	return nil
}

// busy reports SQLite's "database is locked".
func busy(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == 5 // SQLITE_BUSY
}

// writeEvent writes one event of order in a transaction of its own,
// rolled back on purpose with the given chance.
func writeEvent(ctx context.Context, db *sql.DB, client *postbox.Client[*sql.Tx], st *state, order string, rollbackRate float64) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	var version int
	err = tx.QueryRowContext(ctx, `SELECT version FROM orders WHERE id = ?`, order).Scan(&version)
	if errors.Is(err, sql.ErrNoRows) {
		_, err = tx.ExecContext(ctx, `INSERT INTO orders (id, customer, status, version) VALUES (?, ?, 'new', 0)`, order, fmt.Sprintf("customer-%d", rand.IntN(100))) //nolint:gosec // demo data
	}
	if err != nil {
		_ = tx.Rollback()
		return err
	}
	kind := kinds[min(version, len(kinds)-1)]
	payload, _ := json.Marshal(event{Order: order, Seq: version, Kind: kind})
	msg := postbox.Message{ID: postbox.NewID(), Topic: kind, Key: order, Payload: payload, Subject: order, ContentType: "application/json"}
	if _, err := tx.ExecContext(ctx, `UPDATE orders SET status = ?, version = version + 1 WHERE id = ?`, kind, order); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := client.WriteTx(ctx, tx, msg); err != nil {
		_ = tx.Rollback()
		return err
	}
	if rand.Float64() < rollbackRate { //nolint:gosec // demo mix
		if err := tx.Rollback(); err != nil {
			return err
		}
		st.mu.Lock()
		st.rolledBack[msg.ID] = true
		st.mu.Unlock()
		return nil
	}
	// Recorded before the commit returns, so a consumer that sees the
	// message first still finds it committed; a failed commit moves it
	// to the rolled-back set.
	st.mu.Lock()
	st.committed[msg.ID] = true
	st.mu.Unlock()
	if err := tx.Commit(); err != nil {
		st.mu.Lock()
		delete(st.committed, msg.ID)
		st.rolledBack[msg.ID] = true
		st.mu.Unlock()
		return err
	}
	return nil
}

// consume reads the stream from the start and checks each first delivery:
// it must be committed, and the next of its key.
func consume(ctx context.Context, js jetstream.JetStream, st *state) (jetstream.ConsumeContext, error) {
	st.seen = map[string]bool{}
	st.nextSeq = map[string]int{}
	c, err := js.OrderedConsumer(ctx, "DEMO_ORDERS", jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	return c.Consume(func(msg jetstream.Msg) {
		id := msg.Headers().Get("Nats-Msg-Id")
		var ev event
		_ = json.Unmarshal(msg.Data(), &ev)
		st.mu.Lock()
		defer st.mu.Unlock()
		if st.seen[id] {
			st.duplicates++
			return
		}
		st.seen[id] = true
		if st.rolledBack[id] || !st.committed[id] {
			st.publishedRolledBack++
		}
		if ev.Seq != st.nextSeq[ev.Order] {
			st.orderViolations++
		}
		st.nextSeq[ev.Order] = ev.Seq + 1
	})
}

func progress(out io.Writer, every time.Duration, st *state, client *postbox.Client[*sql.Tx]) func() {
	if every < 0 {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			stats, _ := client.Stats(context.Background())
			st.mu.Lock()
			fmt.Fprintf(out, "  committed %6d  rolled back %5d  pending %6d  published %6d  consumed %6d\n",
				len(st.committed), len(st.rolledBack), stats.Pending, stats.Published, len(st.seen))
			st.mu.Unlock()
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done); <-finished }) }
}

func printSummary(out io.Writer, s Summary) {
	check := func(ok bool) string {
		if ok {
			return "ok"
		}
		return "FAIL"
	}
	fmt.Fprintf(out, "\npostbox demo: verification (%s)\n", s.Elapsed.Round(time.Millisecond))
	fmt.Fprintf(out, "  committed messages           %6d\n", s.Committed)
	fmt.Fprintf(out, "  rolled back on purpose       %6d\n", s.RolledBack)
	fmt.Fprintf(out, "  published (relay)            %6d\n", s.Published)
	fmt.Fprintf(out, "  consumed, unique             %6d  %s\n", s.Consumed, check(s.Consumed == s.Committed))
	fmt.Fprintf(out, "  duplicates absorbed          %6d\n", s.Duplicates)
	fmt.Fprintf(out, "  published but rolled back    %6d  %s\n", s.PublishedRolledBak, check(s.PublishedRolledBak == 0))
	fmt.Fprintf(out, "  lost                         %6d  %s\n", s.Lost, check(s.Lost == 0))
	fmt.Fprintf(out, "  per-key order violations     %6d  %s\n", s.OrderViolations, check(s.OrderViolations == 0))
	fmt.Fprintf(out, "  relay restarts (hard stop)   %6d\n", s.RelayRestarts)
	if s.OK() {
		fmt.Fprintln(out, "postbox demo: all checks passed")
	} else {
		fmt.Fprintln(out, "postbox demo: CHECKS FAILED")
	}
}

// quietLogger keeps the relay's warnings (a hard stop abandons publishes,
// which it reports) and drops its routine information.
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

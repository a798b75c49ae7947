package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// NotifyOptions configure the LISTEN/NOTIFY study.
type NotifyOptions struct {
	DatabaseURL string
	Writers     int           // default 16
	Duration    time.Duration // of each phase; default 5s
	Runs        int           // default 5
	Warmup      time.Duration // uncounted, before the first run; default 1s, negative skips it
}

// Validate reports the first bad option, naming its command-line flag.
func (o *NotifyOptions) Validate() error {
	switch {
	case o.Writers < 0 || o.Writers > 64:
		return fmt.Errorf("--writers must be between 1 and 64, got %d", o.Writers)
	case o.Duration < 0 || (o.Duration > 0 && o.Duration < 100*time.Millisecond):
		return fmt.Errorf("--duration must be at least 100ms, got %s", o.Duration)
	case o.Runs < 0 || o.Runs > 1000:
		return fmt.Errorf("--runs must be between 1 and 1000, got %d", o.Runs)
	}
	return nil
}

func (o *NotifyOptions) defaults() {
	defaultURLs(&o.DatabaseURL, defaultDatabaseURL, nil)
	o.Writers = cmp.Or(o.Writers, 16)
	o.Duration = cmp.Or(o.Duration, 5*time.Second)
	o.Runs = cmp.Or(o.Runs, 5)
	o.Warmup = cmp.Or(o.Warmup, time.Second)
}

// NotifyMode is what each transaction of a phase does besides its insert.
type NotifyMode int

// The phases of the study.
const (
	// NotifyNone: the insert alone, then COMMIT.
	NotifyNone NotifyMode = iota
	// NotifyInStatement: pg_notify in the insert's own statement (a CTE),
	// so the transaction has the same round trips as NotifyNone.
	NotifyInStatement
	// NotifySeparate: the insert, then SELECT pg_notify(...) as a
	// statement of its own, then COMMIT: one more round trip.
	NotifySeparate
	// NotifyAfterCommit: the insert, then COMMIT and, in the same round
	// trip, pg_notify in a transaction of its own that does not wait for
	// its WAL flush (synchronous_commit off for it alone).
	NotifyAfterCommit
	// NotifyCoalesced: the insert and COMMIT as NotifyNone; then the
	// writer nudges one notifier connection, which sends pg_notify (its
	// commit not waiting for its flush) whenever a commit happened since
	// its last one, at least notifySpacing apart: one notification for
	// the commits made meanwhile. This is what a Client's change signals
	// do (postbox's signal.go).
	NotifyCoalesced
)

// NotifyModes lists the modes in the order they are reported.
var NotifyModes = []NotifyMode{NotifyNone, NotifyInStatement, NotifySeparate, NotifyAfterCommit, NotifyCoalesced}

func (m NotifyMode) String() string {
	switch m {
	case NotifyNone:
		return "no notify"
	case NotifyInStatement:
		return "notify in the insert"
	case NotifySeparate:
		return "notify, own statement"
	case NotifyAfterCommit:
		return "notify after commit"
	case NotifyCoalesced:
		return "coalesced notifier"
	}
	return fmt.Sprintf("NotifyMode(%d)", int(m))
}

// MarshalText names the mode in JSON.
func (m NotifyMode) MarshalText() ([]byte, error) {
	switch m {
	case NotifyNone:
		return []byte("none"), nil
	case NotifyInStatement:
		return []byte("in_statement"), nil
	case NotifySeparate:
		return []byte("separate_statement"), nil
	case NotifyAfterCommit:
		return []byte("after_commit"), nil
	case NotifyCoalesced:
		return []byte("coalesced"), nil
	}
	return nil, fmt.Errorf("unknown notify mode %d", int(m))
}

// NotifyRun is one run: the commit rate of each mode, and each mode's
// ratio to NotifyNone of the same run.
type NotifyRun struct {
	Rate  map[NotifyMode]float64
	Ratio map[NotifyMode]float64
}

// NotifyResult is the study's outcome.
type NotifyResult struct {
	Writers int
	Runs    []NotifyRun
	// Medians over the runs; the ratio's is the median of the runs' ratios.
	Rate  map[NotifyMode]float64
	Ratio map[NotifyMode]float64
	// The listener's count of notifications, which matches the commits
	// of the notifying phases, and the rows the table holds, which match
	// every commit.
	Notifications, Rows int64
}

// Notify measures the commit rate of Writers concurrent writers, one small
// insert per transaction, without and with a NOTIFY in each transaction,
// while a listener is connected and LISTENing on the channel all along.
// The modes rotate run by run so that none always goes first.
func Notify(ctx context.Context, opts NotifyOptions, out io.Writer) (NotifyResult, error) {
	var res NotifyResult
	if err := opts.Validate(); err != nil {
		return res, err
	}
	opts.defaults()
	res.Writers = opts.Writers
	pool, err := writersPool(ctx, opts.DatabaseURL, opts.Writers, nil)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	tag := randTag()
	prefix := "bench_" + tag + "_"
	defer dropPrefix(pool, prefix)
	table := prefix + "events"
	channel := prefix + "wake"
	if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		writer int NOT NULL,
		body text NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return res, err
	}

	lctx, stopListening := context.WithCancel(ctx)
	l, err := listen(lctx, opts.DatabaseURL, channel)
	if err != nil {
		stopListening()
		return res, err
	}
	defer func() {
		stopListening()
		<-l.done
	}()

	n := &notifyBench{pool: pool, table: table, channel: channel}
	var committed, notified int64
	if opts.Warmup > 0 {
		fmt.Fprintf(out, "warm-up: %s at %d writers, each mode\n", opts.Warmup, opts.Writers)
		for _, m := range NotifyModes {
			c, sent, _, err := n.phase(ctx, opts.Writers, m, opts.Warmup/time.Duration(len(NotifyModes)))
			if err != nil {
				return res, err
			}
			committed += c
			notified += sent
		}
	}
	for run := range opts.Runs {
		r := NotifyRun{Rate: map[NotifyMode]float64{}, Ratio: map[NotifyMode]float64{}}
		for k := range NotifyModes {
			m := NotifyModes[(k+run)%len(NotifyModes)]
			c, sent, rate, err := n.phase(ctx, opts.Writers, m, opts.Duration)
			if err != nil {
				return res, err
			}
			committed += c
			notified += sent
			r.Rate[m] = rate
			fmt.Fprintf(out, "run %d/%d  %2d writers  %-22s %8.0f commits/s\n", run+1, opts.Runs, opts.Writers, m, rate)
		}
		for _, m := range NotifyModes {
			r.Ratio[m] = r.Rate[m] / r.Rate[NotifyNone]
		}
		res.Runs = append(res.Runs, r)
	}
	res.Rate, res.Ratio = map[NotifyMode]float64{}, map[NotifyMode]float64{}
	for _, m := range NotifyModes {
		res.Rate[m] = medianOf(res.Runs, func(r NotifyRun) float64 { return r.Rate[m] })
		res.Ratio[m] = medianOf(res.Runs, func(r NotifyRun) float64 { return r.Ratio[m] })
	}

	// Every notifying commit reaches the listener: wait for the last ones.
	deadline := time.Now().Add(30 * time.Second)
	for l.count.Load() < notified && time.Now().Before(deadline) {
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return res, err
		}
	}
	res.Notifications = l.count.Load()
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&res.Rows); err != nil {
		return res, err
	}
	if res.Rows != committed {
		return res, fmt.Errorf("the table holds %d rows, %d commits were counted", res.Rows, committed)
	}
	if res.Notifications != notified {
		return res, fmt.Errorf("the listener received %d notifications, %d were sent", res.Notifications, notified)
	}
	return res, nil
}

type notifyBench struct {
	pool           *pgxpool.Pool
	table, channel string
}

// phase runs writers for d in mode and returns the commits, the
// notifications sent and the commit rate.
func (n *notifyBench) phase(ctx context.Context, writers int, mode NotifyMode, d time.Duration) (committed, sent int64, rate float64, err error) {
	var stop atomic.Bool
	var commits, notes atomic.Int64
	errs := make(chan error, writers+1)
	var wg sync.WaitGroup
	insert := "INSERT INTO " + n.table + " (writer, body) VALUES ($1, $2)"
	if mode == NotifyInStatement {
		insert = "WITH ins AS (" + insert + " RETURNING id) SELECT pg_notify('" + n.channel + "', '') FROM ins"
	}
	// A notification whose transaction does not wait for its WAL flush:
	// set_config(..., true) holds for this statement's own transaction.
	unflushed := "SELECT set_config('synchronous_commit', 'off', true), pg_notify('" + n.channel + "', '')"
	nudge := make(chan struct{}, 1)
	notifierDone := make(chan struct{})
	if mode == NotifyCoalesced {
		go func() {
			defer close(notifierDone)
			if err := n.notifier(ctx, nudge, unflushed, &notes); err != nil {
				errs <- err
				stop.Store(true)
			}
		}()
	} else {
		close(notifierDone)
	}
	body := "order placed"
	start := time.Now()
	for w := range writers {
		wg.Go(func() {
			for !stop.Load() {
				var err error
				if mode == NotifyAfterCommit {
					err = n.commitThenNotify(ctx, insert, unflushed, w, body)
				} else {
					err = pgx.BeginFunc(ctx, n.pool, func(tx pgx.Tx) error {
						if _, err := tx.Exec(ctx, insert, w, body); err != nil {
							return err
						}
						if mode == NotifySeparate {
							_, err := tx.Exec(ctx, "SELECT pg_notify('"+n.channel+"', '')")
							return err
						}
						return nil
					})
				}
				if err != nil {
					errs <- err
					stop.Store(true)
					return
				}
				commits.Add(1)
				switch mode {
				case NotifyInStatement, NotifySeparate, NotifyAfterCommit:
					notes.Add(1)
				case NotifyCoalesced:
					select {
					case nudge <- struct{}{}:
					default:
					}
				}
			}
		})
	}
	if err := sleepCtx(ctx, d); err != nil {
		stop.Store(true)
	}
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(start)
	close(nudge)
	<-notifierDone
	close(errs)
	if err := errors.Join(collect(errs)...); err != nil {
		return commits.Load(), notes.Load(), 0, err
	}
	if err := ctx.Err(); err != nil {
		return commits.Load(), notes.Load(), 0, err
	}
	c := commits.Load()
	return c, notes.Load(), float64(c) / elapsed.Seconds(), nil
}

// commitThenNotify is one NotifyAfterCommit transaction: BEGIN, the
// insert, then COMMIT and the unflushed notification in one round trip.
func (n *notifyBench) commitThenNotify(ctx context.Context, insert, unflushed string, w int, body string) error {
	c, err := n.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	if _, err := c.Exec(ctx, "BEGIN"); err != nil {
		return err
	}
	if _, err := c.Exec(ctx, insert, w, body); err != nil {
		_, _ = c.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		return err
	}
	var b pgx.Batch
	b.Queue("COMMIT")
	b.Queue(unflushed)
	return c.SendBatch(ctx, &b).Close()
}

// notifier sends one unflushed notification for each nudge, on a
// connection of its own, until nudge is closed; nudges that arrive while
// one is on its way coalesce into the next.
func (n *notifyBench) notifier(ctx context.Context, nudge <-chan struct{}, unflushed string, sent *atomic.Int64) error {
	c, err := n.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	for range nudge {
		began := time.Now()
		if _, err := c.Exec(ctx, unflushed); err != nil {
			return err
		}
		sent.Add(1)
		time.Sleep(notifySpacing - time.Since(began))
	}
	return nil
}

// notifySpacing is the least time between the starts of two notifications
// of the coalesced notifier, as between two change signals of a Client.
const notifySpacing = 5 * time.Millisecond

// listener holds a connection LISTENing on a channel and counts what
// arrives until its context ends.
type listener struct {
	count atomic.Int64
	done  chan struct{}
}

func listen(ctx context.Context, url, channel string) (*listener, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("listener: %w", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+channel); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("listener: %w", err)
	}
	l := &listener{done: make(chan struct{})}
	go func() {
		defer close(l.done)
		defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
		for {
			if _, err := conn.WaitForNotification(ctx); err != nil {
				return
			}
			l.count.Add(1)
		}
	}()
	return l, nil
}

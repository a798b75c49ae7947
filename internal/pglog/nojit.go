package pglog

import (
	"context"
	"errors"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// noJIT runs statements on a pool with PostgreSQL's JIT compilation off
// for each one, whatever the server's or the pool's settings. The log's
// statements read few rows of a large table, but the planner's estimates
// for them (an arm per partition, an unknown bound's default selectivity,
// a count of the whole history) cross jit_above_cost, and with the
// server's default jit = on every execution then compiles first: on a
// log of a million rows, hundreds of milliseconds for a statement that
// runs in a few (BENCHMARKS.md, "The log with a history").
//
// The setting is made by set_config(..., true) queued in the same batch:
// PostgreSQL runs the batch up to its Sync as one transaction, so the
// setting holds for the statement's planning and ends with it. The
// statement takes no more round trips than before, and no connection is
// left with a setting of this Store's. The setting's statement writes
// nothing, so the transaction gets no id from it: a read's id is still
// assigned after the read's snapshot was taken, as its position needs
// (lo_next, design §3 "The position").
//
// A read (Read) sends ReadSettings instead, which turns bitmap scans off
// too and keeps the read's generic plan, the same way.
type noJIT struct{ pool *pgxpool.Pool }

// JITOff is the statement sent before each of the log's statements but
// its reads, in the same batch.
const JITOff = "SELECT set_config('jit', 'off', true)"

// ReadSettings is sent before each of the log's reads instead (Read):
// JIT off, and bitmap scans off as well. A read takes each partition's
// rows in the order of the log's (partition, seq) index, up to the
// batch's limit, and an index scan in that order stops at the limit. The
// planner cannot know how many rows a partition holds past its position,
// and where it guesses fewer than the limit it chose to collect them all
// through a bitmap scan and sort them: the small statement's first read
// of a backlog (design §3, "The read") then fetched and sorted every
// pending row of each partition it read, seconds of PostgreSQL's time for
// a backlog of a few hundred thousand (BENCHMARKS.md, "A first read that
// sorted a partition's whole backlog (2026-12-06)"). No arm of a read has
// a use for a bitmap scan: each probes an index for an ordered range or
// for ids.
//
// And the read keeps its generic plan (plan_cache_mode =
// force_generic_plan): a read is planned once on its connection rather
// than at every execution. PostgreSQL's default plans a prepared statement
// afresh for each of its first five executions, then keeps planning it
// afresh for good wherever the generic plan's estimate comes out above
// the custom plans', as the read's arrays of unknown length make it; and
// planning a read, or a record with the next read (settleReadSQL), costs
// PostgreSQL more than running it. Among 16 relays on two cores
// (SCALING.md, "Over the log"), two records with a read in three and two
// reads in five were planned afresh: 640 s of PostgreSQL's time in two
// minutes against 220 s of execution. The relays read a third as often
// as they do with the plan kept, and a crashed relay's partitions were
// published again up to 0.6 s after they were taken. The read's
// statements are written for the generic plan (the xip list probed an id
// at a time, bitmap scans off, chunks pruned at the executor's start),
// which is the plan a relay at rest kept before.
const ReadSettings = "SELECT set_config('jit', 'off', true), set_config('enable_bitmapscan', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true)"

func (d noJIT) send(ctx context.Context, settings, sql string, args []any) pgx.BatchResults {
	b := &pgx.Batch{}
	b.Queue(settings)
	b.Queue(sql, args...)
	return d.pool.SendBatch(ctx, b)
}

// Query is pgxpool.Pool's Query with JIT off.
func (d noJIT) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return d.query(ctx, JITOff, sql, args)
}

// Read is Query for the log's reads, with ReadSettings.
func (d noJIT) Read(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return d.query(ctx, ReadSettings, sql, args)
}

func (d noJIT) query(ctx context.Context, settings, sql string, args []any) (pgx.Rows, error) {
	br := d.send(ctx, settings, sql, args)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		if rows != nil {
			rows.Close()
		}
		_ = br.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// QueryRow is pgxpool.Pool's QueryRow with JIT off.
func (d noJIT) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := d.Query(ctx, sql, args...)
	return batchRow{rows, err}
}

// Exec is pgxpool.Pool's Exec with JIT off.
func (d noJIT) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	br := d.send(ctx, JITOff, sql, args)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// warm sends the batch queue makes on up to conns connections of the
// pool at once, each held until every batch is done so that they are
// distinct ones: what a connection's first statements cost (its server
// process loading the catalog of the tables they touch, their prepare and
// plan) is paid here rather than by the first read that needs them. It
// takes at most half the pool's connections, so that the application's
// own statements on the pool are not held up meanwhile.
func (d noJIT) warm(ctx context.Context, conns int, queue func(*pgx.Batch)) error {
	conns = min(conns, max(int(d.pool.Config().MaxConns)/2, 1))
	errs := make([]error, conns)
	release := make(chan struct{})
	var sent, done sync.WaitGroup
	for i := range conns {
		sent.Add(1)
		done.Go(func() {
			c, err := d.pool.Acquire(ctx)
			if err != nil {
				errs[i] = err
				sent.Done()
				return
			}
			defer c.Release()
			b := &pgx.Batch{}
			queue(b)
			errs[i] = c.SendBatch(ctx, b).Close()
			sent.Done()
			<-release
		})
	}
	sent.Wait()
	close(release)
	done.Wait()
	return errors.Join(errs...)
}

// batchRows are a batch's last statement's rows: closing them, or reading
// past the last, closes the batch and returns its connection to the pool.
type batchRows struct {
	pgx.Rows
	br     pgx.BatchResults
	err    error
	closed bool
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	r.err = r.br.Close()
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

// batchRow is QueryRow's result, as pgx.Row: one row or pgx.ErrNoRows.
type batchRow struct {
	rows pgx.Rows
	err  error
}

func (r batchRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// Package pglog is the log read by snapshot bands on PostgreSQL (design
// §3, "The next storage model"): a Store over migration 12's tables that
// the relay drains, wrapping the outbox's Store (internal/pgxdriver). Users
// reach it through postboxpgx.WithLog, and `postbox relay` with storage:
// log; the fault harness writes and relays over it
// (POSTBOX_FAULTS_STORAGE=log), and the benchmark measures it (`postbox
// bench drain --storage log`), with the chunks of logchunks.go as an
// option only this package's New offers.
package pglog

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox/internal/pgsql"
	"github.com/postbox-go/postbox/internal/pgxdriver"
	"github.com/postbox-go/postbox/postboxdriver"
)

// The log read by snapshot bands (design §3, "The next storage model"),
// built on the relay's path so that `bench drain --storage log` measures
// the real relay, publisher and broker draining it: the Go writer inserts
// into {p}log, and the relay's Fetch and Settle read it by bands and
// advance a position per partition, kept in {p}positions. The outbox holds
// the exceptions: a log row that failed, was held behind an older failed
// row of its key, or was read and not sent moves there (deleted from the
// log) in the same statement that moves the position past it, and from
// then on is an outbox row like any other (retries, dead messages, the
// published table). What stays in the log is pending or published.
//
// The storage conformance suite holds it whole (TestLogStoreConformance),
// the operators' view of the history included: replay, the topic status
// and retention read the log beside the published table, and the log's
// publish times are the records noted in {p}log_passes. What the drivers
// still need before they adopt it is listed in BENCHMARKS.md ("The log
// drained by the relay").

// The log's tables are migration 12's (internal/pgsql/migrations): the
// log, the partitions' positions, the marks of rows recorded one by one
// ({p}log_done) and the history of publishing ({p}log_passes).
//
// {p}log_done holds the log rows recorded one by one, by a Settle that
// names rows of no read of this process's (a record of another process's
// read, or of part of one): reads return them marked, hand them to no
// one, and move the position past them; the record that moves a position
// past one deletes its mark. The read tests a row's mark only when the
// table holds one, which it tests once a statement.
//
// {p}log_passes is the log's history of publishing, a row a record: what
// it published, by topic (how many, and the oldest's creation time), and
// the positions it moved of the partitions it passed rows of (parts, lo,
// lo_seq, hi and cursors, by partition), each partition at most once
// every noteEvery; a read that finds nothing writes a row of positions
// only, for the notes owed. A log row was published by a time T when the
// position its partition had at T passed it: the partition's entry in
// the last row at or before T that names it. The topic status reads the
// last minute's counts; retention and a replay's preview read the
// positions.
//
// The positions have a table of their own rather than columns of the
// leases: a batch's record then reads the lease to fence itself and locks
// nothing the relays' renewals write. Kept in the lease rows, the record
// and the renewals locked the same rows in different orders and
// deadlocked, and each record lost so re-sent its batch.
//
// Split into chunks by seq range (logchunks.go), the log is first made a
// partitioned table by ChunkLog.

// position is a partition's place in the log: every committed row
// visible in lo is done; a row not visible in lo was written by a
// transaction that had its id when lo was taken (in its xip list, or at
// least its xmax and below loNext), or that got it later and so drew a
// seq above loSeq. An open band (hi set) is being read in seq order: its
// rows visible in hi up to seq cursor are done, bandMax the largest seq
// of the partition read in it.
type position struct {
	gen             int64
	lo, loNext      string
	loSeq           int64
	hi, hiNext      *string
	cursor, bandMax int64
}

func (p position) same(q position) bool {
	eq := func(a, b *string) bool { return a == nil && b == nil || a != nil && b != nil && *a == *b }
	return p.gen == q.gen && p.lo == q.lo && p.loNext == q.loNext && p.loSeq == q.loSeq &&
		eq(p.hi, q.hi) && eq(p.hiNext, q.hiNext) && p.cursor == q.cursor && p.bandMax == q.bandMax
}

// next is where a partition stands once a read from p is settled: the read
// returned full (its limit of rows) or not, under snapshot snap by a
// statement whose own id is xid, its last row's seq being last and the
// largest log seq it read of the partition maxSeq (design §3, "The
// advance").
func (p position) next(full bool, snap, xid string, last, maxSeq int64) position {
	n := p
	if full {
		// A backlog: the band up to the first full read's snapshot is
		// read on in seq order. The merge is in global seq order, so every
		// band row of the partition up to last was read.
		if n.hi == nil {
			n.hi, n.hiNext, n.bandMax = &snap, &xid, 0
		}
		n.bandMax = max(n.bandMax, maxSeq)
		// The outbox's exceptions are merged in too, and may all lie
		// below the cursor: it never moves back.
		n.cursor = max(n.cursor, last)
		return n
	}
	// The band is read whole: every row its snapshot saw is done, and a
	// transaction not visible in it either had its id when the snapshot
	// was taken (below the statement's own id: the next xip arm) or got it
	// later and drew seqs above every seq read.
	if n.hi != nil {
		n.lo, n.loNext = *n.hi, *n.hiNext
	} else {
		n.lo, n.loNext = snap, xid
	}
	n.loSeq = max(n.loSeq, n.bandMax, maxSeq)
	n.hi, n.hiNext, n.cursor, n.bandMax = nil, nil, 0, 0
	return n
}

// readShape names a read statement: its number of partitions, whether
// it is strict (BlockOnDead), and whether routed (Topics).
type readShape struct {
	parts          int
	strict, routed bool
	// small reads the partitions with one range arm instead of one a
	// partition (readParts): the shape of a read that follows a short one.
	small bool
}

// logRow is a row a band read returned: a log row, or an exception.
type logRow struct {
	rec    postboxdriver.Record
	logged bool // from the log; else an outbox row
	held   bool // a log row behind an older failed row of its key
	// marked is a log row recorded one by one ({p}log_done): done, so
	// neither handed to the relay nor moved out, but read, so that the
	// position passes it.
	marked bool
}

// bandRead is a read waiting for its Settle: the positions it read from
// and those it leads to, by partition, its log rows handed to the relay
// by seq, and the partitions it read log rows of (marked or held ones
// too), whose passing its record notes.
type bandRead struct {
	base, next map[int]position
	logged     map[int64]loggedRow
	touched    []int
	// whole are the partitions the read took whole (ReadWhole): short of
	// its limit, in a band its own snapshot opened.
	whole []int
}

// loggedRow is a log row a read handed to the relay.
type loggedRow struct {
	part    int
	topic   string
	created time.Time
}

// readKey names a read by what it handed the relay, as the relay's
// Outcome.Read names it back: its first and last seqs and its length.
// The relay's probe (one row, while a lane sleeps) and a lane's batch
// that begins at the same row are then told apart.
type readKey struct {
	first, last int64
	n           int
}

func keyOf(seqs []int64) readKey {
	if len(seqs) == 0 {
		return readKey{}
	}
	return readKey{seqs[0], seqs[len(seqs)-1], len(seqs)}
}

// Driver opens Stores over the log on a pgx pool (postboxdriver.Driver),
// for callers' transactions of type T: pgx.Tx (postboxpgx) or *sql.Tx
// (postboxsql).
type Driver[T any] struct {
	pool *pgxpool.Pool
	// outbox opens the Store over the outbox that the log's wraps: the
	// outbox's own statements, and the caller's transactions as that
	// Store binds statements to them. Nil opens pgxdriver's, which runs a
	// transaction's statements in it at once (T pgx.Tx only).
	outbox postboxdriver.Driver[T]
	// chunks splits the log (ChunkLog); zero leaves it whole.
	chunks chunking
	// store is the Store opened last, whose published count the drain
	// waits on.
	store atomic.Pointer[logStore[T]]
}

// New returns a Driver over the log on pool, whose Stores wrap those
// outbox opens (postboxpgx's on the same pool, or postboxsql's on the
// same database). With chunk above zero
// the log, made a partitioned table by ChunkLog, is split into chunks of
// that many seqs, chunksAhead of them kept attached beyond the sequence,
// which retention drops whole; at zero the log is whole.
func New[T any](outbox postboxdriver.Driver[T], pool *pgxpool.Pool, chunk int64) *Driver[T] {
	d := &Driver[T]{pool: pool, outbox: outbox}
	if chunk > 0 {
		d.chunks = chunking{width: chunk, ahead: chunksAhead}
	}
	return d
}

// Published is how many messages the Store opened last has recorded as
// published: what a benchmark's drain waits for.
func (d *Driver[T]) Published() int64 {
	if s := d.store.Load(); s != nil {
		return s.published.Load()
	}
	return 0
}

// AttachChunks attaches, through the Store opened last, the chunks that
// retention keeps ahead of the sequence: before a backlog is written, so
// that its rows go into chunks.
func (d *Driver[T]) AttachChunks(ctx context.Context) error {
	s := d.store.Load()
	if s == nil {
		return errors.New("pglog: no Store is open")
	}
	return s.attachChunks(ctx)
}

// UseLog switches the database at prefix to the log, as `postbox storage
// log` does (pgsql.Core's SwitchStorage): the Store's writes go to the log
// only then. The benchmark and the fault harness call it on their own
// tables before they write.
func UseLog(ctx context.Context, pool *pgxpool.Pool, prefix string) error {
	st, err := pgxdriver.New(pool, nil).Open(prefix)
	if err != nil {
		return err
	}
	set, ok := st.(pgsql.StorageSetting)
	if !ok {
		return errors.New("pglog: the outbox's Store has no storage setting")
	}
	_, err = set.SwitchStorage(ctx, pgsql.StorageLog)
	return err
}

// Open implements postboxdriver.Driver.
func (d *Driver[T]) Open(prefix string) (postboxdriver.Store[T], error) {
	outbox := d.outbox
	if outbox == nil {
		o, ok := any(pgxdriver.New(d.pool, nil)).(postboxdriver.Driver[T])
		if !ok {
			return nil, errors.New("pglog: a Driver for transactions other than pgx.Tx needs the outbox's Driver")
		}
		outbox = o
	}
	inner, err := outbox.Open(prefix)
	if err != nil {
		return nil, err
	}
	core := pgsql.ReadsLog(inner)
	if core == nil {
		return nil, fmt.Errorf("pglog: the outbox's Store, a %T, embeds no pgsql.Core", inner)
	}
	// Over postboxpgx the outbox's Store is on pool itself: it serves as
	// onPool, and its connections are checked once.
	onPool, _ := any(inner).(postboxdriver.Store[pgx.Tx])
	p, ok := inner.(interface{ Pool() *pgxpool.Pool })
	samePool := onPool != nil && ok && p.Pool() == d.pool
	if !samePool {
		if onPool, err = pgxdriver.New(d.pool, nil).Open(prefix); err != nil {
			return nil, err
		}
	}
	r := strings.NewReplacer("{p}", prefix)
	st := &logStore[T]{
		Store: inner, core: core, onPool: onPool, samePool: samePool, poolCore: pgsql.CoreOf(onPool), pool: d.pool, db: noJIT{d.pool}, r: r, prefix: prefix, chunks: d.chunks,
		reads:       map[readShape]string{},
		settleReads: map[readShape]string{},
		shortReads:  map[int]bool{},
		pos:         map[int]position{},
		pending:     map[readKey]*bandRead{},
		settling:    map[int]bool{},
		stored:      map[int]time.Time{},
		noted:       map[int]time.Time{},
		owed:        map[int]bool{},
		insert:      r.Replace(insertSQL),
		insertOne:   r.Replace(insertOneSQL),
		load: r.Replace(`SELECT partition, lo::text, lo_next::text, lo_seq, hi::text, hi_next::text, band_cursor, band_max
FROM {p}positions WHERE partition = ANY($1::int[])`),
		settle:     r.Replace(settleLogSQL),
		stats:      r.Replace(logStatsSQL),
		rowsSettle: r.Replace(settleRowsSQL),
		requeue:    pgsql.RequeueDeadSQL(prefix, r.Replace(logRequeuePending)),
		topicStats: pgsql.TopicStatsSQL(prefix, r.Replace(logPendingSQL),
			r.Replace(`SELECT t.topic, t.n::bigint, p.at - t.oldest FROM {p}log_passes p
    CROSS JOIN LATERAL unnest(p.topics, p.counts, p.oldest) AS t(topic, n, oldest)
  WHERE p.at > now() - interval '1 minute'`)),
		replay:       pgsql.ReplaySQL(prefix, logHistory, logPendingIDs, logReplayMove),
		replayCounts: r.Replace(logReplayCountsSQL),
		prune:        r.Replace(logPruneSQL),
		droppable:    r.Replace(logDroppableSQL),
		chunkSpan:    r.Replace(chunkSpanSQL),
		note:         r.Replace(noteSQL),
	}
	d.store.Store(st)
	return st, nil
}

// logStore is the outbox's Store (postboxpgx's or postboxsql's) with the
// relay's path on the log: Insert writes the log (the outbox while the
// database says table), Fetch reads it by bands beside the outbox's
// exceptions, and Settle advances the positions (or records rows one by
// one); Stats, ResolveCrashes and RequeueDeadMessages take the log into
// account, SettleFetch records a small batch in the statement of the next
// read, and ReadWhole says which partitions a read took whole. It embeds
// the Store interface, not its type, so that the relay sees only what
// this type builds over the log, and the change signals (Signal, Listen),
// which it passes on (Listen on pool where the outbox's Store cannot
// listen).
type logStore[T any] struct {
	postboxdriver.Store[T]
	// core is the Core that Store embeds (pgsql.ReadsLog): its inserts
	// note their partitions for the change signals.
	core *pgsql.Core
	// onPool is the outbox's Store on pool, and poolCore its Core: the
	// connections CheckConnections checks beside the outbox Store's, and
	// where Listen waits when the outbox's Store cannot. samePool says
	// that onPool is the outbox's Store itself (postboxpgx's).
	onPool   postboxdriver.Store[pgx.Tx]
	samePool bool
	poolCore *pgsql.Core
	pool     *pgxpool.Pool
	db       noJIT // every statement but the writer's insert
	r        *strings.Replacer
	prefix   string

	insert, insertOne, load, settle, rowsSettle, stats string
	requeue                                            string
	topicStats, replayCounts, prune, note              string
	droppable, chunkSpan                               string
	chunks                                             chunking
	replay                                             pgsql.ReplayStatements

	mu sync.Mutex
	// reads are the read statements by their shape, and settleReads the
	// record-and-read statements.
	reads, settleReads map[readShape]string
	// shortReads says, by a read's first partition, whether the last read
	// of those partitions returned fewer rows than its limit: the next
	// then takes the small statement (short). A read that failed counts
	// as short, and so do partitions not read yet.
	shortReads map[int]bool
	// pos are the positions this process holds, by partition, for the
	// generation each was loaded or advanced under.
	pos map[int]position
	// pending are the reads not settled yet, by the rows they handed the
	// relay. A read never settled (the relay's probe, a batch abandoned
	// at a stop) only loses its place: its rows are read again.
	pending map[readKey]*bandRead
	// settling are the partitions whose position a settle is moving: a
	// second settle from the same position leaves them alone.
	settling map[int]bool
	// stored is when each partition's position in pos was last the one
	// in {p}positions: loaded or written. A record writes only the
	// positions of the partitions it passed rows of, and the others once
	// they have been held here for storeEvery.
	stored map[int]time.Time
	// noted is when this process last noted each partition's position in
	// {p}log_passes, and owed are the partitions it passed rows of since
	// without noting them (noteEvery).
	noted map[int]time.Time
	owed  map[int]bool

	// published counts the messages Settle recorded as published, and
	// rode the records that went in the statement of the next read
	// (SettleFetch).
	published, rode atomic.Int64
	// top is the largest value of the sequence a read has seen, which
	// the next read's upper bound starts from (readOnce).
	top atomic.Int64
	// midPass is set while a retention pass goes on (PrunePublished's
	// last call deleted its limit), and chunksKept is when the chunks
	// were last kept (UnixNano).
	midPass    atomic.Bool
	chunksKept atomic.Int64
}

// noteEvery spaces the notes of a partition's position in {p}log_passes:
// a record notes the positions of the partitions it passed rows of only
// where this process has not noted them for that long, and owes the
// others a note, which a later record of theirs, or the first read that
// finds nothing, pays. Noted with every record, the positions of a
// relay's 64 partitions cost PostgreSQL about 0.8 µs a drained message. A
// log row's publish time is then known to within noteEvery, always late:
// retention keeps it that much longer, and a replay's preview counts it
// as recent that much longer.
const noteEvery = time.Second

// storeEvery bounds how long a record leaves a partition's position in
// {p}positions behind the one this process holds. A read moves the
// positions of all the partitions it reads to its own snapshot, and a
// record wrote every one of them: at a trickle, where one lane reads a
// relay's whole share and a batch holds a row or two, 64 rows updated for
// those two, most of what the record cost PostgreSQL. A partition the read
// found no row of is passed no row by the move, so the position stored
// before it passes the same rows: it stays valid, and a relay taking the
// partition over reads from it what this one would (design §3, "The
// advance"). Written at least this often, it keeps the reads of a relay
// that takes it over short, and its xip arm's probes few.
const storeEvery = time.Second

// maxPending bounds the reads kept for a Settle: beyond it those read
// from positions that have moved on since go (the relay's probes, which
// are never settled), and if that is not enough, all of them: their rows
// are read again.
const maxPending = 1024

// dropStale forgets the pending reads that can no longer be settled. The
// caller holds s.mu.
func (s *logStore[T]) dropStale() {
	for k, br := range s.pending {
		for part, base := range br.base {
			if cur, ok := s.pos[part]; !ok || !cur.same(base) {
				delete(s.pending, k)
				break
			}
		}
	}
	if len(s.pending) >= maxPending {
		clear(s.pending)
	}
}

func (s *logStore[T]) UnwrapExecutor(tx T) postboxdriver.Executor {
	ex := s.Store.UnwrapExecutor(tx)
	core, _ := ex.(*pgsql.Core)
	return logTx[T]{Executor: ex, s: s, core: core}
}

// logTx is the Executor in a caller's transaction, whose Insert writes
// the log. core is the Executor the outbox's Store unwraps (postboxpgx's
// or postboxsql's), a Core bound to the transaction (in a postboxpgx.Tx,
// deferring its insert to the COMMIT).
type logTx[T any] struct {
	postboxdriver.Executor
	s    *logStore[T]
	core *pgsql.Core
}

// Insert writes the log, or the outbox while the database says table
// (insertSQL), as postboxpgx writes the outbox: in a postboxpgx.Tx, with
// the COMMIT; its partitions noted for the next change signal.
func (t logTx[T]) Insert(ctx context.Context, rows []postboxdriver.Row) error {
	if t.core == nil {
		return fmt.Errorf("pglog: the outbox's Executor is a %T, not a pgsql.Core", t.Executor)
	}
	return t.s.wrap(t.core.InsertRows(ctx, t.s.insert, t.s.insertOne, rows))
}

// AfterCommit implements postboxdriver.AfterCommitter as postboxpgx's
// Executor does: a postboxpgx.Tx wakes the relay once it has committed.
func (t logTx[T]) AfterCommit(fn func()) bool {
	ac, ok := t.Executor.(postboxdriver.AfterCommitter)
	return ok && ac.AfterCommit(fn)
}

// insertSQL writes the rows ($1–$6, the outbox insert's arrays) where the
// database says (migration 13, design §3 "Switching a database to the
// log"): into the log while it says log, into the outbox otherwise, so
// that a relay over the table, which never reads the log, is never left
// a row it cannot see. Both inserts read the setting under the
// statement's one snapshot, so exactly one of them writes. The statement
// reads it in the writer's transaction, which then holds the storage
// table's lock to its end: a switch, which locks the table against every
// reader, waits for every write that read the setting before it, so that
// once a switch back to the table has committed no write can still add
// to the log. Each insert reads unnest itself: a CTE both read would be
// materialized, which cost a one-row write more (BENCHMARKS.md, "The log's
// writer follows the database's setting"). insertOneSQL is the same
// insert over one row's six values, the usual write, for which binding
// arrays and unnest's function scan cost more than the values (BENCHMARKS.md,
// "The log's writer binds one row's values").
var (
	insertSQL    = insertWhereSaid(`SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bytea[], $5::jsonb[], $6::int[])`)
	insertOneSQL = insertWhereSaid(`SELECT $1::uuid, $2::text, $3::text, $4::bytea, $5::jsonb, $6::int`)
)

// insertWhereSaid is the insert of rows, a SELECT of the six columns,
// into the table the database's setting names.
func insertWhereSaid(rows string) string {
	return `WITH lg AS (
  INSERT INTO {p}log (id, topic, key, payload, headers, partition) ` + rows + `
  WHERE (SELECT storage FROM {p}storage) = 'log'
)
INSERT INTO {p}outbox (id, topic, key, payload, headers, partition) ` + rows + `
WHERE (SELECT storage FROM {p}storage) IS DISTINCT FROM 'log'`
}

// Insert implements postboxdriver.Executor: the rows go to the log, or the
// outbox while the database says table (insertSQL), their partitions
// noted for the next change signal (Signal).
func (s *logStore[T]) Insert(ctx context.Context, rows []postboxdriver.Row) error {
	return s.wrap(s.core.InsertRows(ctx, s.insert, s.insertOne, rows))
}

// Signal implements postboxdriver.Signaler as postboxpgx's Store does:
// the log's writes (InsertRows marks their partitions) wake the relays of
// other processes as the outbox's do, on the same channel.
func (s *logStore[T]) Signal(ctx context.Context, committed bool) error {
	return s.core.Signal(ctx, committed)
}

// Listen implements postboxdriver.Listener as postboxpgx's Store does: a
// relay over the log is woken by the writes of other processes. It
// listens as the outbox's Store does where that Store can (postboxpgx's),
// and otherwise on a connection of pool (under postboxsql, whose
// database/sql connections cannot wait for a notification).
func (s *logStore[T]) Listen(ctx context.Context, ready func(), heard func(postboxdriver.Heard)) error {
	l, ok := s.Store.(postboxdriver.Listener)
	if !ok {
		l = s.onPool.(postboxdriver.Listener)
	}
	return l.Listen(ctx, ready, heard)
}

// wrap is err, as postboxdriver.ErrNotMigrated when the log's tables do
// not exist.
func (s *logStore[T]) wrap(err error) error { return pgsql.NotMigrated(s.prefix, err) }

// CheckConnections implements postboxdriver.Executor: the outbox Store's
// connections, then those of pool, on which the log's statements run (a
// transaction pooler and named statements, as postboxpgx checks its own),
// and that both reach one database. Over postboxpgx they are one pool,
// checked once; over postboxsql they are the caller's *sql.DB and pgx
// pool (postboxsql.WithLog), and a pool on another database would leave
// every message its writers log unread: the relay refuses to start with
// postboxdriver.ErrOtherDatabase, naming both.
func (s *logStore[T]) CheckConnections(ctx context.Context) error {
	if err := s.Store.CheckConnections(ctx); err != nil || s.samePool {
		return err
	}
	if err := s.poolCore.CheckConnections(ctx); err != nil {
		return fmt.Errorf("the log's pool: %w", err)
	}
	outbox, err := s.core.Database(ctx)
	if err != nil {
		return err
	}
	log, err := s.poolCore.Database(ctx)
	if err != nil {
		return err
	}
	if outbox != log {
		return fmt.Errorf("%w: the outbox's statements reach database %s, the log's pool %s", postboxdriver.ErrOtherDatabase, outbox, log)
	}
	return nil
}

// ConnLost implements postboxdriver.ConnChecker as postboxpgx's Store
// does.
func (s *logStore[T]) ConnLost(ctx context.Context, tx T) bool {
	c, ok := s.Store.(postboxdriver.ConnChecker[T])
	return ok && c.ConnLost(ctx, tx)
}

// readSQL is the band read of k partitions ($1 the partitions, $2 the
// limit, then by partition: $3 lo, $4 lo_next, $5 lo_seq, $6 hi, $7 the
// band's cursor).
//
//   - The range arms: one index range on (partition, seq) per partition,
//     each limited, merged in seq order (a Merge Append that stops after
//     the batch). With k = 0, one arm instead, a lateral join over the
//     partitions, each limited, then sorted: the small statement, whose
//     plan costs less to set up, for a read after a short one (short).
//   - The xip arm: the rows of the transactions that had their id when lo
//     was taken, at or below lo_seq: those in lo's xip list, and those at
//     or above its xmax and below lo_next. It probes the xid index alone
//     (OFFSET 0), once for each distinct (lo, lo_next) among the
//     partitions, and joins what it finds to the partitions by partition
//     and snapshot. The partitions a read moves share its snapshot, so a
//     lane's usually share one: at a trickle, where every read's snapshot
//     holds the writers' transactions in flight, a probe a partition
//     looked each id up once for each of the lane's partitions, and read
//     each row found that often, to keep one partition's. Kept apart from
//     seq and partition, the probe cannot become an AND with the primary
//     key's range, whose entries (a partition's whole history) PostgreSQL
//     then read: a read of 500 rows over a log of 1,000,000 took 128 ms
//     so, 7 ms by the xid index. In a log split into chunks (chunked) the
//     probe reads only the chunks at or above its snapshot's chunkBound:
//     the xid index has no bound by seq, so without it the probe read
//     every chunk's index; with it PostgreSQL skips the others at run
//     time. The xip list is probed an id at a time, each a subquery of its
//     own, so that the plan's choice for it weighs one index probe
//     against a whole scan of the log for each id: as one probe of the
//     list, the generic plan PostgreSQL keeps for the statement, made
//     while the log was still small (a new log, its size not yet
//     analyzed), scanned the whole log, 0.43 ms at 8,000 rows and more as
//     the log grew, until the next ANALYZE of the log replanned it.
//   - The exceptions: the outbox's rows available now, held behind an
//     older failed row of their key as the relay's fetch holds them.
//
// A log row behind an older failed row of its key, or in a strict read
// (BlockOnDead) behind an older dead message of its key, is returned as
// held: not published, but moved to the outbox when the position passes
// it, where the relay's strict reads keep it pending as they keep the
// outbox's rows. A routed read ($8 the topics' LIKE patterns) holds too
// the log rows of the topics it does not route, and those behind an older
// row of their key that it does not route, in the outbox or in the read:
// moved, they wait there for a relay that routes them, and their keys
// with them, as the outbox's fetch keeps them.
//
// The statement returns its own snapshot and its own transaction id,
// assigned after the snapshot was taken, which bounds every id assigned
// before it. Having an id, it commits without waiting for a flush.
func readSQL(k int, strict, routed, chunked bool) string {
	ctes, sel, order := readParts(k, strict, routed, chunked, "")
	return "WITH " + ctes + "\n" + sel + "\nORDER BY " + order
}

// readParts is readSQL in parts: its common table expressions, its
// SELECT, and what it is ordered by. gate, when not empty, is a condition
// without which the SELECT returns no row (settleReadSQL's fence).
func readParts(k int, strict, routed, chunked bool, gate string) (ctes, sel, order string) {
	if gate != "" {
		gate = `
WHERE ` + gate
	}
	var dead, heldDead, with, topic, unrouted, heldUnrouted string
	if strict {
		dead = `
      OR ` + pgsql.BehindDead("o")
		heldDead = `
    OR b.logged AND b.key IS NOT NULL AND ` + pgsql.BehindDead("b")
	}
	if routed {
		with = pgsql.UnroutedKeys("$1", "$8") + `, `
		topic = `
    AND o.topic LIKE ANY($8::text[])`
		unrouted = `
      OR ` + pgsql.BehindUnrouted("o")
		heldUnrouted = `
    OR b.logged AND NOT (b.topic LIKE ANY($8::text[]))
    OR b.logged AND b.key IS NOT NULL
      AND (` + pgsql.BehindUnrouted("b") + `
           OR EXISTS (SELECT 1 FROM b b2 WHERE b2.key = b.key AND b2.seq < b.seq AND NOT (b2.topic LIKE ANY($8::text[]))))`
	}
	var bound, above, below, top, sentinel string
	order = "b.seq"
	if chunked {
		bound, above = `
    CROSS JOIN LATERAL `+chunkBound("d.lo::pg_snapshot"), `
        AND o.seq >= cb.seq`
		u := "$8"
		if routed {
			u = "$9"
		}
		const last = seqLastSQL + `::text`
		below, top, order = ` AND o.seq <= `+u+`::bigint`, ` || ' ' || `+last, "2"
		sentinel = `
UNION ALL
SELECT 'top ' || ` + last + `, 0, '', '', '', '\x'::bytea, '{}', -1, 0, now(), false, false, false
WHERE NOT EXISTS (SELECT 1 FROM b)` + strings.Replace(gate, "\nWHERE", " AND", 1)
	}
	const cols = `o.seq, o.id, o.topic, o.key, o.payload, o.headers, o.partition`
	var arms []string
	if k == 0 {
		// The small statement: one range arm over every partition, each
		// limited, then sorted, with nothing to merge. Its plan is a few
		// nodes where the k arms' are a few nodes a partition, and at a
		// trickle, where a read returns a row or two, setting the plan up
		// is most of what a read costs PostgreSQL (design §3, "At a
		// trickle"). A backlog reads with the k arms, whose Merge Append
		// stops after the batch.
		arms = append(arms, `(SELECT `+cols+`, 0 AS attempts, o.created_at, true AS logged
  FROM unnest($1::int[], $3::text[], $5::bigint[], $6::text[], $7::bigint[]) AS a(part, lo, lo_seq, hi, cur)
  CROSS JOIN LATERAL (SELECT * FROM {p}log o
    WHERE o.partition = a.part AND o.seq > greatest(a.lo_seq, a.cur)`+below+`
      AND NOT pg_visible_in_snapshot(o.xid, a.lo::pg_snapshot)
      AND (a.hi IS NULL OR pg_visible_in_snapshot(o.xid, a.hi::pg_snapshot))
    ORDER BY o.seq LIMIT $2) o)`)
	}
	for i := 1; i <= k; i++ {
		arms = append(arms, fmt.Sprintf(`(SELECT `+cols+`, 0 AS attempts, o.created_at, true AS logged FROM {p}log o
  WHERE o.partition = ($1::int[])[%[1]d] AND o.seq > greatest(($5::bigint[])[%[1]d], ($7::bigint[])[%[1]d])`+below+`
    AND NOT pg_visible_in_snapshot(o.xid, ($3::text[])[%[1]d]::pg_snapshot)
    AND (($6::text[])[%[1]d] IS NULL OR pg_visible_in_snapshot(o.xid, ($6::text[])[%[1]d]::pg_snapshot))
  ORDER BY o.seq LIMIT $2)`, i))
	}
	arms = append(arms, `(SELECT `+cols+`, 0 AS attempts, o.created_at, true AS logged
  FROM (SELECT d.lo AS d_lo, d.lo_next AS d_next, o.*
    FROM (SELECT DISTINCT lo, lo_next FROM unnest($3::text[], $4::text[]) AS d(lo, lo_next)) d`+bound+`
    CROSS JOIN LATERAL (SELECT o.* FROM pg_snapshot_xip(d.lo::pg_snapshot) AS x(id)
      CROSS JOIN LATERAL (SELECT * FROM {p}log o WHERE o.xid = x.id`+above+` OFFSET 0) o
      UNION ALL
      SELECT * FROM {p}log o
      WHERE o.xid >= pg_snapshot_xmax(d.lo::pg_snapshot) AND o.xid < d.lo_next::xid8`+above+`
      OFFSET 0) o
    OFFSET 0) o
  JOIN unnest($1::int[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::bigint[]) AS a(part, lo, lo_next, lo_seq, hi, cur)
    ON a.lo = o.d_lo AND a.lo_next = o.d_next AND a.part = o.partition
  WHERE o.seq <= a.lo_seq AND o.seq > a.cur
    AND (a.hi IS NULL OR pg_visible_in_snapshot(o.xid, a.hi::pg_snapshot)))`,
		`(SELECT `+cols+`, o.attempts, o.created_at, false AS logged FROM {p}outbox o
  WHERE o.partition = ANY($1::int[]) AND (o.attempts = 0 OR o.available_at <= now())`+topic+`
    AND (o.key IS NULL OR NOT (
      EXISTS (SELECT 1 FROM {p}outbox r WHERE r.attempts > 0 AND r.key IS NOT NULL)
      AND EXISTS (SELECT 1 FROM {p}outbox b
                  WHERE b.key = o.key AND b.seq < o.seq AND b.attempts > 0 AND b.available_at > now())`+dead+unrouted+`))
  ORDER BY o.seq LIMIT $2)`)
	// The snapshot and the id come once, on the first row; a read that
	// finds nothing returns no row, and the join leaves the id unassigned.
	ctes = with + `b AS (
` + strings.Join(arms, "\nUNION ALL\n") + `
ORDER BY 1 LIMIT $2), s AS (
  SELECT pg_current_snapshot()::text AS snap, pg_current_xact_id()::text AS xid,
    set_config('synchronous_commit', 'off', true) AS async
)`
	sel = `SELECT CASE WHEN b.seq = (SELECT min(seq) FROM b) THEN s.snap || ' ' || s.xid` + top + ` END,
  b.seq, b.id::text, b.topic, coalesce(b.key, ''), b.payload, b.headers::text, b.partition, b.attempts, b.created_at, b.logged,
  b.logged AND b.key IS NOT NULL
    AND EXISTS (SELECT 1 FROM {p}outbox r WHERE r.attempts > 0 AND r.key IS NOT NULL)
    AND EXISTS (SELECT 1 FROM {p}outbox h
                WHERE h.key = b.key AND h.seq < b.seq AND h.attempts > 0 AND h.available_at > now())` + heldDead + heldUnrouted + `,
  b.logged AND (SELECT EXISTS (SELECT 1 FROM {p}log_done))
    AND EXISTS (SELECT 1 FROM {p}log_done m WHERE m.partition = b.partition AND m.seq = b.seq)
FROM b CROSS JOIN s` + gate + sentinel
	return ctes, sel, order
}

// settleLogSQL records the log rows of one read, fenced by the owner ($1)
// and its generations by partition ($2), which it reads in the leases
// without locking them: it moves each partition's
// position ($3–$10, by partition) and moves into the outbox the read's
// log rows that were not published ($11 their seqs, $12 partitions; with
// $13 the error, $14 the backoff and $15 whether it is permanent for
// those that failed, the error NULL for those not sent), or buries those
// that failed for good ($16 the attempt budget). Only the partitions
// whose lease held are moved, and only their rows moved out. A copy whose
// id is pending already is left out: consumers absorb a copy by id. The
// rows recorded one by one (log_done) that the new lo passes are done by
// the position from now on, and their marks go. The record is noted in
// log_passes: what it published by partition and topic ($18–$21: the
// partition, the topic, how many, the oldest's creation time), and the
// positions of the partitions $17 (those due a note, noteEvery).
//
// The log keeps only what it published: the rows it hands to the outbox
// leave it, so that its history is every row a position has passed.
const settleLogSQL = `WITH ` + settleLogCTEs + `
SELECT partition::bigint, 0, false, set_config('synchronous_commit', 'off', true) = 'off' FROM moved
UNION ALL
SELECT seq, attempts, false, false FROM copied WHERE attempts > 0
UNION ALL
SELECT seq, attempts, true, false FROM buried`

// settleLogCTEs are settleLogSQL's common table expressions, which
// settleReadSQL shares.
const settleLogCTEs = `moved AS (
  UPDATE {p}positions x SET lo = a.lo::pg_snapshot, lo_next = a.lo_next::xid8, lo_seq = a.lo_seq,
    hi = a.hi::pg_snapshot, hi_next = a.hi_next::xid8, band_cursor = a.cur, band_max = a.bmax
  FROM unnest($3::int[], $4::text[], $5::text[], $6::bigint[], $7::text[], $8::text[], $9::bigint[], $10::bigint[])
    AS a(part, lo, lo_next, lo_seq, hi, hi_next, cur, bmax), {p}leases l
  WHERE x.partition = a.part AND l.partition = a.part AND l.owner = $1 AND l.generation = ($2::bigint[])[l.partition + 1]
  RETURNING x.partition
), undone AS (
  DELETE FROM {p}log_done m USING {p}log g, unnest($3::int[], $4::text[]) AS a(part, lo)
  WHERE EXISTS (SELECT 1 FROM {p}log_done)
    AND m.partition IN (SELECT partition FROM moved) AND m.partition = a.part
    AND g.partition = m.partition AND g.seq = m.seq AND pg_visible_in_snapshot(g.xid, a.lo::pg_snapshot)
), src AS (
  DELETE FROM {p}log g
  USING unnest($11::bigint[], $12::int[], $13::text[], $14::bigint[], $15::boolean[]) AS c(seq, part, err, backoff_ms, dead)
  WHERE g.partition = c.part AND g.seq = c.seq AND c.part IN (SELECT partition FROM moved)
  RETURNING g.seq, g.id, g.topic, g.key, g.payload, g.headers, g.partition, g.created_at, c.err, c.backoff_ms,
    c.err IS NOT NULL AND (1 >= $16 OR c.dead) AS dies
), published AS (
  SELECT coalesce(array_agg(t.topic), '{}') AS topics, coalesce(array_agg(t.n), '{}') AS counts,
    coalesce(array_agg(t.oldest), '{}') AS oldest
  FROM unnest($18::int[], $19::text[], $20::int[], $21::timestamptz[]) AS t(part, topic, n, oldest)
  WHERE t.part IN (SELECT partition FROM moved)
), noted AS (
  SELECT array_agg(a.part) AS parts, array_agg(a.lo) AS lo, array_agg(a.lo_seq) AS lo_seq, array_agg(a.hi) AS hi,
    array_agg(a.cur) AS cur
  FROM unnest($3::int[], $4::text[], $6::bigint[], $7::text[], $9::bigint[]) AS a(part, lo, lo_seq, hi, cur)
  WHERE a.part = ANY($17::int[]) AND a.part IN (SELECT partition FROM moved)
), passes AS (
  INSERT INTO {p}log_passes (parts, lo, lo_seq, hi, cursors, topics, counts, oldest)
  SELECT coalesce(n.parts, '{}'), coalesce(n.lo, '{}'), coalesce(n.lo_seq, '{}'), coalesce(n.hi, '{}'), coalesce(n.cur, '{}'),
    p.topics, p.counts, p.oldest
  FROM noted n, published p WHERE n.parts IS NOT NULL OR cardinality(p.topics) > 0
), copied AS (
  INSERT INTO {p}outbox (seq, id, topic, key, payload, headers, partition, created_at, attempts, last_error, available_at)
  OVERRIDING SYSTEM VALUE
  SELECT seq, id, topic, key, payload, headers, partition, created_at, (err IS NOT NULL)::int, err,
    now() + coalesce(backoff_ms, 0) * interval '1 millisecond'
  FROM src WHERE NOT dies
  ON CONFLICT DO NOTHING
  RETURNING seq, attempts
), buried AS (
  INSERT INTO {p}dead (seq, id, topic, key, payload, headers, partition, created_at, attempts, last_error)
  SELECT seq, id, topic, key, payload, headers, partition, created_at, 1, err FROM src WHERE dies
  ON CONFLICT (id) DO UPDATE SET seq = EXCLUDED.seq, topic = EXCLUDED.topic, key = EXCLUDED.key,
    payload = EXCLUDED.payload, headers = EXCLUDED.headers, partition = EXCLUDED.partition,
    created_at = EXCLUDED.created_at, attempts = EXCLUDED.attempts, last_error = EXCLUDED.last_error, dead_at = now()
  RETURNING seq, attempts
)`

// Fetch implements postboxdriver.Executor: up to p.Limit rows of the
// fenced partitions in seq order, from the log's bands and the outbox's
// exceptions.
func (s *logStore[T]) Fetch(ctx context.Context, p postboxdriver.FetchParams) ([]postboxdriver.Record, error) {
	recs, err := s.fetch(ctx, p)
	return recs, s.wrap(err)
}

func (s *logStore[T]) fetch(ctx context.Context, p postboxdriver.FetchParams) ([]postboxdriver.Record, error) {
	return s.fetchAfter(ctx, p, nil)
}

// firstRead is a read of p already run, by settleReadSQL, and where it
// leads (finish).
type firstRead struct {
	rows []logRow
	br   *bandRead
	cut  bool
}

// ReadWhole implements postboxdriver.PartialReader: a read short of its
// limit, not cut at an upper bound, takes whole the partitions that had
// no band open, whose band it opened at its own snapshot; a partition
// whose band was open is read to the end of that band only.
func (s *logStore[T]) ReadWhole(recs []postboxdriver.Record) []int {
	seqs := make([]int64, len(recs))
	for i := range recs {
		seqs[i] = recs[i].Seq
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if br := s.pending[keyOf(seqs)]; br != nil {
		return slices.Clone(br.whole)
	}
	return nil
}

// fetchAfter is fetch, whose first read, when first is not nil, has run.
func (s *logStore[T]) fetchAfter(ctx context.Context, p postboxdriver.FetchParams, first *firstRead) ([]postboxdriver.Record, error) {
	if len(p.Fence.Generations) == 0 || p.Limit <= 0 {
		return nil, nil
	}
	// A read of only held or marked rows, or of nothing where a band was open,
	// hands the relay nothing to settle: its rows are moved out and its
	// position moved here, and the read runs again.
	for range 4 {
		var rows []logRow
		var br *bandRead
		var err error
		switch {
		case first == nil:
			rows, br, err = s.read(ctx, p)
		case first.cut && len(first.rows) < p.Limit:
			// Cut short of its limit: read again, the bound raised (read).
			rows, br, err = s.read(ctx, p)
		default:
			rows, br = first.rows, first.br
		}
		first = nil
		if err != nil {
			return nil, err
		}
		if br == nil {
			return nil, s.payNotes(ctx, p.Fence)
		}
		recs, seqs := make([]postboxdriver.Record, 0, len(rows)), make([]int64, 0, len(rows))
		for _, r := range rows {
			if !r.held && !r.marked {
				recs, seqs = append(recs, r.rec), append(seqs, r.rec.Seq)
			}
		}
		if len(recs) > 0 {
			s.mu.Lock()
			if len(s.pending) >= maxPending {
				s.dropStale()
			}
			s.pending[keyOf(seqs)] = br
			s.mu.Unlock()
			return recs, nil
		}
		if p.Limit == 1 && len(rows) > 0 {
			// The relay's probe of sleeping lanes reads one row and
			// hands it to no lane: it records nothing, or it would move
			// a position under a lane's own read, whose record would
			// then leave the partition alone and its rows be sent
			// twice. The lane's read moves the held row instead (with
			// a batch size of one, once the older row is retried).
			return nil, nil
		}
		if _, err := s.settleLog(ctx, p.Fence, br, postboxdriver.Outcome{}, 1); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

// read runs one band read for p and works out where it leads. It returns
// no bandRead when there is nothing to settle: no row, and no band to
// close.
func (s *logStore[T]) read(ctx context.Context, p postboxdriver.FetchParams) ([]logRow, *bandRead, error) {
	// A read cut short of its limit at a bound below rows it may have
	// missed is read again at once, the bound raised: it has no effect to
	// undo. One cut with a full batch, or cut three times, is kept.
	for i := 0; ; i++ {
		rows, br, cut, err := s.readOnce(ctx, p)
		if !cut || err != nil || len(rows) == p.Limit || i == 2 {
			return rows, br, err
		}
	}
}

// readOnce is one read. In a log split into chunks, the read's range
// arms stop at an upper bound u, by which PostgreSQL skips the chunks
// ahead of the sequence and the default partition (design §3, "An upper
// bound on the read"). The statement returns the sequence's last
// value, read after its snapshot, and when it is above u the read is cut:
// it may have missed rows above u that its snapshot sees. A cut read is
// recorded as a full one (the band stays open), its cursor no further
// than u, and the bound rises for the next.
func (s *logStore[T]) readOnce(ctx context.Context, p postboxdriver.FetchParams) ([]logRow, *bandRead, bool, error) {
	parts := fenced(p.Fence)
	base, err := s.positions(ctx, p.Fence, parts)
	if err != nil {
		return nil, nil, false, err
	}
	pl := s.plan(p, parts, base)
	rs, err := s.db.Read(ctx, s.statement(s.reads, pl.shape, readSQL), pl.args...)
	if err != nil {
		s.noteFailed(pl)
		return nil, nil, false, err
	}
	got, err := scanRead(rs, pl)
	if err != nil {
		s.noteFailed(pl)
		return nil, nil, false, err
	}
	s.noteRead(pl, got)
	return s.finish(pl, got)
}

// short says whether the last read whose first partition is parts[0]
// was short (fewer rows than its limit), so that this one, most likely
// short too, takes the small statement (readParts, k = 0). A backlog
// reads full batches with the statement of one arm a partition.
//
// The first read of the partitions, and a read after one that failed,
// take the small statement too: the statement of one arm a partition
// costs PostgreSQL the more to plan the more partitions a lane reads (all
// of them when one lane reads a relay's whole share), and a read that ran
// out of time (the lease it reads under) would otherwise be tried again
// as it was, and run out of time again for as long as the database is
// that slow. Full, it hands over to the statement of one arm a partition.
func (s *logStore[T]) short(parts []int) bool {
	if len(parts) == 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	short, ok := s.shortReads[parts[0]]
	return short || !ok
}

// noteFailed keeps, for short, that a read of pl failed.
func (s *logStore[T]) noteFailed(pl readPlan) {
	if len(pl.parts) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.shortReads[pl.parts[0]] = true
}

// noteRead keeps, for short, whether a read of pl returned fewer rows
// than its limit.
func (s *logStore[T]) noteRead(pl readPlan, got scanned) {
	if len(pl.parts) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.shortReads[pl.parts[0]] = len(got.rows) < pl.p.Limit
}

// Warm implements postboxdriver.Warmer: each connection gets the read's
// settings, the positions' load and the read statement a relay's first
// read of its partitions takes (short's small statement, the same for any
// number of partitions), for no partition. The log's first read on a new
// connection is its dearest: the server process loads the catalog of the
// log's chunks and their indexes, and the read is prepared and given its
// generic plan. Among 16 relays on two busy cores, three first reads at
// once took a relay 0.45–2.8 s (SCALING.md, "Over the log").
func (s *logStore[T]) Warm(ctx context.Context, p postboxdriver.FetchParams, conns int) error {
	pl := s.plan(p, nil, nil)
	read := s.statement(s.reads, pl.shape, readSQL)
	return s.wrap(s.db.warm(ctx, conns, func(b *pgx.Batch) {
		b.Queue(ReadSettings)
		b.Queue(s.load, []int32{})
		b.Queue(read, pl.args...)
	}))
}

// fenced are the fence's partitions in order.
func fenced(f postboxdriver.Fence) []int {
	parts := make([]int, 0, len(f.Generations))
	for part := range f.Generations {
		parts = append(parts, part)
	}
	sort.Ints(parts)
	return parts
}

// readPlan is a read about to run: the partitions it reads and the
// positions it reads them from, its statement's shape and arguments, and
// in a log split into chunks its upper bound u.
type readPlan struct {
	p     postboxdriver.FetchParams
	parts []int
	base  map[int]position
	shape readShape
	args  []any
	u     int64
}

// plan is the read of p's partitions from the positions base.
func (s *logStore[T]) plan(p postboxdriver.FetchParams, parts []int, base map[int]position) readPlan {
	k := len(parts)
	ps, lo, loNext, hi := make([]int32, k), make([]string, k), make([]string, k), make([]*string, k)
	loSeq, cur := make([]int64, k), make([]int64, k)
	for i, part := range parts {
		b := base[part]
		ps[i], lo[i], loNext[i], loSeq[i], hi[i], cur[i] = int32(part), b.lo, b.loNext, b.loSeq, b.hi, b.cursor
	}
	pl := readPlan{p: p, parts: parts, base: base, shape: readShape{k, p.BlockOnDead, p.Topics != nil, s.short(parts)}}
	pl.args = []any{ps, p.Limit, lo, loNext, loSeq, hi, cur}
	if p.Topics != nil {
		pl.args = append(pl.args, pgsql.LikePatterns(p.Topics))
	}
	if s.chunks.width > 0 {
		pl.u = s.top.Load() + s.chunks.width/16 + 1
		pl.args = append(pl.args, pl.u)
	}
	return pl
}

// statement is the statement of shape in cache, built by build and
// prefixed on first use.
func (s *logStore[T]) statement(cache map[readShape]string, shape readShape, build func(k int, strict, routed, chunked bool) string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	q, ok := cache[shape]
	if !ok {
		k := shape.parts
		if shape.small {
			k = 0
		}
		q = s.r.Replace(build(k, shape.strict, shape.routed, s.chunks.width > 0))
		cache[shape] = q
	}
	return q
}

// scanned is what a read statement returned: its rows, its snapshot and
// id, the sequence's last value (-1 where the statement does not read
// it), and for settleReadSQL the partitions its record moved.
type scanned struct {
	rows      []logRow
	snap, xid string
	top       int64
	moved     []int
	record    bool // a settleReadSQL's record row came
}

// scanRead reads a read statement's rows: the log's and the outbox's, with
// the statement's own values on the first (readSQL) and rows of their own
// ("top N", "moved p,q,... async").
//
// The rows are scanned in place. A read expected to be full (pl's shape
// not small: the last read of its partitions was not short) makes room
// for its limit at once, so that a batch of a backlog costs one
// allocation for its rows rather than one a row and the slice's growth;
// a short one grows as it goes.
func scanRead(rs pgx.Rows, pl readPlan) (scanned, error) {
	defer rs.Close()
	got := scanned{top: -1}
	if !pl.shape.small {
		got.rows = make([]logRow, 0, pl.p.Limit+1)
	}
	var mark *string
	for rs.Next() {
		got.rows = append(got.rows, logRow{})
		r := &got.rows[len(got.rows)-1]
		rec := &r.rec
		if err := rs.Scan(&mark, &rec.Seq, &rec.ID, &rec.Topic, &rec.Key, &rec.Payload, &rec.Headers, &rec.Partition, &rec.Attempts, &rec.CreatedAt, &r.logged, &r.held, &r.marked); err != nil {
			got.rows = got.rows[:len(got.rows)-1]
			return got, err
		}
		if mark != nil {
			// "snap xid", "snap xid top" in a log split into chunks, or
			// "top N" alone for a read that found nothing there.
			f := strings.Split(*mark, " ")
			switch f[0] {
			case "top":
				got.top, _ = strconv.ParseInt(f[1], 10, 64)
				got.rows = got.rows[:len(got.rows)-1]
				continue
			case "moved":
				got.record = true
				for _, part := range strings.Split(f[1], ",") {
					if n, err := strconv.Atoi(part); err == nil {
						got.moved = append(got.moved, n)
					}
				}
				got.rows = got.rows[:len(got.rows)-1]
				continue
			}
			got.snap, got.xid = f[0], f[1]
			if len(f) == 3 {
				got.top, _ = strconv.ParseInt(f[2], 10, 64)
			}
		}
	}
	return got, rs.Err()
}

// finish works out where the read pl, which returned got, leads: the
// rows, what to settle, and whether the read was cut at its upper bound.
func (s *logStore[T]) finish(pl readPlan, got scanned) ([]logRow, *bandRead, bool, error) {
	base, out := pl.base, got.rows
	maxSeq := map[int]int64{}
	br := &bandRead{base: base, next: map[int]position{}, logged: make(map[int64]loggedRow, len(out))}
	for _, r := range out {
		if rec := r.rec; r.logged {
			if !r.marked {
				br.logged[rec.Seq] = loggedRow{rec.Partition, rec.Topic, rec.CreatedAt}
			}
			maxSeq[rec.Partition] = max(maxSeq[rec.Partition], rec.Seq)
		}
	}
	cut := false
	if s.chunks.width > 0 {
		if got.top < 0 {
			return nil, nil, false, errors.New("postbox: the log's read returned no sequence value")
		}
		raise(&s.top, got.top)
		cut = got.top > pl.u
	}
	if len(out) == 0 && cut {
		// Rows above u may be visible: no band closes.
		return nil, nil, true, nil
	}
	if len(out) == 0 {
		// Nothing left of an open band: it is read whole, and closes
		// (without this, a band whose snapshot is old would read nothing
		// from now on). A partition without a band stays where it is.
		// Only the closing partitions are recorded, so that a lane's
		// read of the others is not disturbed.
		br.base = map[int]position{}
		for _, part := range pl.parts {
			if base[part].hi != nil {
				br.base[part], br.next[part] = base[part], base[part].next(false, "", "", 0, 0)
			}
		}
		if len(br.base) == 0 {
			br = nil
		}
		return nil, br, false, nil
	}
	full, last := len(out) == pl.p.Limit, out[len(out)-1].rec.Seq
	if !full && !cut {
		// A partition whose band was open is read to that band's end,
		// which an older snapshot bounds: rows committed after it wait
		// for the next read. One without reads to this read's snapshot.
		for _, part := range pl.parts {
			if base[part].hi == nil {
				br.whole = append(br.whole, part)
			}
		}
	}
	if cut {
		// Every row up to u was read, and up to the batch's last when
		// the batch is full; none above u.
		if full {
			last = min(last, pl.u)
		} else {
			last = pl.u
		}
		full = true
	}
	for part := range maxSeq {
		br.touched = append(br.touched, part)
	}
	sort.Ints(br.touched)
	for _, part := range pl.parts {
		br.next[part] = base[part].next(full, got.snap, got.xid, last, maxSeq[part])
	}
	return out, br, cut, nil
}

// raise sets v to n if n is larger.
func raise(v *atomic.Int64, n int64) {
	for {
		seen := v.Load()
		if n <= seen || v.CompareAndSwap(seen, n) {
			return
		}
	}
}

// positions returns the fenced partitions' positions, loading from the
// table those this process does not hold at the fence's generation.
func (s *logStore[T]) positions(ctx context.Context, f postboxdriver.Fence, parts []int) (map[int]position, error) {
	out := make(map[int]position, len(parts))
	var missing []int32
	s.mu.Lock()
	for _, part := range parts {
		if pos, ok := s.pos[part]; ok && pos.gen == f.Generations[part] {
			out[part] = pos
		} else {
			missing = append(missing, int32(part))
		}
	}
	s.mu.Unlock()
	if len(missing) == 0 {
		return out, nil
	}
	rs, err := s.db.Query(ctx, s.load, missing)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	for rs.Next() {
		var part int
		var pos position
		if err := rs.Scan(&part, &pos.lo, &pos.loNext, &pos.loSeq, &pos.hi, &pos.hiNext, &pos.cursor, &pos.bandMax); err != nil {
			return nil, err
		}
		// Held at the fence's generation from now on; if the lease
		// has moved on, Settle's fence refuses the advance.
		pos.gen = f.Generations[part]
		out[part] = pos
	}
	if err := rs.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	now := time.Now()
	for _, part := range missing {
		if cur, ok := s.pos[int(part)]; !ok || cur.gen != f.Generations[int(part)] {
			s.pos[int(part)] = out[int(part)]
			s.stored[int(part)] = now
		}
	}
	s.mu.Unlock()
	if len(out) != len(parts) {
		// Migration 12 gives every partition of the leases its row.
		return nil, fmt.Errorf("pglog: %d of %d partitions have no row in %spositions", len(parts)-len(out), len(parts), s.prefix)
	}
	return out, nil
}

// settleParams is the number of settleLogSQL's parameters, after which
// settleReadSQL's read takes its own.
const settleParams = 21

// placeholder is a statement's parameter reference.
var placeholder = regexp.MustCompile(`\$[0-9]+`)

// settleReadSQL records a read's log rows as settleLogSQL does and reads
// the next batch of k partitions as readSQL does, in one statement
// (SettleFetch): the read's parameters follow the record's, and its
// positions are those the record moves to. The read runs only if the
// record moved every partition it was given; a row of its own, first,
// names those it moved ("moved p,q,..."). The statement has one snapshot,
// which the read returns as its own, and the record's update assigns the
// statement its id after that snapshot was taken, as a read alone does:
// the id bounds every id assigned before the snapshot (design §3, "The
// position"). Neither part sees what the other writes: SettleFetch runs it
// only for a batch whose every log row was published, whose record moves
// no row out of the log, and the read takes its positions as parameters.
func settleReadSQL(k int, strict, routed, chunked bool) string {
	ctes, sel, _ := readParts(k, strict, routed, chunked, "{settled}")
	shift := func(q string) string {
		return placeholder.ReplaceAllStringFunc(q, func(m string) string {
			n, _ := strconv.Atoi(m[1:])
			return "$" + strconv.Itoa(n+settleParams)
		})
	}
	return "WITH " + settleLogCTEs + ",\n" + shift(ctes) + "\n" +
		strings.ReplaceAll(shift(sel), "{settled}", "(SELECT count(*) FROM moved) = cardinality($3::int[])") + `
UNION ALL
SELECT 'moved ' || coalesce((SELECT string_agg(partition::text, ',') FROM moved), '') || ' ' || set_config('synchronous_commit', 'off', true),
  -1, '', '', '', '\x'::bytea, '{}', -1, 0, now(), false, false, false
ORDER BY 2`
}

// SettleFetch implements postboxdriver.SettleFetcher. A batch that
// published every log row it read and nothing else, as the relay's small
// batches do, is recorded in the statement that reads the next batch
// (settleReadSQL). Any other is recorded as Settle records it, and the
// next batch read after.
func (s *logStore[T]) SettleFetch(ctx context.Context, f postboxdriver.Fence, o postboxdriver.Outcome, maxAttempts int, p postboxdriver.FetchParams) (postboxdriver.Settled, []postboxdriver.Record, error) {
	if len(o.Failed) > 0 {
		return postboxdriver.Settled{}, nil, fmt.Errorf("postbox: SettleFetch records publishes only, and was given %d failures", len(o.Failed))
	}
	st, recs, err := s.settleFetch(ctx, f, o, maxAttempts, p)
	return st, recs, s.wrap(err)
}

func (s *logStore[T]) settleFetch(ctx context.Context, f postboxdriver.Fence, o postboxdriver.Outcome, maxAttempts int, p postboxdriver.FetchParams) (postboxdriver.Settled, []postboxdriver.Record, error) {
	lr, pl, err := s.planSettleRead(ctx, f, o, maxAttempts, p)
	if err != nil {
		return postboxdriver.Settled{}, nil, err
	}
	if lr == nil {
		st, err := s.record(ctx, f, o, maxAttempts)
		if err != nil || st.Published < len(o.Published) {
			// A lease moved on: the relay renews before it reads.
			return st, nil, err
		}
		recs, err := s.fetch(ctx, p)
		return st, recs, err
	}
	var moved []int
	defer func() { s.release(lr, moved) }()
	rs, err := s.db.Read(ctx, s.statement(s.settleReads, pl.shape, settleReadSQL), append(slices.Clip(lr.args), pl.args...)...)
	if err != nil {
		s.noteFailed(pl)
		return postboxdriver.Settled{}, nil, err
	}
	got, err := scanRead(rs, pl)
	if err == nil && !got.record {
		err = errors.New("postbox: the log's record and read returned no record")
	}
	if err != nil {
		s.noteFailed(pl)
		return postboxdriver.Settled{}, nil, err
	}
	moved = got.moved
	s.noteRead(pl, got)
	st := postboxdriver.Settled{Published: s.moved(lr, moved)}
	s.published.Add(int64(st.Published))
	s.rode.Add(1)
	if len(moved) < len(lr.write) {
		return st, nil, nil
	}
	rows, br, cut, err := s.finish(pl, got)
	if err != nil {
		return st, nil, err
	}
	recs, err := s.fetchAfter(ctx, p, &firstRead{rows, br, cut})
	return st, recs, err
}

// planSettleRead prepares the record of o and the read of p in one
// statement: o names a read this process holds, every log row of which
// it published and nothing else, and every partition of that read can be
// recorded now and, where p reads it too, under the same generation. It
// returns the record, claimed, and the read from the positions the record
// moves to; or no record when o is to be recorded on its own.
func (s *logStore[T]) planSettleRead(ctx context.Context, f postboxdriver.Fence, o postboxdriver.Outcome, maxAttempts int, p postboxdriver.FetchParams) (*logRecord, readPlan, error) {
	if len(o.Read) == 0 || len(o.Published) != len(o.Read) || len(p.Fence.Generations) == 0 || p.Limit <= 0 {
		return nil, readPlan{}, nil
	}
	s.mu.Lock()
	br := s.pending[keyOf(o.Read)]
	s.mu.Unlock()
	if br == nil || len(br.logged) != len(o.Published) {
		return nil, readPlan{}, nil
	}
	for _, seq := range o.Published {
		if _, ok := br.logged[seq]; !ok {
			return nil, readPlan{}, nil
		}
	}
	for part, base := range br.base {
		if gen, ok := p.Fence.Generations[part]; ok && gen != base.gen {
			return nil, readPlan{}, nil
		}
	}
	parts := fenced(p.Fence)
	base, err := s.positions(ctx, p.Fence, parts)
	if err != nil {
		return nil, readPlan{}, err
	}
	lr := s.claim(f, br, o, maxAttempts)
	if lr == nil {
		return nil, readPlan{}, nil
	}
	if len(lr.parts) < len(br.base) {
		s.release(lr, nil)
		return nil, readPlan{}, nil
	}
	s.mu.Lock()
	delete(s.pending, keyOf(o.Read))
	s.mu.Unlock()
	for part, next := range br.next {
		if _, ok := base[part]; ok {
			base[part] = next
		}
	}
	return lr, s.plan(p, parts, base), nil
}

// Settle implements postboxdriver.Executor: the batch's exceptions are
// recorded as the outbox records them, its log rows by moving the
// positions and moving out those not published.
func (s *logStore[T]) Settle(ctx context.Context, f postboxdriver.Fence, o postboxdriver.Outcome, maxAttempts int) (postboxdriver.Settled, error) {
	st, err := s.record(ctx, f, o, maxAttempts)
	return st, s.wrap(err)
}

func (s *logStore[T]) record(ctx context.Context, f postboxdriver.Fence, o postboxdriver.Outcome, maxAttempts int) (postboxdriver.Settled, error) {
	var br *bandRead
	if len(o.Read) > 0 {
		s.mu.Lock()
		br = s.pending[keyOf(o.Read)]
		delete(s.pending, keyOf(o.Read))
		s.mu.Unlock()
	}
	if br == nil {
		// Not a read this process holds as named: the outbox's rows are
		// recorded as the outbox records them, the log's one by one.
		st, err := s.Store.Settle(ctx, f, o, maxAttempts)
		if err != nil {
			return st, err
		}
		lt, err := s.settleRows(ctx, f, o, maxAttempts)
		if err != nil {
			return st, err
		}
		st.Published += lt.Published
		st.Failed = append(st.Failed, lt.Failed...)
		slices.SortFunc(st.Failed, func(a, b postboxdriver.FailResult) int { return cmp.Compare(a.Seq, b.Seq) })
		s.published.Add(int64(st.Published))
		return st, nil
	}
	exc := postboxdriver.Outcome{}
	for _, seq := range o.Published {
		if _, ok := br.logged[seq]; !ok {
			exc.Published = append(exc.Published, seq)
		}
	}
	for _, fl := range o.Failed {
		if _, ok := br.logged[fl.Seq]; !ok {
			exc.Failed = append(exc.Failed, fl)
		}
	}
	var out postboxdriver.Settled
	if len(exc.Published) > 0 || len(exc.Failed) > 0 {
		st, err := s.Store.Settle(ctx, f, exc, maxAttempts)
		if err != nil {
			return out, err
		}
		out = st
	}
	st, err := s.settleLog(ctx, f, br, o, maxAttempts)
	if err != nil {
		return out, err
	}
	out.Published += st.Published
	out.Failed = append(out.Failed, st.Failed...)
	s.published.Add(int64(out.Published))
	return out, nil
}

// logPendingSQL selects the log rows no position has passed: committed,
// not visible in their partition's lo, and not in its open band's rows up
// to the cursor (logPendingArms). The rows a position passed unpublished
// were moved to the outbox or the dead messages by the statement that
// moved it.
var logPendingSQL = logPending("g.topic, g.created_at")

// logPendingIDs selects the ids of the log rows no position has passed,
// which a replay under the messages' own ids leaves out
// (pgsql.ReplaySQL's pending).
var logPendingIDs = logPending("g.id")

// logPending selects cols of the log rows g no position has passed.
func logPending(cols string) string {
	a := pgsql.LogPendingArms("true", "true")
	return `SELECT ` + cols + ` ` + a[0] + `
UNION ALL
SELECT ` + cols + ` ` + a[1]
}

// logRequeuePending is a requeue's test that the dead message d's id is
// pending again in the log, in d's partition (logPendingArms). OFFSET 0
// keeps each EXISTS a probe per dead message: without it the first
// becomes one hashed scan of the whole log.
var logRequeuePending = func() string {
	a := pgsql.LogPendingArms("x.partition = d.partition", "g.id = d.id")
	return `EXISTS (SELECT 1 ` + a[0] + ` OFFSET 0)
  OR EXISTS (SELECT 1 ` + a[1] + ` OFFSET 0)`
}()

// RequeueDeadMessages implements postboxdriver.Executor: as the outbox's,
// but a dead message whose id is pending again in the log stays dead too.
func (s *logStore[T]) RequeueDeadMessages(ctx context.Context, f postboxdriver.DeadFilter) (int, error) {
	var n int
	err := s.db.QueryRow(ctx, s.requeue, pgsql.DeadArgs(f)...).Scan(&n)
	return n, s.wrap(err)
}

// logStatsSQL is Stats over the log and the outbox: pending are the
// outbox's rows and the log's pending ones; the history is the published
// table's rows and the log's others (the rows a position passed
// unpublished left the log for the outbox or the dead messages).
var logStatsSQL = `WITH pend AS (` + logPendingSQL + `)
SELECT (SELECT count(*) FROM {p}outbox) + (SELECT count(*) FROM pend),
  (SELECT count(*) FROM {p}dead),
  coalesce(extract(epoch FROM now() - least((SELECT min(created_at) FROM {p}outbox), (SELECT min(created_at) FROM pend))), 0)::float8,
  (SELECT count(*) FROM {p}published) + (SELECT count(*) FROM {p}log) - (SELECT count(*) FROM pend)`

// Stats implements postboxdriver.Executor over the log and the outbox.
func (s *logStore[T]) Stats(ctx context.Context) (postboxdriver.Stats, error) {
	var st postboxdriver.Stats
	var age float64
	if err := s.db.QueryRow(ctx, s.stats).Scan(&st.Pending, &st.Dead, &age, &st.Published); err != nil {
		return st, s.wrap(err)
	}
	st.OldestPendingAge = time.Duration(age * float64(time.Second))
	return st, nil
}

// logHistory is a FROM item, aliased p, of the published messages: the
// published table's rows (exceptions published) and the log's rows that
// are not pending.
const logHistory = `(SELECT seq, id, topic, key, payload, headers, partition, created_at FROM {p}published
  UNION ALL
  SELECT g.seq, g.id, g.topic, g.key, g.payload, g.headers, g.partition, g.created_at
  FROM {p}log g JOIN {p}positions x USING (partition) WHERE NOT (` + pgsql.LogPendingWhere + `)) p`

// logReplayMove deletes for a replay under the messages' own ids the
// published rows selected, from the published table and from the log
// (with the marks of rows recorded one by one), as moved. It leaves out a
// row whose id is pending in the log (pgsql.PendingElsewhere of
// logPendingIDs): written anew after it was published, and not sent yet.
var logReplayMove = `pub AS (
  DELETE FROM {p}published p WHERE ` + pgsql.ReplayWhere("p") + ` AND ` + pgsql.NotPendingElsewhere("p") + `
  RETURNING p.seq, p.id, p.topic, p.key, p.payload, p.headers, p.partition
), lg AS (
  DELETE FROM {p}log g USING {p}positions x
  WHERE x.partition = g.partition AND ` + pgsql.ReplayWhere("g") + ` AND NOT (` + pgsql.LogPendingWhere + `)
    AND ` + pgsql.NotPendingElsewhere("g") + `
  RETURNING g.seq, g.id, g.topic, g.key, g.payload, g.headers, g.partition
), unmarked AS (
  DELETE FROM {p}log_done m USING lg WHERE m.partition = lg.partition AND m.seq = lg.seq
), moved AS (
  SELECT * FROM pub UNION ALL SELECT * FROM lg
)`

// logPositionsAt is a FROM item, aliased e, of each partition's position as
// of cutoff (an expression of the time), as log_passes noted it: the
// partition, lo, lo_seq, hi and the band's cursor. A partition whose
// first record came later has none.
func logPositionsAt(cutoff string) string {
	return `(SELECT x.partition, e.lo::pg_snapshot AS lo, e.lo_seq, e.hi::pg_snapshot AS hi, e.cur, e.at
  FROM {p}positions x CROSS JOIN LATERAL (
    SELECT p.at, p.lo[i] AS lo, p.lo_seq[i] AS lo_seq, p.hi[i] AS hi, p.cursors[i] AS cur
    FROM {p}log_passes p CROSS JOIN LATERAL array_position(p.parts, x.partition) AS i
    WHERE p.at <= ` + cutoff + ` AND x.partition = ANY(p.parts)
    ORDER BY p.at DESC LIMIT 1) e) e`
}

// logBehind tests that the position e passed the log row g.
const logBehind = `(pg_visible_in_snapshot(g.xid, e.lo) OR e.hi IS NOT NULL AND pg_visible_in_snapshot(g.xid, e.hi) AND g.seq <= e.cur)`

// logReplayCountsSQL counts by topic what a replay under the messages'
// own ids selects ($1–$4), and of those how many were published within
// the last $5 milliseconds: for a log row, one its partition's position
// had not passed then. A row recorded one by one counts from the record
// that moves the position past it.
var logReplayCountsSQL = `WITH ` + pgsql.PendingElsewhere(logPendingIDs) + `, h AS (
  SELECT p.topic, p.published_at >= now() - $5 * interval '1 millisecond' AS recent
  FROM {p}published p WHERE ` + pgsql.ReplayWhere("p") + ` AND ` + pgsql.NotPendingElsewhere("p") + `
  UNION ALL
  SELECT g.topic, NOT coalesce(` + logBehind + `, false)
  FROM {p}log g JOIN {p}positions x USING (partition)
  LEFT JOIN ` + logPositionsAt("now() - $5 * interval '1 millisecond'") + ` ON e.partition = g.partition
  WHERE NOT (` + pgsql.LogPendingWhere + `) AND ` + pgsql.ReplayWhere("g") + ` AND ` + pgsql.NotPendingElsewhere("g") + `
)
SELECT topic, count(*)::int, (count(*) FILTER (WHERE $5 > 0 AND recent))::int FROM h GROUP BY topic ORDER BY topic`

// logPruneSQL deletes at most $2 log rows that their partition's
// position had passed $1 milliseconds ago (the history older than that
// by publish time), searching each partition's rows up to the larger of
// that position's lo_seq and cursor, and the log_passes rows no
// partition's position at that time needs, once over a minute old.
var logPruneSQL = `WITH e AS (SELECT * FROM ` + logPositionsAt("now() - $1 * interval '1 millisecond'") + `
), old AS (
  SELECT g.partition, g.seq FROM e JOIN {p}log g ON g.partition = e.partition AND g.seq <= greatest(e.lo_seq, e.cur)
  WHERE ` + logBehind + `
  LIMIT $2
), del AS (
  DELETE FROM {p}log g USING old WHERE g.partition = old.partition AND g.seq = old.seq RETURNING 1
), passes AS (
  DELETE FROM {p}log_passes p
  WHERE p.at < (SELECT min(at) FROM e) AND p.at < now() - interval '1 minute'
)
SELECT count(*) FROM del`

// TopicStats implements postboxdriver.Executor: the log's pending rows
// count beside the outbox's, and its records of the last minute beside
// the published table's.
func (s *logStore[T]) TopicStats(ctx context.Context) ([]postboxdriver.TopicStats, error) {
	rs, err := s.db.Query(ctx, s.topicStats)
	if err != nil {
		return nil, s.wrap(err)
	}
	out, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (postboxdriver.TopicStats, error) { return pgsql.ScanTopicStats(r.Scan) })
	return out, s.wrap(err)
}

// Replay implements postboxdriver.Executor over the published table and
// the log.
func (s *logStore[T]) Replay(ctx context.Context, r postboxdriver.ReplayParams) (int, error) {
	n, err := pgsql.RunReplay(ctx, s.replay, r, s.count, func(ctx context.Context, sql string, args ...any) error {
		_, err := s.db.Exec(ctx, sql, args...)
		return err
	})
	return n, s.wrap(err)
}

// count runs a statement that returns one count.
func (s *logStore[T]) count(ctx context.Context, sql string, args ...any) (int, error) {
	var n int
	err := s.db.QueryRow(ctx, sql, args...).Scan(&n)
	return n, err
}

// ReplayCounts implements postboxdriver.Executor over the published table
// and the log.
func (s *logStore[T]) ReplayCounts(ctx context.Context, r postboxdriver.ReplayParams, recent time.Duration) ([]postboxdriver.ReplayCount, error) {
	rs, err := s.db.Query(ctx, s.replayCounts, pgsql.ReplayCountsArgs(r, recent)...)
	if err != nil {
		return nil, s.wrap(err)
	}
	out, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (postboxdriver.ReplayCount, error) { return pgsql.ScanReplayCount(r.Scan) })
	return out, s.wrap(err)
}

// PrunePublished implements postboxdriver.Executor: the published table
// first, at most limit rows; then the log's chunks that retention has
// passed, whole, whatever rows they hold (maintainChunks); then, up to
// limit rows in all, the log's rows row by row, but only those past the
// retention by two chunks' spans: the rows of a chunk some pending row
// holds, and those of the default partition. In steady state a chunk is
// dropped before any of its rows is that old.
//
// The chunks are kept on the first call of a retention pass (the call
// before it came back short of its limit), and at least once a minute
// should passes never end: not on each of a pass's batches.
func (s *logStore[T]) PrunePublished(ctx context.Context, age time.Duration, limit int) (n int, err error) {
	defer func() { s.midPass.Store(err == nil && n >= limit) }()
	if n, err = s.Store.PrunePublished(ctx, age, limit); err != nil || n >= limit {
		return n, err
	}
	if s.chunks.width == 0 {
		m, err := s.count(ctx, s.prune, age.Milliseconds(), limit-n)
		return n + m, s.wrap(err)
	}
	if last := s.chunksKept.Load(); !s.midPass.Load() || time.Since(time.Unix(0, last)) > time.Minute {
		s.chunksKept.Store(time.Now().UnixNano())
		d, err := s.maintainChunks(ctx, age)
		if n += d; err != nil || n >= limit {
			return n, s.wrap(err)
		}
	}
	var span int64
	if err := s.db.QueryRow(ctx, s.chunkSpan).Scan(&span); err != nil {
		return n, s.wrap(err)
	}
	m, err := s.count(ctx, s.prune, age.Milliseconds()+2*span, limit-n)
	return n + m, s.wrap(err)
}

// ResolveCrashes implements postboxdriver.Executor. The relay asks it
// first for the batch of a partition taken after its owner's lease ran
// out, which it then publishes with crash marks (MarkInFlight); marks are
// kept in the outbox, so the log rows of every read the seqs belong to are
// first moved there unsent and the positions moved past them: from then
// on they are exceptions, marked, suspected and buried as the outbox's
// rows are, and those reads' records are the outbox's. A log row carries
// no mark, so none of them is a suspect yet. A read whose partition moved
// on meanwhile is left alone: its rows are read again.
func (s *logStore[T]) ResolveCrashes(ctx context.Context, f postboxdriver.Fence, seqs []int64) ([]postboxdriver.Suspect, error) {
	if err := s.toExceptions(ctx, f, seqs); err != nil {
		return nil, s.wrap(err)
	}
	return s.Store.ResolveCrashes(ctx, f, seqs)
}

// toExceptions moves the log rows of the pending reads that hold any of
// seqs into the outbox, unsent, and forgets those reads.
func (s *logStore[T]) toExceptions(ctx context.Context, f postboxdriver.Fence, seqs []int64) error {
	var reads []*bandRead
	s.mu.Lock()
	for k, br := range s.pending {
		for _, seq := range seqs {
			if _, ok := br.logged[seq]; ok {
				reads = append(reads, br)
				delete(s.pending, k)
				break
			}
		}
	}
	s.mu.Unlock()
	for _, br := range reads {
		if _, err := s.settleLog(ctx, f, br, postboxdriver.Outcome{}, 1); err != nil {
			return err
		}
	}
	return nil
}

// settleRowsSQL records log rows one by one, for a Settle that names rows
// of no read of this process's, fenced by the owner ($1) and its
// generations by partition ($2), among the fenced partitions ($3): the
// published ($4) and failed ones ($5 their seqs, $6 errors, $7 backoffs,
// $8 whether permanent; $9 the attempt budget) that no position has
// passed and no earlier record marked. A published one is marked done,
// so that reads leave it out, and noted in log_passes with no position;
// a failed one leaves the log for the outbox with its attempt counted,
// or is buried. The published are returned with no attempts.
const settleRowsSQL = `WITH c AS (
  SELECT seq, NULL::text AS err, 0::bigint AS backoff_ms, false AS dead FROM unnest($4::bigint[]) AS p(seq)
  UNION ALL
  SELECT * FROM unnest($5::bigint[], $6::text[], $7::bigint[], $8::boolean[])
), src AS (
  SELECT g.seq, g.id, g.topic, g.key, g.payload, g.headers, g.partition, g.created_at, c.err, c.backoff_ms,
    c.err IS NOT NULL AND (1 >= $9 OR c.dead) AS dies
  FROM c JOIN {p}log g ON g.partition = ANY($3::int[]) AND g.seq = c.seq
  JOIN {p}leases l ON l.partition = g.partition AND l.owner = $1 AND l.generation = ($2::bigint[])[l.partition + 1]
  JOIN {p}positions x ON x.partition = g.partition
  WHERE NOT pg_visible_in_snapshot(g.xid, x.lo)
    AND NOT (x.hi IS NOT NULL AND pg_visible_in_snapshot(g.xid, x.hi) AND g.seq <= x.band_cursor)
    AND NOT EXISTS (SELECT 1 FROM {p}log_done m WHERE m.partition = g.partition AND m.seq = g.seq)
), done AS (
  INSERT INTO {p}log_done (partition, seq) SELECT partition, seq FROM src WHERE err IS NULL
  ON CONFLICT DO NOTHING
  RETURNING partition, seq
), gone AS (
  DELETE FROM {p}log g USING src s
  WHERE s.err IS NOT NULL AND g.partition = s.partition AND g.seq = s.seq
  RETURNING g.partition, g.seq
), passes AS (
  INSERT INTO {p}log_passes (parts, lo, lo_seq, hi, cursors, topics, counts, oldest)
  SELECT '{}', '{}', '{}', '{}', '{}', array_agg(t.topic), array_agg(t.n), array_agg(t.oldest)
  FROM (SELECT s.topic, count(*)::int AS n, min(s.created_at) AS oldest
        FROM src s JOIN done USING (partition, seq) GROUP BY s.topic) t
  HAVING count(*) > 0
), copied AS (
  INSERT INTO {p}outbox (seq, id, topic, key, payload, headers, partition, created_at, attempts, last_error, available_at)
  OVERRIDING SYSTEM VALUE
  SELECT s.seq, s.id, s.topic, s.key, s.payload, s.headers, s.partition, s.created_at, 1, s.err,
    now() + s.backoff_ms * interval '1 millisecond'
  FROM src s JOIN gone USING (partition, seq) WHERE NOT s.dies
  ON CONFLICT DO NOTHING
  RETURNING seq, attempts
), buried AS (
  INSERT INTO {p}dead (seq, id, topic, key, payload, headers, partition, created_at, attempts, last_error)
  SELECT s.seq, s.id, s.topic, s.key, s.payload, s.headers, s.partition, s.created_at, 1, s.err
  FROM src s JOIN gone USING (partition, seq) WHERE s.dies
  ON CONFLICT (id) DO UPDATE SET seq = EXCLUDED.seq, topic = EXCLUDED.topic, key = EXCLUDED.key,
    payload = EXCLUDED.payload, headers = EXCLUDED.headers, partition = EXCLUDED.partition,
    created_at = EXCLUDED.created_at, attempts = EXCLUDED.attempts, last_error = EXCLUDED.last_error, dead_at = now()
  RETURNING seq, attempts
)
SELECT s.seq, 0, false FROM src s JOIN done USING (partition, seq) WHERE s.err IS NULL
UNION ALL
SELECT seq, attempts, false FROM copied
UNION ALL
SELECT seq, attempts, true FROM buried`

// settleRows records o's log rows one by one (settleRowsSQL): those of a
// read this process does not hold, or holds under another Outcome.Read.
// A failure listed twice counts once, the last one winning, as the
// outbox's Settle counts it.
func (s *logStore[T]) settleRows(ctx context.Context, f postboxdriver.Fence, o postboxdriver.Outcome, maxAttempts int) (postboxdriver.Settled, error) {
	var out postboxdriver.Settled
	parts := make([]int32, 0, len(f.Generations))
	for part := range f.Generations {
		parts = append(parts, int32(part))
	}
	last := make(map[int64]postboxdriver.Failure, len(o.Failed))
	var order []int64
	for _, fl := range o.Failed {
		if _, ok := last[fl.Seq]; !ok {
			order = append(order, fl.Seq)
		}
		last[fl.Seq] = fl
	}
	var fseq, fbackoff []int64
	var ferr []string
	var fdead []bool
	for _, seq := range order {
		fl := last[seq]
		fseq, ferr, fbackoff, fdead = append(fseq, seq), append(ferr, fl.Error), append(fbackoff, fl.Backoff.Milliseconds()), append(fdead, fl.Dead)
	}
	rs, err := s.db.Query(ctx, s.rowsSettle, f.Owner, pgsql.Generations(f), parts,
		nonNil(o.Published), nonNil(fseq), nonNil(ferr), nonNil(fbackoff), nonNil(fdead), maxAttempts)
	if err != nil {
		return out, err
	}
	defer rs.Close()
	for rs.Next() {
		var r postboxdriver.FailResult
		if err := rs.Scan(&r.Seq, &r.Attempts, &r.Dead); err != nil {
			return out, err
		}
		if r.Attempts == 0 && !r.Dead {
			out.Published++
			continue
		}
		out.Failed = append(out.Failed, r)
	}
	return out, rs.Err()
}

// settleLog moves the positions of br's partitions that this process
// still holds where br read them, and moves out br's log rows of those
// partitions that o did not publish.
func (s *logStore[T]) settleLog(ctx context.Context, f postboxdriver.Fence, br *bandRead, o postboxdriver.Outcome, maxAttempts int) (postboxdriver.Settled, error) {
	var out postboxdriver.Settled
	lr := s.claim(f, br, o, maxAttempts)
	if lr == nil {
		return out, nil
	}
	var moved []int
	defer func() { s.release(lr, moved) }()
	if len(lr.write) == 0 {
		// No row of its partitions read, none stored long ago: they move
		// in this process only.
		out.Published = s.moved(lr, nil)
		return out, nil
	}
	rs, err := s.db.Query(ctx, s.settle, lr.args...)
	if err != nil {
		return out, err
	}
	defer rs.Close()
	for rs.Next() {
		var n int64
		var attempts int
		var dead, sync bool
		if err := rs.Scan(&n, &attempts, &dead, &sync); err != nil {
			return out, err
		}
		if sync {
			moved = append(moved, int(n))
			continue
		}
		out.Failed = append(out.Failed, postboxdriver.FailResult{Seq: n, Attempts: attempts, Dead: dead})
	}
	if err := rs.Err(); err != nil {
		return out, err
	}
	out.Published = s.moved(lr, moved)
	return out, nil
}

// logRecord is a record of a read's log rows on its way: the read, the
// outcome, the partitions it moves, which this process holds for it
// (s.settling) until release, those of them whose positions it writes
// (the others move in this process only, storeEvery), the record's
// arguments (settleLogSQL's), the log rows it records as published, and
// the partitions due a note.
type logRecord struct {
	br    *bandRead
	o     postboxdriver.Outcome
	parts []int
	write []int
	args  []any
	done  int
	noted []int32
}

// claim prepares the record of br's log rows under f with o's outcome:
// of br's partitions, those this process still holds where br read them
// and no other record is moving. Of those it writes the positions of the
// partitions br read log rows of, and of those whose stored position is
// storeEvery old. It returns nil when it moves none.
func (s *logStore[T]) claim(f postboxdriver.Fence, br *bandRead, o postboxdriver.Outcome, maxAttempts int) *logRecord {
	touched := make(map[int]bool, len(br.touched))
	for _, part := range br.touched {
		touched[part] = true
	}
	now := time.Now()
	s.mu.Lock()
	var parts, write []int
	for part, base := range br.base {
		if s.settling[part] {
			continue // another read of the partition is being settled
		}
		if cur, ok := s.pos[part]; !ok || !cur.same(base) {
			continue // another read of the partition was settled since
		}
		parts = append(parts, part)
		s.settling[part] = true
		if touched[part] || now.Sub(s.stored[part]) >= storeEvery {
			write = append(write, part)
		}
	}
	s.mu.Unlock()
	if len(parts) == 0 {
		return nil
	}
	sort.Ints(parts)
	sort.Ints(write)
	k := len(write)
	ps, lo, loNext, hi, hiNext := make([]int32, k), make([]string, k), make([]string, k), make([]*string, k), make([]*string, k)
	loSeq, cur, bmax := make([]int64, k), make([]int64, k), make([]int64, k)
	moving := map[int]bool{}
	for i, part := range write {
		n := br.next[part]
		ps[i], lo[i], loNext[i], loSeq[i], hi[i], hiNext[i], cur[i], bmax[i] = int32(part), n.lo, n.loNext, n.loSeq, n.hi, n.hiNext, n.cursor, n.bandMax
		moving[part] = true
	}
	published := make(map[int64]bool, len(o.Published))
	for _, seq := range o.Published {
		published[seq] = true
	}
	failed := make(map[int64]postboxdriver.Failure, len(o.Failed))
	for _, fl := range o.Failed {
		failed[fl.Seq] = fl
	}
	var cseq, cbackoff []int64
	var cpart []int32
	var cerr []*string
	var cdead []bool
	var done int
	type partTopic struct {
		part  int
		topic string
	}
	type tally struct {
		n      int32
		oldest time.Time
	}
	sent := map[partTopic]tally{}
	for seq, lr := range br.logged {
		part := lr.part
		if !moving[part] {
			continue
		}
		if published[seq] {
			done++
			k := partTopic{part, lr.topic}
			t, ok := sent[k]
			if !ok || lr.created.Before(t.oldest) {
				t.oldest = lr.created
			}
			t.n++
			sent[k] = t
			continue
		}
		cseq, cpart = append(cseq, seq), append(cpart, int32(part))
		if fl, ok := failed[seq]; ok {
			e := fl.Error
			cerr, cbackoff, cdead = append(cerr, &e), append(cbackoff, fl.Backoff.Milliseconds()), append(cdead, fl.Dead)
		} else {
			cerr, cbackoff, cdead = append(cerr, nil), append(cbackoff, 0), append(cdead, false)
		}
	}
	noted := s.dueNotes(br.touched, moving)
	tparts, topics, counts, oldest := make([]int32, 0, len(sent)), make([]string, 0, len(sent)), make([]int32, 0, len(sent)), make([]time.Time, 0, len(sent))
	for k, t := range sent {
		tparts, topics, counts, oldest = append(tparts, int32(k.part)), append(topics, k.topic), append(counts, t.n), append(oldest, t.oldest)
	}
	return &logRecord{br: br, o: o, parts: parts, write: write, done: done, noted: noted, args: []any{
		f.Owner, pgsql.Generations(f), ps, lo, loNext, loSeq, hi, hiNext, cur, bmax,
		nonNil(cseq), nonNil(cpart), nonNil(cerr), nonNil(cbackoff), nonNil(cdead), maxAttempts,
		noted, tparts, topics, counts, oldest,
	}}
}

// moved takes the positions of the partitions the record lr moved as
// this process's: those it wrote whose lease held (moved), and those it
// did not write. It returns how many of its log rows it recorded as
// published: all of them, or where some lease moved on, those of the
// partitions moved.
func (s *logStore[T]) moved(lr *logRecord, moved []int) int {
	now := time.Now()
	s.mu.Lock()
	for _, part := range moved {
		s.pos[part] = lr.br.next[part]
		s.stored[part] = now
	}
	for _, part := range lr.parts {
		if !slices.Contains(lr.write, part) {
			s.pos[part] = lr.br.next[part]
		}
	}
	s.mu.Unlock()
	if len(moved) == len(lr.write) {
		return lr.done
	}
	held := map[int]bool{}
	for _, part := range moved {
		held[part] = true
	}
	n := 0
	for _, seq := range lr.o.Published {
		if r, ok := lr.br.logged[seq]; ok && held[r.part] {
			n++
		}
	}
	return n
}

// release ends the record lr, which moved the partitions moved: its
// partitions are free to settle again, and those it was to note and did
// not move are owed a note again.
func (s *logStore[T]) release(lr *logRecord, moved []int) {
	s.unnoted(lr.noted, moved)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, part := range lr.parts {
		delete(s.settling, part)
	}
}

// dueNotes returns the partitions whose positions a record moving the
// partitions moving notes: those of touched (it passed rows of them) and
// those owed a note, where this process has not noted them for
// noteEvery. The other partitions of touched are owed one. It takes them
// as noted now.
func (s *logStore[T]) dueNotes(touched []int, moving map[int]bool) []int32 {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, part := range touched {
		s.owed[part] = true
	}
	out := []int32{}
	for part := range s.owed {
		if moving[part] && now.Sub(s.noted[part]) >= noteEvery {
			out = append(out, int32(part))
			s.noted[part] = now
			delete(s.owed, part)
		}
	}
	return out
}

// unnoted owes again a note of the partitions of noted that a record did
// not move (moved): it wrote no note of them.
func (s *logStore[T]) unnoted(noted []int32, moved []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, part := range noted {
		if !slices.Contains(moved, int(part)) {
			s.owed[int(part)] = true
			delete(s.noted, int(part))
		}
	}
}

// noteSQL notes the positions of the partitions $1 as they stand, at a
// time taken after the statement's snapshot: every record it sees had
// committed by then.
const noteSQL = `INSERT INTO {p}log_passes (at, parts, lo, lo_seq, hi, cursors, topics, counts, oldest)
SELECT clock_timestamp(), array_agg(partition), array_agg(lo::text), array_agg(lo_seq), array_agg(hi::text),
  array_agg(band_cursor), '{}', '{}', '{}'
FROM {p}positions WHERE partition = ANY($1::int[])
HAVING count(*) > 0`

// payNotes notes the positions of the fenced partitions owed a note
// whose time has come, for a read that found nothing: with no record to
// ride, an idle relay's last rows would otherwise have no publish time.
func (s *logStore[T]) payNotes(ctx context.Context, f postboxdriver.Fence) error {
	fenced := make(map[int]bool, len(f.Generations))
	for part := range f.Generations {
		fenced[part] = true
	}
	s.mu.Lock()
	n := len(s.owed)
	s.mu.Unlock()
	if n == 0 {
		return nil
	}
	parts := s.dueNotes(nil, fenced)
	if len(parts) == 0 {
		return nil
	}
	_, err := s.db.Exec(ctx, s.note, parts)
	if err != nil {
		s.unnoted(parts, nil)
	}
	return err
}

// nonNil is xs, or an empty slice for nil: the statements bind arrays.
func nonNil[T any](xs []T) []T {
	if xs == nil {
		return []T{}
	}
	return xs
}

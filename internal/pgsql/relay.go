package pgsql

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

type queries struct {
	insert, insertOne, partitions, coordinate, unregister, acquire, release, fetch, fetchStrict, fetchRouted, fetchRoutedStrict,
	settle, resolveCrashes, markInFlight, expire, stats string
	// The database's storage setting (storage.go).
	checkStorage, storageState, lockStorage, switchStorage string
	// settleFetch are the fetches as settleFetchSQL makes them, indexed
	// like fetchVariant.
	settleFetch [4]string
}

func makeQueries(p string) queries {
	r := strings.NewReplacer("{p}", p)
	return queries{
		// The writer supplies the partition (PartitionOf, the value the
		// table's trigger computes for other writers) and so skips the
		// trigger: its rows were held to the same rules in Go (migration
		// 11). One row, the usual WriteTx, is a plain VALUES: unnest's
		// function scan costs a one-row statement a fifth more.
		insert: r.Replace(`INSERT INTO {p}outbox (id, topic, key, payload, headers, partition)
SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bytea[], $5::jsonb[], $6::int[])`),
		insertOne: r.Replace(`INSERT INTO {p}outbox (id, topic, key, payload, headers, partition)
VALUES ($1::uuid, $2::text, $3::text, $4::bytea, $5::jsonb, $6::int)`),
		partitions: r.Replace(`SELECT count(*) FROM {p}leases`),
		// One round trip: the heartbeat, the releases, the takes and
		// renewals, and the membership after them. The data-modifying CTEs
		// see the tables as they were before the statement, so the lease
		// rows returned are the updated ones where the statement changed
		// them and the old ones elsewhere; want and drop are disjoint, so
		// no row is changed twice. A lease never taken expires at
		// -infinity, which no time.Time holds: it is reported as the epoch.
		// SET reads the row as it was, so crashed records whether the
		// lease was taken from another owner, which the WHERE allows only
		// once its lease ran out (a released lease has no owner, and keeps
		// the mark its last owner left: unsettled, it passes on); $5 are
		// the partitions whose marks the caller settled.
		//
		// A relay registered anew (its heartbeat inserted, not updated:
		// xmax is 0), leases freed, or a relay leaving (ttl 0) are
		// announced on the change signals' channel ($6, payload $7), so
		// that listening relays renew at once; a plain renewal announces
		// nothing. The announce CTE is a SELECT, which runs only where it
		// is read: the heartbeat's row reads it.
		//
		// The heartbeat registers what the relay reads ($8, table or log)
		// and is refused, with no row, for a relay over the table while
		// the database says log (migration 13): such a relay then renews
		// and takes no lease, and Coordinate returns ErrStorageRefused. It
		// may still let leases go. A switch (SwitchStorage) locks the
		// storage table, which the statement reads, and PostgreSQL takes
		// a statement's locks before its snapshot, so a heartbeat reads
		// the setting as the switch committed it.
		coordinate: r.Replace(`WITH beat AS (
  INSERT INTO {p}relays (id, expires_at, storage)
  SELECT $1, now() + $2 * interval '1 millisecond', $8
  WHERE $8 = 'log' OR (SELECT storage FROM {p}storage) IS DISTINCT FROM 'log'
  ON CONFLICT (id) DO UPDATE SET expires_at = EXCLUDED.expires_at, storage = EXCLUDED.storage
  RETURNING id, xmax = 0 AS joined
), announce AS (
  SELECT pg_notify($6, $7) FROM beat WHERE beat.joined OR $2 = 0 OR cardinality($4::int[]) > 0
), released AS (
  UPDATE {p}leases SET owner = NULL, expires_at = now(), crashed = crashed AND NOT (partition = ANY($5::int[]))
  WHERE owner = $1 AND partition = ANY($4::int[])
  RETURNING partition, crashed
), taken AS (
  UPDATE {p}leases SET
    generation = CASE WHEN owner IS NOT DISTINCT FROM $1 THEN generation ELSE generation + 1 END,
    crashed = CASE WHEN owner IS NOT DISTINCT FROM $1 THEN crashed AND NOT (partition = ANY($5::int[])) ELSE owner IS NOT NULL OR crashed END,
    owner = $1,
    expires_at = now() + $2 * interval '1 millisecond'
  WHERE partition = ANY($3::int[]) AND NOT (partition = ANY($4::int[]))
    AND (owner IS NULL OR owner = $1 OR expires_at <= now()) AND EXISTS (SELECT 1 FROM beat)
  RETURNING partition, owner, generation, expires_at, crashed
)
SELECT -1, id, (SELECT count(*) FROM announce), now(), false, false FROM beat
UNION ALL
SELECT -1, id, 0, now(), false, false FROM {p}relays WHERE expires_at > now() AND id <> $1
UNION ALL
SELECT l.partition,
  coalesce(t.owner, CASE WHEN r.partition IS NULL THEN l.owner END, ''),
  coalesce(t.generation, l.generation),
  greatest(coalesce(t.expires_at, CASE WHEN r.partition IS NULL THEN l.expires_at END, now()), 'epoch'),
  t.partition IS NULL AND (r.partition IS NOT NULL OR l.expires_at <= now()),
  coalesce(t.crashed, r.crashed, l.crashed)
FROM {p}leases l LEFT JOIN taken t USING (partition) LEFT JOIN released r USING (partition)`),
		checkStorage:  r.Replace(checkStorageSQL),
		storageState:  r.Replace(storageStateSQL),
		lockStorage:   r.Replace(`LOCK TABLE {p}storage IN ACCESS EXCLUSIVE MODE`),
		switchStorage: r.Replace(`UPDATE {p}storage SET storage = $1, changed_at = now()`),
		unregister:    r.Replace(`DELETE FROM {p}relays WHERE id = $1 OR expires_at < now() - interval '1 hour'`),
		acquire: r.Replace(`UPDATE {p}leases SET
  generation = CASE WHEN owner IS NOT DISTINCT FROM $1 THEN generation ELSE generation + 1 END,
  crashed = CASE WHEN owner IS NOT DISTINCT FROM $1 THEN crashed ELSE owner IS NOT NULL OR crashed END,
  owner = $1,
  expires_at = now() + $3 * interval '1 millisecond'
WHERE partition = ANY($2::int[]) AND (owner IS NULL OR owner = $1 OR expires_at <= now())
RETURNING partition, owner, generation, expires_at`),
		release:           r.Replace(`UPDATE {p}leases SET owner = NULL, expires_at = now() WHERE owner = $1 AND partition = ANY($2::int[])`),
		fetch:             r.Replace(fetchSQL(false, false)),
		fetchStrict:       r.Replace(fetchSQL(true, false)),
		fetchRouted:       r.Replace(fetchSQL(false, true)),
		fetchRoutedStrict: r.Replace(fetchSQL(true, true)),
		settleFetch: [4]string{
			r.Replace(settleFetchSQL(false, false)), r.Replace(settleFetchSQL(true, false)),
			r.Replace(settleFetchSQL(false, true)), r.Replace(settleFetchSQL(true, true)),
		},
		// A batch's outcome in one statement ($1 the owner, $2 the
		// generations by partition, $3 the published seqs; $4–$7 the
		// failures: seqs, errors, backoffs in ms, dead; $8 the attempt
		// budget). The published and failed seqs are disjoint, so no row
		// is changed twice.
		//
		// The fence: the row's partition lease must still be the owner's, at
		// the generation the owner read it under. A relay whose lease moved
		// on matches no row and changes nothing.
		//
		// Published rows move to the history. Failed rows that reach the
		// budget move to the dead table; the others wait for their backoff.
		// A failure marked dead (permanent) dies whatever its attempts. A
		// dead message of the same id, an id written again after its first
		// message died, is replaced: a conflict would fail the whole
		// statement, and with it the record of every other row of the batch.
		//
		// The statement commits without waiting for its WAL flush
		// (synchronous_commit off, for this transaction only): an outcome
		// lost in a database crash leaves its rows pending, and they are sent
		// again under the same ids, which consumers absorb (a lost failure
		// costs one attempt more). Since the WAL is replayed in order, what
		// a crash loses is a suffix of the outcomes, so first copies stay in
		// key order. This takes a disk flush out of every relay cycle. The
		// first row, whose seq is NULL, counts the published rows; it is
		// a SELECT of its own so that the setting is made whatever moved.
		settle: r.Replace(`WITH ` + strings.NewReplacer("$o", "$1", "$g", "$2", "$s", "$3").Replace(moveToHistory) + `, f AS (
  SELECT * FROM unnest($4::bigint[], $5::text[], $6::bigint[], $7::boolean[]) AS f(seq, err, backoff_ms, dead)
), owned AS (
  SELECT o.seq, (o.attempts + 1 >= $8 OR f.dead) AS dies FROM {p}outbox o JOIN f ON f.seq = o.seq JOIN {p}leases l
    ON l.partition = o.partition AND l.owner = $1 AND l.generation = ($2::bigint[])[o.partition + 1]
), died AS (
  DELETE FROM {p}outbox o USING owned, f
  WHERE owned.dies AND o.seq = owned.seq AND f.seq = o.seq
  RETURNING o.seq, o.id, o.topic, o.key, o.payload, o.headers, o.partition, o.created_at, o.attempts + 1 AS attempts, f.err
), buried AS (
  INSERT INTO {p}dead (seq, id, topic, key, payload, headers, partition, created_at, attempts, last_error)
  SELECT * FROM died
  ON CONFLICT (id) DO UPDATE SET seq = EXCLUDED.seq, topic = EXCLUDED.topic, key = EXCLUDED.key,
    payload = EXCLUDED.payload, headers = EXCLUDED.headers, partition = EXCLUDED.partition,
    created_at = EXCLUDED.created_at, attempts = EXCLUDED.attempts, last_error = EXCLUDED.last_error, dead_at = now()
  RETURNING seq, attempts
), retried AS (
  UPDATE {p}outbox o SET attempts = o.attempts + 1, last_error = f.err,
    available_at = now() + f.backoff_ms * interval '1 millisecond', inflight = 0
  FROM owned, f
  WHERE NOT owned.dies AND o.seq = owned.seq AND f.seq = o.seq
  RETURNING o.seq, o.attempts
)
SELECT NULL::bigint, (SELECT count(*) FROM ins)::int, set_config('synchronous_commit', 'off', true) = 'off'
UNION ALL
SELECT seq, attempts, true FROM buried
UNION ALL
SELECT seq, attempts, false FROM retried`),
		// A relay that took the rows' partition after an expiry reads
		// their crash marks before publishing them: a row in flight alone
		// when its relay died counts a crash, a row in flight with others
		// becomes a suspect; a mark whose relay is live again (it was
		// paused or cut off, not dead) is cleared. Only marked rows are written; the rows
		// counted before are read as they are (the CTE's update is not
		// visible to the outer SELECT, which therefore takes the marked
		// rows from the update's RETURNING and the others from the table).
		resolveCrashes: r.Replace(`WITH marked AS (
  SELECT o.seq, EXISTS (SELECT 1 FROM {p}relays r WHERE r.id = o.inflight_by AND r.expires_at > now()) AS live
  FROM {p}outbox o JOIN {p}leases l
    ON l.partition = o.partition AND l.owner = $1 AND l.generation = ($3::bigint[])[o.partition + 1]
  WHERE o.seq = ANY($2::bigint[]) AND o.inflight IN (1, 2)
), resolved AS (
  UPDATE {p}outbox o SET crashes = o.crashes + (o.inflight = 2 AND NOT m.live)::int,
    inflight = CASE WHEN m.live THEN 0 ELSE 3 END
  FROM marked m WHERE o.seq = m.seq
  RETURNING o.seq, o.crashes, o.inflight
)
SELECT seq, crashes FROM resolved WHERE inflight = 3 OR crashes > 0
UNION ALL
SELECT o.seq, o.crashes FROM {p}outbox o
WHERE o.seq = ANY($2::bigint[]) AND (o.inflight = 3 OR (o.inflight = 0 AND o.crashes > 0))
ORDER BY 1`),
		// The mark must be committed before the publish it marks starts,
		// but a process crash keeps a commit whose WAL is not flushed yet;
		// what a database crash loses is only a crash left uncounted.
		// The marks are fenced, the clears are not (Executor.MarkInFlight).
		markInFlight: r.Replace(`WITH marked AS (
  UPDATE {p}outbox o SET inflight = $4, inflight_by = $1
  FROM {p}leases l
  WHERE o.seq = ANY($2::bigint[])
    AND l.partition = o.partition AND l.owner = $1 AND l.generation = ($3::bigint[])[o.partition + 1]
  RETURNING 1
), cleared AS (
  UPDATE {p}outbox o SET inflight = 0
  WHERE o.seq = ANY($5::bigint[]) AND NOT (o.seq = ANY($2::bigint[])) AND o.inflight <> 0
  RETURNING 1
)
SELECT (SELECT count(*) FROM marked) + (SELECT count(*) FROM cleared)
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async`),
		expire: r.Replace(`UPDATE {p}leases SET owner = $1, generation = generation + 1, expires_at = now() - interval '1 second'`),
		stats: strings.NewReplacer("{n}", strconv.Itoa(postboxdriver.StatsExactUpTo),
			"{n1}", strconv.Itoa(postboxdriver.StatsExactUpTo+1)).Replace(r.Replace(statsSQL)),
	}
}

// statsSQL is Stats: the pending and published rows counted up to one
// past postboxdriver.StatsExactUpTo, and past that the
// planner's estimate, as it scales the table's statistics (rows a page at
// the last ANALYZE or VACUUM) to the table's pages now, never below the
// count's floor. A table with no statistics yet is counted whole: the
// CASE runs that count only then. Counted whole, a history of a million
// rows cost PostgreSQL 250–390 ms of CPU a call, on the dashboard's every
// refresh (BENCHMARKS.md, "The status at any size").
const statsSQL = `WITH n AS (
  SELECT
    (SELECT count(*) FROM (SELECT FROM {p}outbox LIMIT {n1}) x) AS pending,
    (SELECT count(*) FROM (SELECT FROM {p}published LIMIT {n1}) x) AS published,
    ` + estimateSQL + `('{p}outbox'::regclass)) AS pending_est,
    ` + estimateSQL + `('{p}published'::regclass)) AS published_est
)
SELECT
  CASE WHEN pending <= {n} THEN pending ELSE coalesce(pending_est, (SELECT count(*) FROM {p}outbox)) END,
  (SELECT count(*) FROM {p}dead),
  coalesce((SELECT extract(epoch FROM now() - created_at) FROM {p}outbox ORDER BY seq LIMIT 1), 0)::float8,
  CASE WHEN published <= {n} THEN published ELSE coalesce(published_est, (SELECT count(*) FROM {p}published)) END,
  pending > {n} AND pending_est IS NOT NULL,
  published > {n} AND published_est IS NOT NULL
FROM n`

// estimateSQL, closed by a table's oid and ")", is the planner's estimate
// of the table's rows, at least that floor; null where the table has no
// statistics.
const estimateSQL = `(SELECT greatest({n1}, (c.reltuples / c.relpages *
      (pg_relation_size(c.oid) / current_setting('block_size')::bigint))::bigint)
    FROM pg_class c WHERE c.reltuples >= 0 AND c.relpages > 0 AND c.oid = `

// moveToHistory is the CTEs that move a batch's published rows ($s) to
// the history, fenced by the owner ($o) and its generations by partition
// ($g): settle's and settleFetchSQL's, which number the parameters.
// ins counts the rows moved.
const moveToHistory = `moved AS (
  DELETE FROM {p}outbox o USING {p}leases l
  WHERE o.seq = ANY($s::bigint[])
    AND l.partition = o.partition AND l.owner = $o AND l.generation = ($g::bigint[])[o.partition + 1]
  RETURNING o.seq, o.id, o.topic, o.key, o.payload, o.headers, o.partition, o.created_at, o.attempts
), ins AS (
  INSERT INTO {p}published (seq, id, topic, key, payload, headers, partition, created_at, attempts)
  SELECT * FROM moved
  RETURNING 1
)`

// fetchSQL reads pending rows in seq order. A row that never failed is
// due at once; only a retry waits for its available_at. A fresh row's
// available_at is its writer's now(), when its transaction began, which
// for a key's later row, whose writer began first and waited on the key's
// lock, is earlier than for the row before it: a read whose statement
// began between the two writers' starts and took its snapshot after both
// commits found the later row due and the earlier one not yet, and
// published them out of order. A keyed row is held back while
// an older row of its key waits for a retry (or is dead, when strict):
// only rows that failed before can do that, and the partial retry index
// holds exactly those. Whether it holds any is asked once per statement
// (an uncorrelated EXISTS, which PostgreSQL runs once, before the AND
// that it guards), so while nothing fails no row probes the index: a
// probe per row cost a 500-row read a fifth of its time. The dead
// messages' key index is asked the same way.
//
// Routed, it reads only the topics matching $3 (LIKE patterns), and a
// keyed row is also held back by an older row of its key that no route
// matches: such a row waits for a relay that knows its topic, and its key
// waits with it. Finding those rows scans the fenced partitions' pending
// rows once per read, a cost paid only when routes are set.
func fetchSQL(strict, routed bool) string {
	with, read := fetchParts(strict, routed)
	if with != "" {
		with = "WITH " + with + "\n"
	}
	return with + strings.Replace(read, "{exclude}", "", 1)
}

// settleFetchSQL records the publishes of a batch and reads the next one
// in one statement (Core.SettleFetch): the fetch of fetchSQL, with the
// published rows moved to the history as settle moves them, fenced by
// the generations the batch was read under ($o the owner, $g the
// generations by partition, $s the published seqs, numbered after the
// fetch's own parameters). The read's snapshot is the statement's, taken
// before the move, so it leaves the moved rows out by their seqs; and it
// returns nothing when the fence refused any of them, since the relay then
// renews before it reads (its view of what it holds is stale). The first
// column of every row is the count of rows moved; a read that finds
// nothing returns one row of NULLs beside it. The statement commits
// without waiting for its WAL flush, as settle does.
func settleFetchSQL(strict, routed bool) string {
	with, read := fetchParts(strict, routed)
	n := 2
	if routed {
		n = 3
	}
	params := strings.NewReplacer("$o", fmt.Sprintf("$%d", n+1), "$g", fmt.Sprintf("$%d", n+2), "$s", fmt.Sprintf("$%d", n+3))
	if with != "" {
		with += ",\n"
	}
	read = strings.Replace(read, "{exclude}", `
  AND NOT (o.seq = ANY($s::bigint[]))`, 1)
	return params.Replace(`WITH ` + with + moveToHistory + `, settled AS (
  SELECT count(*)::int AS n, set_config('synchronous_commit', 'off', true) AS async FROM ins
), next AS (
` + read + `
)
SELECT s.n, x.* FROM settled s LEFT JOIN next x ON s.n = cardinality($s::bigint[]) ORDER BY x.seq`)
}

// fetchParts is fetchSQL as its CTE (routed only, else "") and its
// SELECT, so that settleFetchSQL can put its own CTEs beside them.
func fetchParts(strict, routed bool) (with, read string) {
	var topic, unrouted, dead string
	if strict {
		dead = `
    OR ` + BehindDead("o")
	}
	if routed {
		with = UnroutedKeys("$1", "$3")
		topic = `
  AND o.topic LIKE ANY($3::text[])`
		unrouted = `
    OR ` + BehindUnrouted("o")
	}
	return with, `SELECT o.seq, o.id::text, o.topic, coalesce(o.key, ''), o.payload, o.headers::text, o.partition, o.attempts, o.created_at
FROM {p}outbox o
WHERE o.partition = ANY($1::int[])
  AND (o.attempts = 0 OR o.available_at <= now())` + topic + `{exclude}
  AND (o.key IS NULL OR NOT (
    EXISTS (SELECT 1 FROM {p}outbox r WHERE r.attempts > 0 AND r.key IS NOT NULL)
    AND EXISTS (SELECT 1 FROM {p}outbox b
                WHERE b.key = o.key AND b.seq < o.seq AND b.attempts > 0 AND b.available_at > now())` + dead + unrouted + `))
ORDER BY o.seq
LIMIT $2`
}

// BehindDead is a strict read's test that the row alias has an older
// dead message of its key (the row's key not NULL), which holds it back.
// The first EXISTS, one probe a statement, spares the per-row probe while
// no keyed message is dead.
func BehindDead(alias string) string {
	return `EXISTS (SELECT 1 FROM {p}dead d0 WHERE d0.key IS NOT NULL)
       AND EXISTS (SELECT 1 FROM {p}dead d WHERE d.key = ` + alias + `.key AND d.seq < ` + alias + `.seq)`
}

// UnroutedKeys is a routed read's CTE "unrouted": for the partitions of
// parts, the keys whose pending rows include one of a topic that no
// pattern of topics (LIKE patterns) matches, with the oldest such seq.
func UnroutedKeys(parts, topics string) string {
	return `unrouted AS (
  SELECT key, min(seq) AS seq FROM {p}outbox
  WHERE key IS NOT NULL AND partition = ANY(` + parts + `::int[]) AND NOT (topic LIKE ANY(` + topics + `::text[]))
  GROUP BY key
)`
}

// BehindUnrouted is a routed read's test that the row alias has an older
// row of its key in UnroutedKeys, which holds it back.
func BehindUnrouted(alias string) string {
	return `EXISTS (SELECT 1 FROM unrouted u WHERE u.key = ` + alias + `.key AND u.seq < ` + alias + `.seq)`
}

// FetchStatement is the relay's default fetch (no routes, not strict) for
// the tables named with prefix: $1 the partitions (int[]), $2 the limit.
// Benchmarks EXPLAIN it; the relay runs it through Core.Fetch.
func FetchStatement(prefix string) string {
	return strings.ReplaceAll(fetchSQL(false, false), "{p}", prefix)
}

// LikePatterns turns topic patterns ("orders.created", "orders.*", "*")
// into LIKE patterns; topics hold no % or \, but may hold _.
func LikePatterns(ps []string) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		lit, wild := strings.CutSuffix(p, "*")
		lit = strings.ReplaceAll(lit, "_", `\_`)
		if wild {
			lit += "%"
		}
		out[i] = lit
	}
	return out
}

// Insert implements postboxdriver.Executor, with one statement.
func (c *Core) Insert(ctx context.Context, rows []postboxdriver.Row) error {
	return c.InsertRows(ctx, c.q.insert, c.q.insertOne, rows)
}

// InsertArrays are the arrays the many-row insert binds for rows, in its
// parameters' order (ids, topics, keys, payloads, headers, partitions),
// and the set of the rows' partitions as bits.
func InsertArrays(rows []postboxdriver.Row) ([]any, uint64) {
	n := len(rows)
	ids, topics, payloads, headers := make([]string, n), make([]string, n), make([][]byte, n), make([]string, n)
	keys, parts := make([]*string, n), make([]int32, n)
	var written uint64
	for i := range rows {
		r := &rows[i]
		ids[i], topics[i], payloads[i], headers[i] = r.ID, r.Topic, notNil(r.Payload), string(r.Headers)
		keys[i] = nullable(r.Key)
		p := postboxdriver.PartitionOf(r.Key, r.ID, Partitions)
		parts[i] = int32(p)
		written |= 1 << p
	}
	return []any{ids, topics, keys, payloads, headers, parts}, written
}

// Deferrer is a transaction's Querier that can send the outbox insert in
// the same round trip as its COMMIT (postboxpgx.Begin): Insert offers it the
// statement, which the transaction's commit runs if Defer took it.
type Deferrer interface {
	Defer(sql string, args ...any) bool
}

// CommitHooker is a transaction's Querier that can run a function after
// its transaction commits (postboxpgx.Begin's Tx).
type CommitHooker interface {
	OnCommit(fn func()) bool
}

// AfterCommit implements postboxdriver.AfterCommitter for an Executor made
// for a transaction whose Querier is a CommitHooker.
func (c *Core) AfterCommit(fn func()) bool {
	if t, ok := c.db.(InTx); ok {
		if h, ok := t.Querier.(CommitHooker); ok {
			return h.OnCommit(fn)
		}
	}
	return false
}

// InsertRows inserts rows as Insert inserts into the outbox (in a
// postboxpgx.Tx, with the COMMIT), with many, an insert that takes
// InsertArrays' arrays, or for a single row, the usual write, with one,
// the same insert over the row's six values in the arrays' order: binding
// arrays and reading them back through unnest costs a one-row write's
// client and server more than the row's values do (BENCHMARKS.md, "The
// log's writer binds one row's values").
func (c *Core) InsertRows(ctx context.Context, many, one string, rows []postboxdriver.Row) error {
	if len(rows) == 1 {
		r := &rows[0]
		p := postboxdriver.PartitionOf(r.Key, r.ID, Partitions)
		c.written.Or(1 << p)
		return c.insert(ctx, one, r.ID, r.Topic, nullable(r.Key), notNil(r.Payload), string(r.Headers), int32(p))
	}
	args, written := InsertArrays(rows)
	c.written.Or(written)
	return c.insert(ctx, many, args...)
}

func (c *Core) insert(ctx context.Context, sql string, args ...any) error {
	if t, ok := c.db.(InTx); ok {
		if d, ok := t.Querier.(Deferrer); ok && d.Defer(sql, args...) {
			return nil
		}
	}
	_, err := c.exec(ctx, sql, args...)
	return err
}

// Partitions is the number of partitions the tables are made with
// (migration 1's leases and partition formula).
const Partitions = 64

// nullable is a key as the statements bind it: "" is NULL.
func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// notNil is a payload as the statements bind it: NOT NULL, empty for nil.
func notNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// Partitions implements postboxdriver.Executor.
func (c *Core) Partitions(ctx context.Context) (int, error) {
	return c.count(ctx, c.q.partitions)
}

// Coordinate implements postboxdriver.Executor.
func (c *Core) Coordinate(ctx context.Context, relayID string, ttl time.Duration, want, drop, settled []int) (postboxdriver.Membership, error) {
	var m postboxdriver.Membership
	rows, err := queryAll(ctx, c, c.q.coordinate, []any{relayID, ttl.Milliseconds(), int32s(want), int32s(drop), int32s(settled), Channel(c.prefix), c.signalID + " " + signalRelays, c.relayStorage()}, func(r Rows) (postboxdriver.Lease, error) {
		var l postboxdriver.Lease
		err := r.Scan(&l.Partition, &l.Owner, &l.Generation, &l.ExpiresAt, &l.Expired, &l.Crashed)
		return l, err
	})
	if err != nil {
		return m, err
	}
	for _, l := range rows {
		if l.Partition < 0 {
			m.Live, m.Now = append(m.Live, l.Owner), l.ExpiresAt
			continue
		}
		m.Leases = append(m.Leases, l)
	}
	sort.Strings(m.Live)
	sort.Slice(m.Leases, func(i, j int) bool { return m.Leases[i].Partition < m.Leases[j].Partition })
	// Only the storage setting refuses a heartbeat; a relay leaving (ttl
	// 0) has let its leases go all the same.
	if i := sort.SearchStrings(m.Live, relayID); ttl > 0 && (i == len(m.Live) || m.Live[i] != relayID) {
		return m, c.refusedTable(relayID, time.Time{})
	}
	return m, nil
}

// Unregister implements postboxdriver.Executor.
func (c *Core) Unregister(ctx context.Context, relayID string) error {
	_, err := c.exec(ctx, c.q.unregister, relayID)
	return err
}

// AcquireLeases implements postboxdriver.Executor.
func (c *Core) AcquireLeases(ctx context.Context, owner string, partitions []int, ttl time.Duration) ([]postboxdriver.Lease, error) {
	out, err := queryAll(ctx, c, c.q.acquire, []any{owner, int32s(partitions), ttl.Milliseconds()}, func(r Rows) (postboxdriver.Lease, error) {
		var l postboxdriver.Lease
		err := r.Scan(&l.Partition, &l.Owner, &l.Generation, &l.ExpiresAt)
		return l, err
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Partition < out[j].Partition })
	return out, err
}

// ReleaseLeases implements postboxdriver.Executor.
func (c *Core) ReleaseLeases(ctx context.Context, owner string, partitions []int) error {
	_, err := c.exec(ctx, c.q.release, owner, int32s(partitions))
	return err
}

// ExpireLeases implements postboxdriver.Executor.
func (c *Core) ExpireLeases(ctx context.Context, owner string) (int, error) {
	n, err := c.exec(ctx, c.q.expire, owner)
	return int(n), err
}

// Fetch implements postboxdriver.Executor.
func (c *Core) Fetch(ctx context.Context, p postboxdriver.FetchParams) ([]postboxdriver.Record, error) {
	v, args := fetchArgs(p)
	if v < 0 {
		return nil, nil
	}
	q := [4]string{c.q.fetch, c.q.fetchStrict, c.q.fetchRouted, c.q.fetchRoutedStrict}[v]
	return queryAll(ctx, c, q, args, func(r Rows) (postboxdriver.Record, error) {
		var rec postboxdriver.Record
		err := scanRecord(r, &rec)
		return rec, err
	})
}

// fetchArgs picks the fetch statement for p, as an index into fetch,
// fetchStrict, fetchRouted and fetchRoutedStrict (-1 when p reads
// nothing), and its arguments.
func fetchArgs(p postboxdriver.FetchParams) (int, []any) {
	parts := make([]int32, 0, len(p.Fence.Generations))
	for part := range p.Fence.Generations {
		parts = append(parts, int32(part))
	}
	if len(parts) == 0 || p.Limit <= 0 || p.Topics != nil && len(p.Topics) == 0 {
		return -1, nil
	}
	args := []any{parts, p.Limit}
	v := 0
	if p.BlockOnDead {
		v = 1
	}
	if p.Topics != nil {
		v += 2
		args = append(args, LikePatterns(p.Topics))
	}
	return v, args
}

func scanRecord(r Rows, rec *postboxdriver.Record) error {
	var headers string
	err := r.Scan(&rec.Seq, &rec.ID, &rec.Topic, &rec.Key, &rec.Payload, &headers, &rec.Partition, &rec.Attempts, &rec.CreatedAt)
	rec.Headers = []byte(headers)
	return err
}

// SettleFetch implements postboxdriver.SettleFetcher, in one statement.
func (c *Core) SettleFetch(ctx context.Context, f postboxdriver.Fence, o postboxdriver.Outcome, maxAttempts int, p postboxdriver.FetchParams) (postboxdriver.Settled, []postboxdriver.Record, error) {
	if len(o.Failed) > 0 {
		return postboxdriver.Settled{}, nil, fmt.Errorf("postbox: SettleFetch records publishes only, and was given %d failures", len(o.Failed))
	}
	v, args := fetchArgs(p)
	if v < 0 || len(o.Published) == 0 {
		settled, err := c.Settle(ctx, f, o, maxAttempts)
		if err != nil || v < 0 {
			return settled, nil, err
		}
		recs, err := c.Fetch(ctx, p)
		return settled, recs, err
	}
	var settled postboxdriver.Settled
	var recs []postboxdriver.Record
	rows, err := c.db.Query(ctx, c.q.settleFetch[v], append(args, f.Owner, Generations(f), o.Published)...)
	if err != nil {
		return settled, nil, c.wrap(err)
	}
	// The read's columns are NULL on the one row a read that found
	// nothing returns.
	err = scanAll(rows, func(r Rows) error {
		var seq *int64
		var rec postboxdriver.Record
		var headers *string
		var id, topic, key *string
		var part, attempts *int
		var created *time.Time
		if err := r.Scan(&settled.Published, &seq, &id, &topic, &key, &rec.Payload, &headers, &part, &attempts, &created); err != nil || seq == nil {
			return err
		}
		rec.Seq, rec.ID, rec.Topic, rec.Key, rec.Headers = *seq, *id, *topic, *key, []byte(*headers)
		rec.Partition, rec.Attempts, rec.CreatedAt = *part, *attempts, *created
		recs = append(recs, rec)
		return nil
	})
	if err != nil {
		return postboxdriver.Settled{}, nil, c.wrap(err)
	}
	return settled, recs, nil
}

// OldestSnapshot implements postboxdriver.Executor: the oldest
// transaction of another backend that holds a snapshot. Without
// pg_read_all_stats, only the same role's backends are seen. The age is
// taken on clock_timestamp(): now() is this statement's transaction start,
// which another transaction may have started after.
func (c *Core) OldestSnapshot(ctx context.Context) (postboxdriver.Snapshot, bool, error) {
	out, err := queryAll(ctx, c, `SELECT extract(epoch FROM clock_timestamp() - xact_start)::float8, pid, coalesce(state, '')
FROM pg_stat_activity
WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
ORDER BY xact_start LIMIT 1`, nil, func(r Rows) (postboxdriver.Snapshot, error) {
		var s postboxdriver.Snapshot
		var secs float64
		err := r.Scan(&secs, &s.PID, &s.State)
		s.Age = time.Duration(secs * float64(time.Second))
		return s, err
	})
	if err != nil || len(out) == 0 {
		return postboxdriver.Snapshot{}, false, err
	}
	return out[0], true, nil
}

// Settle implements postboxdriver.Executor, in one statement.
func (c *Core) Settle(ctx context.Context, f postboxdriver.Fence, o postboxdriver.Outcome, maxAttempts int) (postboxdriver.Settled, error) {
	var out postboxdriver.Settled
	if len(o.Published) == 0 && len(o.Failed) == 0 {
		return out, nil
	}
	published := o.Published
	if published == nil {
		published = []int64{}
	}
	// One entry per failed seq, the last one winning, as on SQLite: a seq
	// listed twice would otherwise be deleted and buried twice.
	idx := make(map[int64]int, len(o.Failed))
	seqs, backoffs := []int64{}, []int64{}
	errs, dead := []string{}, []bool{}
	for _, fl := range o.Failed {
		i, ok := idx[fl.Seq]
		if !ok {
			i = len(seqs)
			idx[fl.Seq] = i
			seqs, errs, backoffs, dead = append(seqs, 0), append(errs, ""), append(backoffs, 0), append(dead, false)
		}
		seqs[i], errs[i], backoffs[i], dead[i] = fl.Seq, fl.Error, fl.Backoff.Milliseconds(), fl.Dead
	}
	type row struct {
		seq      *int64
		attempts int
		dead     bool
	}
	rows, err := queryAll(ctx, c, c.q.settle, []any{f.Owner, Generations(f), published, seqs, errs, backoffs, dead, maxAttempts}, func(r Rows) (row, error) {
		var x row
		err := r.Scan(&x.seq, &x.attempts, &x.dead)
		return x, err
	})
	if err != nil {
		return postboxdriver.Settled{}, err
	}
	for _, x := range rows {
		if x.seq == nil {
			out.Published = x.attempts
			continue
		}
		out.Failed = append(out.Failed, postboxdriver.FailResult{Seq: *x.seq, Attempts: x.attempts, Dead: x.dead})
	}
	return out, nil
}

// ResolveCrashes implements postboxdriver.Executor.
func (c *Core) ResolveCrashes(ctx context.Context, f postboxdriver.Fence, seqs []int64) ([]postboxdriver.Suspect, error) {
	if len(seqs) == 0 {
		return nil, nil
	}
	return queryAll(ctx, c, c.q.resolveCrashes, []any{f.Owner, seqs, Generations(f)}, func(r Rows) (postboxdriver.Suspect, error) {
		var s postboxdriver.Suspect
		err := r.Scan(&s.Seq, &s.Crashes)
		return s, err
	})
}

// MarkInFlight implements postboxdriver.Executor.
func (c *Core) MarkInFlight(ctx context.Context, f postboxdriver.Fence, seqs []int64, mark postboxdriver.InFlight, clear []int64) (int, error) {
	if len(seqs) == 0 && len(clear) == 0 {
		return 0, nil
	}
	if seqs == nil {
		seqs = []int64{}
	}
	if clear == nil {
		clear = []int64{}
	}
	return c.count(ctx, c.q.markInFlight, f.Owner, seqs, Generations(f), int16(mark), clear)
}

// Stats implements postboxdriver.Executor.
func (c *Core) Stats(ctx context.Context) (postboxdriver.Stats, error) {
	var s postboxdriver.Stats
	var age float64
	err := c.queryRow(ctx, c.db, c.q.stats, nil, &s.Pending, &s.Dead, &age, &s.Published, &s.PendingEstimated, &s.PublishedEstimated)
	s.OldestPendingAge = time.Duration(age * float64(time.Second))
	return s, err
}

func scanString(r Rows) (string, error) {
	var s string
	err := r.Scan(&s)
	return s, err
}

func int32s(xs []int) []int32 {
	out := make([]int32, len(xs))
	for i, x := range xs {
		out[i] = int32(x)
	}
	return out
}

// Generations lays the fence out as an array indexed by partition+1, the
// shape the mark statements read it in; 0 is no generation at all.
func Generations(f postboxdriver.Fence) []int64 {
	maxPart := -1
	for p := range f.Generations {
		maxPart = max(maxPart, p)
	}
	out := make([]int64, maxPart+1)
	for p, g := range f.Generations {
		if p >= 0 { // a negative partition matches no row; skip rather than panic
			out[p] = g
		}
	}
	return out
}

// DurabilityWarnings implements postboxdriver.Executor.
func (c *Core) DurabilityWarnings(ctx context.Context) ([]string, error) {
	var syncCommit, fsync string
	if err := c.queryRow(ctx, c.db, `SELECT current_setting('synchronous_commit'), current_setting('fsync')`, nil, &syncCommit, &fsync); err != nil {
		return nil, err
	}
	var out []string
	if syncCommit == "off" {
		out = append(out, "PostgreSQL runs with synchronous_commit = off: a crash can lose transactions that committed, after the relay published their messages")
	}
	if fsync == "off" {
		out = append(out, "PostgreSQL runs with fsync = off: a crash can lose or corrupt committed transactions, after the relay published their messages")
	}
	// Replicas a commit does not wait for: a failover to one of them
	// forgets what it had not received. Only a role that may read
	// pg_stat_replication's states sees them (a superuser, pg_monitor).
	var async int
	if err := c.queryRow(ctx, c.db, `SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('async', 'potential')`, nil, &async); err != nil {
		return out, err
	}
	if async > 0 {
		out = append(out, fmt.Sprintf("PostgreSQL streams to %d replica(s) asynchronously: a failover to one can lose transactions that committed, after the relay published their messages (synchronous_standby_names makes commits wait for a replica)", async))
	}
	return out, nil
}

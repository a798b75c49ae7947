package postboxsqlite

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"modernc.org/sqlite"

	"github.com/postbox-go/postbox/internal/sqlkit"
	"github.com/postbox-go/postbox/postboxdriver"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// The same rule as the PostgreSQL drivers: the prefix is spliced into SQL.

// partitions is the number of leases the migration creates; rows are
// hashed over it at insert.
const partitions = 64

// nowExpr is the database clock in unix milliseconds. Statements read it
// through an uncorrelated subquery, which SQLite evaluates once per
// execution: 'now' itself is only fixed within one step, and a SELECT
// returning many rows takes many steps. PostgreSQL's now() is likewise one
// instant per statement.
const nowExpr = `CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)`

// Dialect implements postboxdriver.Executor.
func (s *store) Dialect() string { return "sqlite" }

type queries struct {
	lock, partitions, heartbeat, live, leases, unregister, acquire, release, settle, expire, fetch, fetchStrict, fetchRouted, fetchRoutedStrict, publish, unpend, bury, unbury, retry,
	anyMarked, markCrashes, suspects, markInFlight, stats,
	applied, createMigrations, migrationDone, recordMigration string
}

// Lists travel as JSON text and are read back with json_each: one
// statement text whatever the length, and nothing spliced into SQL. A
// fence travels as a JSON array indexed by partition, 0 meaning no
// generation (an owned lease is at generation 1 or more), the shape
// PostgreSQL reads it in; ->> with a number indexes it, NULL past the end.
func makeQueries(p string) queries {
	r := strings.NewReplacer("{p}", p, "{now}", "(SELECT "+nowExpr+")")
	const fenced = `l.partition = o.partition AND l.owner = ?2 AND l.generation = (?3 ->> o.partition)`
	q := queries{
		// A write that changes nothing, to take the write lock at the start
		// of a transaction begun DEFERRED (see InTx).
		lock:       r.Replace(`DELETE FROM {p}leases WHERE 0`),
		partitions: r.Replace(`SELECT count(*) FROM {p}leases`),
		heartbeat: r.Replace(`INSERT INTO {p}relays (id, expires_at) VALUES (?1, {now} + ?2)
ON CONFLICT (id) DO UPDATE SET expires_at = excluded.expires_at`),
		// The caller is live even with a ttl that has already run out, as
		// in PostgreSQL, where it is returned from the upsert itself.
		live:       r.Replace(`SELECT id FROM {p}relays WHERE expires_at > {now} OR id = ?1 ORDER BY id`),
		leases:     r.Replace(`SELECT partition, coalesce(owner, ''), generation, expires_at, owner IS NULL OR expires_at <= {now}, {now}, crashed FROM {p}leases ORDER BY partition`),
		unregister: r.Replace(`DELETE FROM {p}relays WHERE id = ?1 OR expires_at < {now} - 3600000`),
		// SET reads the row as it was before the update, so the CASE sees
		// the previous owner. IS is SQLite's IS NOT DISTINCT FROM. crashed
		// records whether the lease was taken from another owner, which the
		// WHERE allows only once its lease ran out (a released lease has
		// no owner, and keeps the mark its last owner left: unsettled, it
		// passes on).
		acquire: r.Replace(`UPDATE {p}leases SET
  generation = CASE WHEN owner IS ?1 THEN generation ELSE generation + 1 END,
  crashed = CASE WHEN owner IS ?1 THEN crashed ELSE owner IS NOT NULL OR crashed END,
  owner = ?1,
  expires_at = {now} + ?3
WHERE partition IN (SELECT value FROM json_each(?2)) AND (owner IS NULL OR owner = ?1 OR expires_at <= {now})
RETURNING partition, owner, generation, expires_at`),
		release: r.Replace(`UPDATE {p}leases SET owner = NULL, expires_at = {now}
WHERE owner = ?1 AND partition IN (SELECT value FROM json_each(?2))`),
		// The crash marks a relay settled, on partitions it holds or has
		// just released.
		settle: r.Replace(`UPDATE {p}leases SET crashed = 0
WHERE crashed AND (owner = ?1 OR owner IS NULL) AND partition IN (SELECT value FROM json_each(?2))`),
		// expires_at holds Unix milliseconds; 0 is long past.
		expire:            r.Replace(`UPDATE {p}leases SET owner = ?1, generation = generation + 1, expires_at = 0`),
		fetch:             r.Replace(fetchSQL(false, false)),
		fetchStrict:       r.Replace(fetchSQL(true, false)),
		fetchRouted:       r.Replace(fetchSQL(false, true)),
		fetchRoutedStrict: r.Replace(fetchSQL(true, true)),
		// Settle copies the fenced published rows to the history and
		// deletes the same rows; both run in one BEGIN IMMEDIATE
		// transaction, with the failures' statements, so the fence cannot
		// change between them.
		publish: r.Replace(`INSERT INTO {p}published (seq, id, topic, key, payload, headers, partition, created_at, attempts, published_at)
SELECT o.seq, o.id, o.topic, o.key, o.payload, o.headers, o.partition, o.created_at, o.attempts, {now}
FROM {p}outbox o JOIN {p}leases l ON ` + fenced + `
WHERE o.seq IN (SELECT value FROM json_each(?1))
ORDER BY o.seq`),
		unpend: r.Replace(`DELETE FROM {p}outbox AS o
WHERE o.seq IN (SELECT value FROM json_each(?1))
  AND EXISTS (SELECT 1 FROM {p}leases l WHERE ` + fenced + `)`),
		// Settle's failures: rows that reach the budget, or whose failure is
		// marked dead (permanent), move to the dead table, then the others
		// wait for their backoff. The failures arrive as a JSON array of
		// {"s": seq, "e": error, "b": backoff ms, "d": dead}, one per seq.
		// A dead message of the same id, an id written again after its
		// first message died, is replaced: a conflict would fail the
		// record of every failure of the batch.
		bury: r.Replace(`WITH f AS (SELECT value ->> 's' AS seq, value ->> 'e' AS err, value ->> 'd' AS dead FROM json_each(?1))
INSERT INTO {p}dead (seq, id, topic, key, payload, headers, partition, created_at, attempts, last_error, dead_at)
SELECT o.seq, o.id, o.topic, o.key, o.payload, o.headers, o.partition, o.created_at, o.attempts + 1, f.err, {now}
FROM f JOIN {p}outbox o ON o.seq = f.seq JOIN {p}leases l ON ` + fenced + `
WHERE o.attempts + 1 >= ?4 OR f.dead
ORDER BY o.seq
ON CONFLICT (id) DO UPDATE SET seq = excluded.seq, topic = excluded.topic, key = excluded.key,
  payload = excluded.payload, headers = excluded.headers, partition = excluded.partition,
  created_at = excluded.created_at, attempts = excluded.attempts, last_error = excluded.last_error, dead_at = excluded.dead_at
RETURNING seq, attempts`),
		unbury: r.Replace(`DELETE FROM {p}outbox WHERE seq IN (SELECT value FROM json_each(?1))`),
		retry: r.Replace(`WITH f AS (SELECT value ->> 's' AS seq, value ->> 'e' AS err, value ->> 'b' AS backoff, value ->> 'd' AS dead FROM json_each(?1))
UPDATE {p}outbox AS o SET attempts = o.attempts + 1, last_error = f.err, available_at = {now} + f.backoff, inflight = 0
FROM f, {p}leases l
WHERE o.seq = f.seq AND ` + fenced + ` AND o.attempts + 1 < ?4 AND NOT f.dead
RETURNING seq, attempts`),
		// ResolveCrashes: a row in flight alone when its relay died counts
		// a crash, a row in flight with others becomes a suspect, a mark
		// whose relay is live again is cleared; then the suspects and the
		// rows counted before are read back.
		anyMarked: r.Replace(`SELECT EXISTS (SELECT 1 FROM {p}outbox WHERE seq IN (SELECT value FROM json_each(?1)) AND inflight IN (1, 2))`),
		markCrashes: r.Replace(`UPDATE {p}outbox AS o SET
  crashes = o.crashes + (o.inflight = 2 AND NOT EXISTS (SELECT 1 FROM {p}relays r WHERE r.id = o.inflight_by AND r.expires_at > {now})),
  inflight = CASE WHEN EXISTS (SELECT 1 FROM {p}relays r WHERE r.id = o.inflight_by AND r.expires_at > {now}) THEN 0 ELSE 3 END
FROM {p}leases l
WHERE o.seq IN (SELECT value FROM json_each(?1)) AND o.inflight IN (1, 2) AND ` + fenced),
		suspects: r.Replace(`SELECT seq, crashes FROM {p}outbox
WHERE seq IN (SELECT value FROM json_each(?1)) AND (inflight = 3 OR (inflight = 0 AND crashes > 0))
ORDER BY seq`),
		// The marks are fenced, the clears are not (Executor.MarkInFlight):
		// one statement, so one commit, for both.
		markInFlight: r.Replace(`UPDATE {p}outbox AS o SET inflight = CASE WHEN o.seq IN (SELECT value FROM json_each(?1)) THEN ?4 ELSE 0 END,
  inflight_by = CASE WHEN o.seq IN (SELECT value FROM json_each(?1)) THEN ?2 ELSE o.inflight_by END
WHERE (o.seq IN (SELECT value FROM json_each(?1))
    AND EXISTS (SELECT 1 FROM {p}leases l WHERE ` + fenced + `))
  OR (o.seq IN (SELECT value FROM json_each(?5)) AND o.seq NOT IN (SELECT value FROM json_each(?1)) AND o.inflight <> 0)`),
		applied: r.Replace(`SELECT version FROM {p}migrations ORDER BY version`),
		createMigrations: r.Replace(`CREATE TABLE IF NOT EXISTS {p}migrations (
  version    INTEGER PRIMARY KEY,
  name       TEXT    NOT NULL,
  applied_at INTEGER NOT NULL DEFAULT (` + nowExpr + `)
) STRICT`),
		migrationDone:   r.Replace(`SELECT EXISTS (SELECT 1 FROM {p}migrations WHERE version = ?)`),
		recordMigration: r.Replace(`INSERT INTO {p}migrations (version, name) VALUES (?, ?)`),
		stats: r.Replace(`SELECT
  (SELECT count(*) FROM {p}outbox),
  (SELECT count(*) FROM {p}dead),
  coalesce((SELECT {now} - created_at FROM {p}outbox ORDER BY seq LIMIT 1), 0),
  (SELECT count(*) FROM {p}published)`),
	}
	return q
}

// fetchSQL reads pending rows in seq order. A row that never failed is
// due at once; only a retry waits for its available_at, as on PostgreSQL.
// A keyed row is held back while an older row of its key waits for a
// retry (or is dead, when strict): only rows that failed before can do
// that, and the partial retry index holds exactly those, so the check
// costs nothing while nothing fails.
func fetchSQL(strict, routed bool) string {
	var with, topic, unrouted, dead string
	if strict {
		dead = `
    OR EXISTS (SELECT 1 FROM {p}dead d WHERE d.key = o.key AND d.seq < o.seq)`
	}
	if routed {
		// ?3 is a JSON array of GLOB patterns: topics hold none of GLOB's
		// special characters, so a pattern is a topic or a prefix and "*".
		with = `WITH unrouted AS (
  SELECT key, min(seq) AS seq FROM {p}outbox
  WHERE key IS NOT NULL AND partition IN (SELECT value FROM json_each(?1))
    AND NOT EXISTS (SELECT 1 FROM json_each(?3) WHERE topic GLOB value)
  GROUP BY key
)
`
		topic = `
  AND EXISTS (SELECT 1 FROM json_each(?3) WHERE o.topic GLOB value)`
		unrouted = `
    OR EXISTS (SELECT 1 FROM unrouted u WHERE u.key = o.key AND u.seq < o.seq)`
	}
	return with + `SELECT o.seq, o.id, o.topic, coalesce(o.key, ''), o.payload, o.headers, o.partition, o.attempts, o.created_at
FROM {p}outbox o
WHERE o.partition IN (SELECT value FROM json_each(?1))
  AND (o.attempts = 0 OR o.available_at <= {now})` + topic + `
  AND (o.key IS NULL OR NOT (
    EXISTS (SELECT 1 FROM {p}outbox b
            WHERE b.key = o.key AND b.seq < o.seq AND b.attempts > 0 AND b.available_at > {now})` + dead + unrouted + `))
ORDER BY o.seq
LIMIT ?2`
}

// Partitions implements postboxdriver.Executor.
func (s *store) Partitions(ctx context.Context) (int, error) {
	var n int
	err := s.conn().QueryRowContext(ctx, s.q.partitions).Scan(&n)
	return n, s.wrap(err)
}

// Coordinate implements postboxdriver.Executor, in one IMMEDIATE
// transaction: the heartbeat, the releases, the takes and renewals, and the
// membership after them.
func (s *store) Coordinate(ctx context.Context, relayID string, ttl time.Duration, want, drop, settled []int) (postboxdriver.Membership, error) {
	var m postboxdriver.Membership
	take := sqlkit.Taking(want, drop)
	err := s.write(ctx, func(c conn) error {
		if _, err := c.ExecContext(ctx, s.q.heartbeat, relayID, ttl.Milliseconds()); err != nil {
			return err
		}
		if len(drop) > 0 {
			if _, err := c.ExecContext(ctx, s.q.release, relayID, sqlkit.Ints(drop)); err != nil {
				return err
			}
		}
		if len(settled) > 0 {
			if _, err := c.ExecContext(ctx, s.q.settle, relayID, sqlkit.Ints(settled)); err != nil {
				return err
			}
		}
		if len(take) > 0 {
			if _, err := c.ExecContext(ctx, s.q.acquire, relayID, sqlkit.Ints(take), ttl.Milliseconds()); err != nil {
				return err
			}
		}
		var err error
		if m.Live, err = sqlkit.QueryAll(ctx, c, s.q.live, []any{relayID}, sqlkit.ScanString); err != nil {
			return err
		}
		m.Leases, err = sqlkit.QueryAll(ctx, c, s.q.leases, nil, sqlkit.ScanLease(&m.Now))
		return err
	})
	// SQLite's ORDER BY compares bytes, as Go does; sorting again keeps the
	// promise whatever collation a column might carry.
	sort.Strings(m.Live)
	return m, err
}

// Unregister implements postboxdriver.Executor.
func (s *store) Unregister(ctx context.Context, relayID string) error {
	_, err := s.conn().ExecContext(ctx, s.q.unregister, relayID)
	return s.wrap(err)
}

// AcquireLeases implements postboxdriver.Executor. It is one statement,
// which SQLite runs in a transaction of its own that starts by taking the
// write lock, so it waits under the busy timeout like BEGIN IMMEDIATE.
func (s *store) AcquireLeases(ctx context.Context, owner string, parts []int, ttl time.Duration) ([]postboxdriver.Lease, error) {
	out, err := sqlkit.QueryAll(ctx, s.conn(), s.q.acquire, []any{owner, sqlkit.Ints(parts), ttl.Milliseconds()}, sqlkit.ScanOwnedLease)
	if err != nil {
		return nil, s.wrap(err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Partition < out[j].Partition })
	return out, nil
}

// ReleaseLeases implements postboxdriver.Executor.
func (s *store) ReleaseLeases(ctx context.Context, owner string, parts []int) error {
	_, err := s.conn().ExecContext(ctx, s.q.release, owner, sqlkit.Ints(parts))
	return s.wrap(err)
}

// ExpireLeases implements postboxdriver.Executor.
func (s *store) ExpireLeases(ctx context.Context, owner string) (int, error) {
	n, err := sqlkit.Affected(s.conn().ExecContext(ctx, s.q.expire, owner))
	return int(n), s.wrap(err)
}

// Fetch implements postboxdriver.Executor. It only reads: in WAL mode it
// neither waits for writers nor holds them up.
func (s *store) Fetch(ctx context.Context, p postboxdriver.FetchParams) ([]postboxdriver.Record, error) {
	kind, args, ok := sqlkit.Fetch(p, func(ps []string) []string { return ps })
	if !ok {
		return nil, nil
	}
	q := [...]string{s.q.fetch, s.q.fetchStrict, s.q.fetchRouted, s.q.fetchRoutedStrict}[kind]
	out, err := sqlkit.QueryAll(ctx, s.conn(), q, args, sqlkit.ScanRecord)
	return out, s.wrap(err)
}

// Settle implements postboxdriver.Executor, in one write transaction.
func (s *store) Settle(ctx context.Context, f postboxdriver.Fence, o postboxdriver.Outcome, maxAttempts int) (postboxdriver.Settled, error) {
	if len(o.Published) == 0 && len(o.Failed) == 0 {
		return postboxdriver.Settled{}, nil
	}
	var fs []byte
	if len(o.Failed) > 0 {
		var err error
		if fs, err = failuresJSON(o.Failed); err != nil {
			return postboxdriver.Settled{}, err
		}
	}
	gens := generationsJSON(f)
	var out postboxdriver.Settled
	err := s.write(ctx, func(c conn) error {
		out = postboxdriver.Settled{}
		var err error
		if len(o.Published) > 0 {
			if out.Published, err = s.publish(ctx, c, f.Owner, gens, o.Published); err != nil {
				return err
			}
		}
		if fs != nil {
			out.Failed, err = s.fail(ctx, c, f.Owner, gens, fs, maxAttempts)
		}
		return err
	})
	if err != nil {
		return postboxdriver.Settled{}, err
	}
	return out, nil
}

// publish copies the fenced rows seqs to the history and deletes them from
// the outbox, in the caller's write transaction.
func (s *store) publish(ctx context.Context, c conn, owner, gens string, seqs []int64) (int, error) {
	list := sqlkit.Int64s(seqs)
	res, err := c.ExecContext(ctx, s.q.publish, list, owner, gens)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, err
	}
	res, err = c.ExecContext(ctx, s.q.unpend, list, owner, gens)
	if err != nil {
		return 0, err
	}
	deleted, err := res.RowsAffected()
	if err != nil {
		return 0, err
	}
	if deleted != n {
		// Cannot happen inside one write transaction; refuse to commit a
		// history that disagrees with the outbox.
		return 0, fmt.Errorf("postboxsqlite: copied %d rows to the history but deleted %d", n, deleted)
	}
	return int(n), nil
}

type failure struct {
	Seq     int64  `json:"s"`
	Error   string `json:"e"`
	Backoff int64  `json:"b"`
	Dead    bool   `json:"d"`
}

// failuresJSON renders failures for the statements, one entry per seq, the
// last one winning: a seq listed twice would otherwise be buried twice.
func failuresJSON(failures []postboxdriver.Failure) ([]byte, error) {
	idx := make(map[int64]int, len(failures))
	list := make([]failure, 0, len(failures))
	for _, fl := range failures {
		x := failure{Seq: fl.Seq, Error: fl.Error, Backoff: fl.Backoff.Milliseconds(), Dead: fl.Dead}
		if i, ok := idx[fl.Seq]; ok {
			list[i] = x
			continue
		}
		idx[fl.Seq] = len(list)
		list = append(list, x)
	}
	return json.Marshal(list)
}

// fail records the failures fs (failuresJSON) in the caller's write
// transaction. It returns the rows that died first, then those that wait
// for a retry, as PostgreSQL does; each group in seq order.
func (s *store) fail(ctx context.Context, c conn, owner, gens string, fs []byte, maxAttempts int) ([]postboxdriver.FailResult, error) {
	var out []postboxdriver.FailResult
	collect := func(dead bool) func(*sql.Rows) error {
		return func(r *sql.Rows) error {
			fr := postboxdriver.FailResult{Dead: dead}
			if err := r.Scan(&fr.Seq, &fr.Attempts); err != nil {
				return err
			}
			out = append(out, fr)
			return nil
		}
	}
	rows, err := c.QueryContext(ctx, s.q.bury, string(fs), owner, gens, maxAttempts)
	if err != nil {
		return nil, err
	}
	if err := sqlkit.ScanAll(rows, collect(true)); err != nil {
		return nil, err
	}
	if len(out) > 0 {
		buried := make([]int64, len(out))
		for i, fr := range out {
			buried[i] = fr.Seq
		}
		if _, err := c.ExecContext(ctx, s.q.unbury, sqlkit.Int64s(buried)); err != nil {
			return nil, err
		}
	}
	nDead := len(out)
	rows, err = c.QueryContext(ctx, s.q.retry, string(fs), owner, gens, maxAttempts)
	if err != nil {
		return nil, err
	}
	if err := sqlkit.ScanAll(rows, collect(false)); err != nil {
		return nil, err
	}
	// RETURNING promises no order; make it deterministic.
	bySeq := func(a, b postboxdriver.FailResult) int { return cmp.Compare(a.Seq, b.Seq) }
	slices.SortFunc(out[:nDead], bySeq)
	slices.SortFunc(out[nDead:], bySeq)
	return out, nil
}

// ResolveCrashes implements postboxdriver.Executor, in one write
// transaction.
func (s *store) ResolveCrashes(ctx context.Context, f postboxdriver.Fence, seqs []int64) ([]postboxdriver.Suspect, error) {
	if len(seqs) == 0 {
		return nil, nil
	}
	list := sqlkit.Int64s(seqs)
	suspects := func(c conn) ([]postboxdriver.Suspect, error) {
		return sqlkit.QueryAll(ctx, c, s.q.suspects, []any{list}, sqlkit.ScanSuspect)
	}
	// Rows marked in flight are only found after a relay died: a look
	// first, which in WAL mode takes no lock, spares the write lock
	// otherwise.
	var marked bool
	if err := s.conn().QueryRowContext(ctx, s.q.anyMarked, list).Scan(&marked); err != nil {
		return nil, s.wrap(err)
	}
	if !marked {
		out, err := suspects(s.conn())
		return out, s.wrap(err)
	}
	var out []postboxdriver.Suspect
	err := s.write(ctx, func(c conn) error {
		if _, err := c.ExecContext(ctx, s.q.markCrashes, list, f.Owner, generationsJSON(f)); err != nil {
			return err
		}
		var err error
		out, err = suspects(c)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// MarkInFlight implements postboxdriver.Executor. In WAL mode with
// synchronous=FULL the commit waits for its fsync; only relays that took a
// partition after an expiry mark rows.
func (s *store) MarkInFlight(ctx context.Context, f postboxdriver.Fence, seqs []int64, mark postboxdriver.InFlight, clear []int64) (int, error) {
	if len(seqs) == 0 && len(clear) == 0 {
		return 0, nil
	}
	n, err := sqlkit.Affected(s.conn().ExecContext(ctx, s.q.markInFlight, sqlkit.Int64s(seqs), f.Owner, generationsJSON(f), int(mark), sqlkit.Int64s(clear)))
	return int(n), s.wrap(err)
}

// Stats implements postboxdriver.Executor.
func (s *store) Stats(ctx context.Context) (postboxdriver.Stats, error) {
	st, err := sqlkit.ScanStats(s.conn().QueryRowContext(ctx, s.q.stats))
	return st, s.wrap(err)
}

// Migrations implements postboxdriver.Executor.
func (s *store) Migrations() []postboxdriver.Migration {
	return postboxdriver.LoadMigrations(migrationFS, "migrations", s.prefix)
}

// AppliedMigrations implements postboxdriver.Executor.
func (s *store) AppliedMigrations(ctx context.Context) ([]int, error) {
	vs, err := sqlkit.QueryAll(ctx, s.conn(), s.q.applied, nil, func(r *sql.Rows) (int, error) {
		var v int
		return v, r.Scan(&v)
	})
	if isNoSuchTable(err) {
		return nil, nil
	}
	return vs, err
}

// ApplyMigration implements postboxdriver.Executor. BEGIN IMMEDIATE makes
// concurrent migrators queue up on the write lock, and each re-checks the
// version under it, so replicas starting together apply it once. SQLite's
// DDL is transactional: a migration that fails leaves nothing behind.
func (s *store) ApplyMigration(ctx context.Context, m postboxdriver.Migration) error {
	return s.write(ctx, func(c conn) error {
		if _, err := c.ExecContext(ctx, s.q.createMigrations); err != nil {
			return err
		}
		var done bool
		if err := c.QueryRowContext(ctx, s.q.migrationDone, m.Version).Scan(&done); err != nil {
			return err
		}
		if done {
			return nil
		}
		if _, err := c.ExecContext(ctx, m.SQL); err != nil {
			return fmt.Errorf("migration %d (%s): %w", m.Version, m.Name, err)
		}
		_, err := c.ExecContext(ctx, s.q.recordMigration, m.Version, m.Name)
		return err
	})
}

// write runs fn in a transaction: the caller's, or one begun with BEGIN
// IMMEDIATE on a connection of its own. Taking the write lock first means
// the transaction waits for it under the busy timeout, instead of reading
// first and then failing to upgrade to a writer because another one
// committed in between.
//
// In the caller's transaction, fn runs under a savepoint: an operation of
// several statements (a mark copies rows and deletes them) either happens
// whole or leaves the transaction as it was, as the single statements of
// PostgreSQL do.
func (s *store) write(ctx context.Context, fn func(c conn) error) (err error) {
	if s.tx != nil {
		return s.inSavepoint(ctx, "postbox_write", func() error { return s.wrap(fn(s.tx)) })
	}
	c, err := s.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	if _, err = c.ExecContext(ctx, "BEGIN IMMEDIATE"); err == nil {
		err = fn(c)
	}
	if err == nil {
		if _, err = c.ExecContext(ctx, "COMMIT"); err == nil {
			return nil
		}
	}
	// database/sql does not know a transaction is open on c; one left open
	// would hold the write lock in the pool. Roll back even after ctx has
	// ended, and even after a failed BEGIN (an interrupted one may have
	// taken effect); if that fails, discard the connection instead of
	// reusing it: closing it ends any transaction.
	_, rbErr := c.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
	if rbErr != nil && !strings.Contains(rbErr.Error(), "no transaction is active") {
		_ = c.Raw(func(any) error { return driver.ErrBadConn })
	}
	return s.wrap(err)
}

// wrap maps a missing table to ErrNotMigrated.
func (s *store) wrap(err error) error {
	if err != nil && isNoSuchTable(err) {
		return fmt.Errorf("%w (prefix %q): %w", postboxdriver.ErrNotMigrated, s.prefix, err)
	}
	return err
}

func isNoSuchTable(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && strings.Contains(se.Error(), "no such table")
}

// generationsJSON lays the fence out as a JSON array indexed by partition;
// 0 is no generation at all.
func generationsJSON(f postboxdriver.Fence) string {
	maxPart := -1
	for p := range f.Generations {
		if p >= 0 {
			maxPart = max(maxPart, p)
		}
	}
	gens := make([]int64, maxPart+1)
	for p, g := range f.Generations {
		if p >= 0 {
			gens[p] = g
		}
	}
	return sqlkit.Int64s(gens)
}

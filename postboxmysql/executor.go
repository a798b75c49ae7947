package postboxmysql

import (
	"cmp"
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/postbox-go/postbox/internal/sqlkit"
	"github.com/postbox-go/postbox/postboxdriver"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// nowExpr is the database clock in unix milliseconds: UTC whatever the
// session's time zone, and one instant for a whole statement.
const nowExpr = `(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000)`

// ints is the list of integers bound as the JSON array ?n, as a table
// with one column v; strs the same for strings.
func ints(n int) string {
	return `(SELECT v FROM JSON_TABLE(?` + strconv.Itoa(n) + `, '$[*]' COLUMNS (v BIGINT PATH '$')) AS j` + strconv.Itoa(n) + `)`
}

// intsTable is ?n's integers as a table to join, alias j, column v: a
// join drives from the list and looks each row up by its key, so that
// InnoDB locks only the rows named, never a range.
func intsTable(n int) string {
	return `JSON_TABLE(?` + strconv.Itoa(n) + `, '$[*]' COLUMNS (v BIGINT PATH '$')) AS j`
}

func strs(n int) string {
	return `(SELECT v FROM JSON_TABLE(?` + strconv.Itoa(n) + `, '$[*]' COLUMNS (v VARCHAR(255) CHARACTER SET utf8mb4 PATH '$')) AS j` + strconv.Itoa(n) + `)`
}

type queries struct {
	partitions, heartbeat, live, leases, unregister, acquire, owned, release, settle, expire, fence,
	fetch, fetchStrict, fetchRouted, fetchRoutedStrict, publish, unpend, failing, bury, unbury, retry,
	marked, markCrashes, suspects, markInFlight, stats, applied, createMigrations, migrationDone, recordMigration stmt
}

// Lists travel as JSON arrays and are read back with JSON_TABLE: one
// statement text whatever the length, and nothing spliced into SQL.
//
// A single-table UPDATE assigns its columns from left to right, each
// assignment seeing those before it: the statements below assign owner
// and the columns derived from it last.
func makeQueries(p string) queries {
	r := strings.NewReplacer("{p}", p, "{now}", nowExpr)
	q := func(s string) stmt { return prep(r.Replace(s)) }
	return queries{
		partitions: q("SELECT count(*) FROM {p}leases"),
		heartbeat: q(`INSERT INTO {p}relays (id, expires_at) VALUES (?1, {now} + ?2)
ON DUPLICATE KEY UPDATE expires_at = VALUES(expires_at)`),
		// The caller is live even with a ttl that has already run out.
		live:       q(`SELECT id FROM {p}relays WHERE expires_at > {now} OR id = ?1 ORDER BY id`),
		leases:     q("SELECT `partition`, COALESCE(owner, ''), generation, expires_at, owner IS NULL OR expires_at <= {now}, {now}, crashed FROM {p}leases ORDER BY `partition`"),
		unregister: q(`DELETE FROM {p}relays WHERE id = ?1 OR expires_at < {now} - 3600000`),
		// crashed records whether the lease was taken from another owner,
		// which the WHERE allows only once its lease ran out (a released
		// lease has no owner, and keeps the mark its last owner left:
		// unsettled, it passes on). <=> is IS NOT DISTINCT FROM.
		acquire: q(`UPDATE {p}leases SET
  generation = CASE WHEN owner <=> ?1 THEN generation ELSE generation + 1 END,
  crashed = CASE WHEN owner <=> ?1 THEN crashed ELSE owner IS NOT NULL OR crashed END,
  owner = ?1,
  expires_at = {now} + ?3
WHERE ` + "`partition`" + ` IN ` + ints(2) + ` AND (owner IS NULL OR owner = ?1 OR expires_at <= {now})`),
		owned: q("SELECT `partition`, owner, generation, expires_at FROM {p}leases WHERE owner = ?1 AND `partition` IN " + ints(2) + " ORDER BY `partition`"),
		release: q(`UPDATE {p}leases SET expires_at = {now}, owner = NULL
WHERE owner = ?1 AND ` + "`partition`" + ` IN ` + ints(2)),
		// The crash marks a relay settled, on partitions it holds or has
		// just released.
		settle: q(`UPDATE {p}leases SET crashed = FALSE
WHERE crashed AND (owner = ?1 OR owner IS NULL) AND ` + "`partition`" + ` IN ` + ints(2)),
		expire: q(`UPDATE {p}leases SET owner = ?1, generation = generation + 1, expires_at = 0`),
		// The owner's leases, locked until the transaction ends so that
		// the fence cannot move under the statements it guards.
		fence:             q("SELECT `partition`, generation FROM {p}leases WHERE owner = ?1 LOCK IN SHARE MODE"),
		fetch:             q(fetchSQL(false, false)),
		fetchStrict:       q(fetchSQL(true, false)),
		fetchRouted:       q(fetchSQL(false, true)),
		fetchRoutedStrict: q(fetchSQL(true, true)),
		// Settle copies the fenced published rows to the history and
		// deletes the same rows, with the failures' statements, in one
		// transaction that holds the fence's leases.
		publish: q(`INSERT INTO {p}published (seq, id, topic, ` + "`key`" + `, payload, headers, ` + "`partition`" + `, created_at, attempts, published_at)
SELECT o.seq, o.id, o.topic, o.` + "`key`" + `, o.payload, o.headers, o.` + "`partition`" + `, o.created_at, o.attempts, {now}
FROM ` + intsTable(1) + ` JOIN {p}outbox o ON o.seq = j.v
WHERE o.` + "`partition`" + ` IN ` + ints(2)),
		unpend: q(`DELETE o FROM ` + intsTable(1) + ` JOIN {p}outbox o ON o.seq = j.v WHERE o.` + "`partition`" + ` IN ` + ints(2)),
		// The failed rows the fence still holds, locked, with their
		// attempts: Go decides which die.
		failing: q(`SELECT o.seq, o.attempts FROM ` + intsTable(1) + ` JOIN {p}outbox o ON o.seq = j.v WHERE o.` + "`partition`" + ` IN ` + ints(2) + ` ORDER BY o.seq FOR UPDATE`),
		// The failures arrive as a JSON array of {"s": seq, "e": error,
		// "b": backoff ms}. A dead message of the same id, an id written
		// again after its first message died, is replaced: a conflict
		// would fail the record of every failure of the batch.
		bury: q(`INSERT INTO {p}dead (seq, id, topic, ` + "`key`" + `, payload, headers, ` + "`partition`" + `, created_at, attempts, last_error, dead_at)
SELECT o.seq, o.id, o.topic, o.` + "`key`" + `, o.payload, o.headers, o.` + "`partition`" + `, o.created_at, o.attempts + 1, f.e, {now}
FROM {p}outbox o JOIN JSON_TABLE(?1, '$[*]' COLUMNS (s BIGINT PATH '$.s', e LONGTEXT CHARACTER SET utf8mb4 PATH '$.e')) AS f ON f.s = o.seq
ORDER BY o.seq
ON DUPLICATE KEY UPDATE seq = VALUES(seq), topic = VALUES(topic), ` + "`key`" + ` = VALUES(` + "`key`" + `),
  payload = VALUES(payload), headers = VALUES(headers), ` + "`partition`" + ` = VALUES(` + "`partition`" + `),
  created_at = VALUES(created_at), attempts = VALUES(attempts), last_error = VALUES(last_error), dead_at = VALUES(dead_at)`),
		unbury: q(`DELETE o FROM ` + intsTable(1) + ` JOIN {p}outbox o ON o.seq = j.v`),
		retry: q(`UPDATE {p}outbox o JOIN JSON_TABLE(?1, '$[*]' COLUMNS (s BIGINT PATH '$.s', e LONGTEXT CHARACTER SET utf8mb4 PATH '$.e', b BIGINT PATH '$.b')) AS f ON f.s = o.seq
SET o.attempts = o.attempts + 1, o.last_error = f.e, o.available_at = {now} + f.b, o.inflight = 0`),
		// ResolveCrashes: the marked rows, each with whether the relay that
		// marked it is live again.
		marked: q(`SELECT o.seq, o.inflight, EXISTS (SELECT 1 FROM {p}relays r WHERE r.id = o.inflight_by AND r.expires_at > {now})
FROM ` + intsTable(1) + ` JOIN {p}outbox o ON o.seq = j.v WHERE o.` + "`partition`" + ` IN ` + ints(2) + ` AND o.inflight IN (1, 2) FOR UPDATE`),
		// ?1 is a JSON array of {"s": seq, "c": crashes to add, "i": the
		// new mark}, one per marked row.
		markCrashes: q(`UPDATE {p}outbox o JOIN JSON_TABLE(?1, '$[*]' COLUMNS (s BIGINT PATH '$.s', c INT PATH '$.c', i INT PATH '$.i')) AS m ON o.seq = m.s
SET o.crashes = o.crashes + m.c, o.inflight = m.i`),
		suspects: q(`SELECT o.seq, o.crashes FROM ` + intsTable(1) + ` JOIN {p}outbox o ON o.seq = j.v
WHERE o.inflight = 3 OR (o.inflight = 0 AND o.crashes > 0)
ORDER BY o.seq`),
		// The marks are fenced (?2 the partitions the fence holds), the
		// clears are not (Executor.MarkInFlight): one statement for both.
		// ?1 is a JSON array of {"s": seq, "m": whether it is a mark}; ?3
		// the relay marking, ?4 the mark.
		markInFlight: q(`UPDATE {p}outbox o JOIN JSON_TABLE(?1, '$[*]' COLUMNS (s BIGINT PATH '$.s', m BOOLEAN PATH '$.m')) AS x ON o.seq = x.s
SET o.inflight = CASE WHEN x.m THEN ?4 ELSE 0 END, o.inflight_by = CASE WHEN x.m THEN ?3 ELSE o.inflight_by END
WHERE (x.m AND o.` + "`partition`" + ` IN ` + ints(2) + `) OR (NOT x.m AND o.inflight <> 0)`),
		applied: q(`SELECT version FROM {p}migrations ORDER BY version`),
		createMigrations: q(`CREATE TABLE IF NOT EXISTS {p}migrations (
  version    INT          NOT NULL PRIMARY KEY,
  name       VARCHAR(255) NOT NULL,
  applied_at BIGINT       NOT NULL DEFAULT ` + nowExpr + `
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin`),
		migrationDone:   q(`SELECT EXISTS (SELECT 1 FROM {p}migrations WHERE version = ?1)`),
		recordMigration: q(`INSERT INTO {p}migrations (version, name) VALUES (?1, ?2)`),
		stats: q(`SELECT
  (SELECT count(*) FROM {p}outbox),
  (SELECT count(*) FROM {p}dead),
  COALESCE((SELECT {now} - created_at FROM {p}outbox ORDER BY seq LIMIT 1), 0),
  (SELECT count(*) FROM {p}published)`),
	}
}

// fetchSQL reads pending rows in seq order, with a consistent read that
// takes no locks. A row that never failed is due at once; only a retry
// waits for its available_at, as on PostgreSQL. A keyed row is held
// back while an older row of its key waits for a retry (or is dead, when
// strict): only rows that failed before can do that, and the retry index
// holds exactly those. The subqueries name their index: with the retry
// index all NULL while nothing fails, the optimizer's estimate for it is
// poor, and a plan that scans the outbox once for each row read came out
// of some reads (one of 13 s over 8 million rows in a 20,000-row drain).
//
// Routed, ?3 is a JSON array of LIKE patterns (escape character !): a
// keyed row is also held back by an older row of its key that no route
// matches.
func fetchSQL(strict, routed bool) string {
	var with, topic, unrouted, dead string
	if strict {
		dead = "\n    OR EXISTS (SELECT 1 FROM {p}dead d FORCE INDEX ({p}dead_key_idx) WHERE d.`key` = o.`key` AND d.seq < o.seq)"
	}
	if routed {
		const matches = `EXISTS (SELECT 1 FROM JSON_TABLE(?3, '$[*]' COLUMNS (pat VARCHAR(255) PATH '$')) AS rt WHERE %s.topic LIKE rt.pat ESCAPE '!')`
		with = "WITH unrouted AS (\n  SELECT `key`, min(seq) AS seq FROM {p}outbox u\n  WHERE `key` IS NOT NULL AND `partition` IN " + ints(1) + `
    AND NOT ` + fmt.Sprintf(matches, "u") + "\n  GROUP BY `key`\n)\n"
		topic = "\n  AND " + fmt.Sprintf(matches, "o")
		unrouted = "\n    OR EXISTS (SELECT 1 FROM unrouted u WHERE u.`key` = o.`key` AND u.seq < o.seq)"
	}
	return with + "SELECT o.seq, o.id, o.topic, COALESCE(o.`key`, ''), o.payload, o.headers, o.`partition`, o.attempts, o.created_at\n" +
		`FROM {p}outbox o
WHERE o.` + "`partition`" + ` IN ` + ints(1) + `
  AND (o.attempts = 0 OR o.available_at <= {now})` + topic + "\n  AND (o.`key` IS NULL OR NOT (\n" +
		"    EXISTS (SELECT 1 FROM {p}outbox b FORCE INDEX ({p}outbox_retry_idx)\n" +
		"            WHERE b.retry_key = o.`key` AND b.seq < o.seq AND b.available_at > {now})" + dead + unrouted + `))
ORDER BY o.seq
LIMIT ?2`
}

// Partitions implements postboxdriver.Executor.
func (s *store) Partitions(ctx context.Context) (int, error) {
	var n int
	err := s.q.partitions.row(ctx, s.conn()).Scan(&n)
	return n, s.wrap(err)
}

// Coordinate implements postboxdriver.Executor, in one transaction: the
// heartbeat, the releases, the takes and renewals, and the membership
// after them.
func (s *store) Coordinate(ctx context.Context, relayID string, ttl time.Duration, want, drop, settled []int) (postboxdriver.Membership, error) {
	var m postboxdriver.Membership
	take := sqlkit.Taking(want, drop)
	err := s.write(ctx, func(c conn) error {
		if _, err := s.q.heartbeat.exec(ctx, c, relayID, ttl.Milliseconds()); err != nil {
			return err
		}
		if len(drop) > 0 {
			if _, err := s.q.release.exec(ctx, c, relayID, sqlkit.Ints(drop)); err != nil {
				return err
			}
		}
		if len(settled) > 0 {
			if _, err := s.q.settle.exec(ctx, c, relayID, sqlkit.Ints(settled)); err != nil {
				return err
			}
		}
		if len(take) > 0 {
			if _, err := s.q.acquire.exec(ctx, c, relayID, sqlkit.Ints(take), ttl.Milliseconds()); err != nil {
				return err
			}
		}
		var err error
		if m.Live, err = query(ctx, c, s.q.live, []any{relayID}, sqlkit.ScanString); err != nil {
			return err
		}
		m.Leases, err = query(ctx, c, s.q.leases, nil, sqlkit.ScanLease(&m.Now))
		return err
	})
	// The binary collation orders as Go does; sorting again keeps the
	// promise whatever collation the column carries.
	sort.Strings(m.Live)
	return m, err
}

// Unregister implements postboxdriver.Executor.
func (s *store) Unregister(ctx context.Context, relayID string) error {
	_, err := s.q.unregister.exec(ctx, s.conn(), relayID)
	return s.wrap(err)
}

// AcquireLeases implements postboxdriver.Executor.
func (s *store) AcquireLeases(ctx context.Context, owner string, parts []int, ttl time.Duration) ([]postboxdriver.Lease, error) {
	var out []postboxdriver.Lease
	list := sqlkit.Ints(parts)
	err := s.write(ctx, func(c conn) error {
		if _, err := s.q.acquire.exec(ctx, c, owner, list, ttl.Milliseconds()); err != nil {
			return err
		}
		var err error
		out, err = query(ctx, c, s.q.owned, []any{owner, list}, sqlkit.ScanOwnedLease)
		return err
	})
	return out, err
}

// ReleaseLeases implements postboxdriver.Executor.
func (s *store) ReleaseLeases(ctx context.Context, owner string, parts []int) error {
	_, err := s.q.release.exec(ctx, s.conn(), owner, sqlkit.Ints(parts))
	return s.wrap(err)
}

// ExpireLeases implements postboxdriver.Executor.
func (s *store) ExpireLeases(ctx context.Context, owner string) (int, error) {
	n, err := s.q.expire.exec(ctx, s.conn(), owner)
	return int(n), s.wrap(err)
}

// Fetch implements postboxdriver.Executor. It only reads, with a
// consistent read: no row or gap locks, so writers never wait for it, nor
// it for them.
func (s *store) Fetch(ctx context.Context, p postboxdriver.FetchParams) ([]postboxdriver.Record, error) {
	kind, args, ok := sqlkit.Fetch(p, likePatterns)
	if !ok {
		return nil, nil
	}
	q := [...]stmt{s.q.fetch, s.q.fetchStrict, s.q.fetchRouted, s.q.fetchRoutedStrict}[kind]
	out, err := query(ctx, s.conn(), q, args, sqlkit.ScanRecord)
	return out, s.wrap(err)
}

// likePatterns turns topic patterns ("orders.created", "orders.*", "*")
// into LIKE patterns escaped with !: topics hold no %, ! or space, but may
// hold _.
func likePatterns(ps []string) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		lit, wild := strings.CutSuffix(p, "*")
		lit = strings.ReplaceAll(lit, "_", "!_")
		if wild {
			lit += "%"
		}
		out[i] = lit
	}
	return out
}

// fence locks the leases of f's owner for the rest of the transaction and
// returns, as a JSON array, the partitions whose lease is still at the
// generation f names: rows of the others are left alone.
func (s *store) fence(ctx context.Context, c conn, f postboxdriver.Fence) (string, error) {
	held, err := query(ctx, c, s.q.fence, []any{f.Owner}, func(r *sql.Rows) ([2]int64, error) {
		var pg [2]int64
		err := r.Scan(&pg[0], &pg[1])
		return pg, err
	})
	if err != nil {
		return "", err
	}
	parts := make([]int, 0, len(held))
	for _, pg := range held {
		if g, ok := f.Generations[int(pg[0])]; ok && g == pg[1] {
			parts = append(parts, int(pg[0]))
		}
	}
	return sqlkit.Ints(parts), nil
}

// Settle implements postboxdriver.Executor, in one transaction that holds
// the fence's leases.
func (s *store) Settle(ctx context.Context, f postboxdriver.Fence, o postboxdriver.Outcome, maxAttempts int) (postboxdriver.Settled, error) {
	if len(o.Published) == 0 && len(o.Failed) == 0 {
		return postboxdriver.Settled{}, nil
	}
	var out postboxdriver.Settled
	err := s.write(ctx, func(c conn) error {
		out = postboxdriver.Settled{}
		parts, err := s.fence(ctx, c, f)
		if err != nil {
			return err
		}
		if len(o.Published) > 0 {
			if out.Published, err = s.publish(ctx, c, parts, o.Published); err != nil {
				return err
			}
		}
		if len(o.Failed) > 0 {
			out.Failed, err = s.fail(ctx, c, parts, o.Failed, maxAttempts)
		}
		return err
	})
	if err != nil {
		return postboxdriver.Settled{}, err
	}
	return out, nil
}

// publish copies the fenced rows seqs to the history and deletes them from
// the outbox.
func (s *store) publish(ctx context.Context, c conn, parts string, seqs []int64) (int, error) {
	list := sqlkit.Int64s(seqs)
	n, err := s.q.publish.exec(ctx, c, list, parts)
	if err != nil {
		return 0, err
	}
	deleted, err := s.q.unpend.exec(ctx, c, list, parts)
	if err != nil {
		return 0, err
	}
	if deleted != n {
		// The transaction holds the leases, and only their owner deletes
		// these rows; refuse to commit a history that disagrees.
		return 0, fmt.Errorf("postboxmysql: copied %d rows to the history but deleted %d", n, deleted)
	}
	return int(n), nil
}

type failure struct {
	Seq     int64  `json:"s"`
	Error   string `json:"e"`
	Backoff int64  `json:"b"`
}

// fail records failures: the rows the fence holds that reach the budget,
// or whose failure is marked dead, move to the dead table; the others
// wait for their backoff. It returns the rows that died first, then those
// that wait, each group in seq order, as PostgreSQL does.
func (s *store) fail(ctx context.Context, c conn, parts string, failures []postboxdriver.Failure, maxAttempts int) ([]postboxdriver.FailResult, error) {
	// One entry per seq, the last one winning.
	last := make(map[int64]postboxdriver.Failure, len(failures))
	seqs := make([]int64, 0, len(failures))
	for _, fl := range failures {
		if _, ok := last[fl.Seq]; !ok {
			seqs = append(seqs, fl.Seq)
		}
		last[fl.Seq] = fl
	}
	rows, err := query(ctx, c, s.q.failing, []any{sqlkit.Int64s(seqs), parts}, func(r *sql.Rows) (postboxdriver.FailResult, error) {
		var fr postboxdriver.FailResult
		err := r.Scan(&fr.Seq, &fr.Attempts)
		return fr, err
	})
	if err != nil {
		return nil, err
	}
	var dying, waiting []failure
	var dead, retried []postboxdriver.FailResult
	for _, fr := range rows {
		fl := last[fr.Seq]
		fr.Attempts++
		x := failure{Seq: fr.Seq, Error: fl.Error, Backoff: fl.Backoff.Milliseconds()}
		if fr.Attempts >= maxAttempts || fl.Dead {
			fr.Dead = true
			dying, dead = append(dying, x), append(dead, fr)
		} else {
			waiting, retried = append(waiting, x), append(retried, fr)
		}
	}
	if len(dying) > 0 {
		b, err := json.Marshal(dying)
		if err != nil {
			return nil, err
		}
		if _, err := s.q.bury.exec(ctx, c, string(b)); err != nil {
			return nil, err
		}
		ds := make([]int64, len(dying))
		for i, d := range dying {
			ds[i] = d.Seq
		}
		if _, err := s.q.unbury.exec(ctx, c, sqlkit.Int64s(ds)); err != nil {
			return nil, err
		}
	}
	if len(waiting) > 0 {
		b, err := json.Marshal(waiting)
		if err != nil {
			return nil, err
		}
		if _, err := s.q.retry.exec(ctx, c, string(b)); err != nil {
			return nil, err
		}
	}
	bySeq := func(a, b postboxdriver.FailResult) int { return cmp.Compare(a.Seq, b.Seq) }
	slices.SortFunc(dead, bySeq)
	slices.SortFunc(retried, bySeq)
	return append(dead, retried...), nil
}

// ResolveCrashes implements postboxdriver.Executor, in one transaction
// that holds the fence's leases.
func (s *store) ResolveCrashes(ctx context.Context, f postboxdriver.Fence, seqs []int64) ([]postboxdriver.Suspect, error) {
	if len(seqs) == 0 {
		return nil, nil
	}
	list := sqlkit.Int64s(seqs)
	var out []postboxdriver.Suspect
	err := s.write(ctx, func(c conn) error {
		parts, err := s.fence(ctx, c, f)
		if err != nil {
			return err
		}
		type mark struct {
			seq      int64
			inflight int
			live     bool
		}
		marks, err := query(ctx, c, s.q.marked, []any{list, parts}, func(r *sql.Rows) (mark, error) {
			var m mark
			err := r.Scan(&m.seq, &m.inflight, &m.live)
			return m, err
		})
		if err != nil {
			return err
		}
		if len(marks) > 0 {
			// A row in flight alone when its relay died counts a crash, a
			// row in flight with others becomes a suspect, a mark whose
			// relay is live again is cleared.
			type resolved struct {
				Seq      int64 `json:"s"`
				Crashes  int   `json:"c"`
				InFlight int   `json:"i"`
			}
			rs := make([]resolved, len(marks))
			for i, m := range marks {
				switch {
				case m.live:
					rs[i] = resolved{m.seq, 0, int(postboxdriver.NotInFlight)}
				case m.inflight == int(postboxdriver.InFlightAlone):
					rs[i] = resolved{m.seq, 1, int(postboxdriver.Suspected)}
				default:
					rs[i] = resolved{m.seq, 0, int(postboxdriver.Suspected)}
				}
			}
			b, err := json.Marshal(rs)
			if err != nil {
				return err
			}
			if _, err := s.q.markCrashes.exec(ctx, c, string(b)); err != nil {
				return err
			}
		}
		out, err = query(ctx, c, s.q.suspects, []any{list}, sqlkit.ScanSuspect)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// MarkInFlight implements postboxdriver.Executor, in one transaction that
// holds the fence's leases.
func (s *store) MarkInFlight(ctx context.Context, f postboxdriver.Fence, seqs []int64, mark postboxdriver.InFlight, clear []int64) (int, error) {
	if len(seqs) == 0 && len(clear) == 0 {
		return 0, nil
	}
	type row struct {
		Seq  int64 `json:"s"`
		Mark bool  `json:"m"`
	}
	list := make([]row, 0, len(seqs)+len(clear))
	marked := make(map[int64]bool, len(seqs))
	for _, seq := range seqs {
		if !marked[seq] {
			marked[seq] = true
			list = append(list, row{seq, true})
		}
	}
	for _, seq := range clear {
		if !marked[seq] {
			marked[seq] = true
			list = append(list, row{seq, false})
		}
	}
	b, err := json.Marshal(list)
	if err != nil {
		return 0, err
	}
	rows := string(b)
	var n int64
	err = s.write(ctx, func(c conn) error {
		parts, err := s.fence(ctx, c, f)
		if err != nil {
			return err
		}
		n, err = s.q.markInFlight.exec(ctx, c, rows, parts, f.Owner, int(mark))
		return err
	})
	return int(n), err
}

// Stats implements postboxdriver.Executor.
func (s *store) Stats(ctx context.Context) (postboxdriver.Stats, error) {
	st, err := sqlkit.ScanStats(s.q.stats.row(ctx, s.conn()))
	return st, s.wrap(err)
}

// Migrations implements postboxdriver.Executor.
func (s *store) Migrations() []postboxdriver.Migration {
	return postboxdriver.LoadMigrations(migrationFS, "migrations", s.prefix)
}

// AppliedMigrations implements postboxdriver.Executor.
func (s *store) AppliedMigrations(ctx context.Context) ([]int, error) {
	vs, err := query(ctx, s.conn(), s.q.applied, nil, func(r *sql.Rows) (int, error) {
		var v int
		return v, r.Scan(&v)
	})
	if errNumber(err) == errNoSuchTable {
		return nil, nil
	}
	return vs, err
}

// migrationLockSeconds is how long a migrator waits for another to
// finish.
const migrationLockSeconds = 60

// ApplyMigration implements postboxdriver.Executor. MySQL commits each DDL
// statement at once, so a migration cannot be one transaction: migrators
// take a named lock (GET_LOCK) on one connection instead, and each
// re-checks the version under it, so replicas starting together apply it
// once. Every statement of a migration is idempotent, so one cut short is
// applied again whole.
func (s *store) ApplyMigration(ctx context.Context, m postboxdriver.Migration) error {
	c, err := s.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	lock := "postbox_migrate_" + s.prefix
	var got sql.NullInt64
	if err := c.QueryRowContext(ctx, "SELECT GET_LOCK(?, ?)", lock, migrationLockSeconds).Scan(&got); err != nil {
		return err
	}
	if !got.Valid || got.Int64 != 1 {
		return fmt.Errorf("postboxmysql: another migrator held the lock %q for %d s", lock, migrationLockSeconds)
	}
	defer func() { _, _ = c.ExecContext(context.WithoutCancel(ctx), "SELECT RELEASE_LOCK(?)", lock) }()
	if _, err := s.q.createMigrations.exec(ctx, c); err != nil {
		return err
	}
	var done bool
	if err := s.q.migrationDone.row(ctx, c, m.Version).Scan(&done); err != nil {
		return err
	}
	if done {
		return nil
	}
	for _, st := range Statements(m.SQL) {
		if _, err := c.ExecContext(ctx, st); err != nil {
			return fmt.Errorf("migration %d (%s): %w", m.Version, m.Name, err)
		}
	}
	_, err = s.q.recordMigration.exec(ctx, c, m.Version, m.Name)
	return err
}

// Statements splits a migration into its statements, as the mysql client
// reads a script: each ends with the delimiter (";" at the end of a line,
// until a DELIMITER line sets another). Comment lines are dropped.
func Statements(script string) []string {
	var out []string
	delim := ";"
	var cur strings.Builder
	flush := func() {
		if st := strings.TrimSpace(cur.String()); st != "" {
			out = append(out, st)
		}
		cur.Reset()
	}
	for _, line := range strings.Split(script, "\n") {
		trimmed := strings.TrimSpace(line)
		if d, ok := strings.CutPrefix(trimmed, "DELIMITER "); ok {
			flush()
			delim = strings.TrimSpace(d)
			continue
		}
		if strings.HasPrefix(trimmed, "--") {
			continue
		}
		if l := strings.TrimRight(line, " \t\r"); strings.HasSuffix(l, delim) {
			cur.WriteString(l[:len(l)-len(delim)])
			flush()
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
	}
	flush()
	return out
}

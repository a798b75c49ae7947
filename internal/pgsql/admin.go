package pgsql

import (
	"context"
	"strings"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

type adminQueries struct {
	partitionStats, leaseList, consumerDeadStats,
	topicStats, listDead, getDead, requeueDead, deleteDead, prunePublished,
	listReplays, replayCounts string
	replay ReplayStatements
}

// deadWhere selects dead messages by the filter's parameters $1..$5.
const deadWhere = `(cardinality($1::uuid[]) = 0 OR d.id = ANY($1::uuid[]))
  AND ($2 = '' OR d.topic = $2) AND ($3 = '' OR d.key = $3)
  AND ($4::timestamptz IS NULL OR d.dead_at >= $4) AND ($5::timestamptz IS NULL OR d.dead_at < $5)`

const deadMessageColumns = `d.seq, d.id::text, d.topic, coalesce(d.key, ''), d.payload, d.headers::text, d.attempts, coalesce(d.last_error, ''), d.created_at, d.dead_at`

// ReplayWhere selects history rows aliased a by the request's $1..$4,
// leaving out any whose id is pending again already in the outbox (an
// earlier replay not yet sent).
func ReplayWhere(a string) string {
	return ReplayNewWhere(a) + `
  AND NOT EXISTS (SELECT 1 FROM {p}outbox o WHERE o.id = ` + a + `.id)`
}

// ReplayNewWhere selects history rows aliased a by $1..$4 for a replay as
// new messages: every one, since the copies have ids of their own.
func ReplayNewWhere(a string) string {
	return strings.NewReplacer("p.", a+".").Replace(`p.created_at >= $1 AND p.created_at < $2 AND ($3 = '' OR p.topic = $3) AND ($4 = '' OR p.key = $4)`)
}

var replayWhere = ReplayWhere("p")

// PendingElsewhere is the CTE pend, materialized: the ids that pending
// selects, of the messages pending elsewhere than the outbox (the log's),
// which a replay under the messages' own ids leaves out
// (NotPendingElsewhere).
func PendingElsewhere(pending string) string {
	return "pend AS MATERIALIZED (\n  " + pending + "\n)"
}

// NotPendingElsewhere is a replay's test that the history row aliased a
// has no id in the CTE pend (PendingElsewhere).
func NotPendingElsewhere(a string) string {
	return `NOT EXISTS (SELECT 1 FROM pend WHERE pend.id = ` + a + `.id)`
}

func makeAdminQueries(prefix string) adminQueries {
	r := strings.NewReplacer("{p}", prefix)
	return adminQueries{
		partitionStats: r.Replace(`SELECT count(*)::int, (count(*) FILTER (WHERE owner IS NULL OR expires_at <= now()))::int,
  (SELECT count(*) FROM {p}relays WHERE expires_at > now())::int
FROM {p}leases`),
		leaseList: r.Replace(`SELECT partition, coalesce(owner, ''), generation, greatest(expires_at, 'epoch'), owner IS NULL OR expires_at <= now(), now()
FROM {p}leases ORDER BY partition`),
		consumerDeadStats: r.Replace(`SELECT consumer, topic, count(*), count(requeue_requested_at) FROM {p}consumer_dead
GROUP BY consumer, topic ORDER BY consumer, topic`),
		topicStats: TopicStatsSQL(prefix, "", ""),
		listDead: r.Replace(`SELECT ` + deadMessageColumns + ` FROM {p}dead d WHERE ` + deadWhere + `
ORDER BY d.dead_at DESC, d.seq DESC LIMIT $6`),
		getDead: r.Replace(`SELECT ` + deadMessageColumns + ` FROM {p}dead d WHERE d.id = $1::uuid`),
		// The original seq puts a requeued message back in its place: first
		// in line, and in order among its key's messages still pending.
		// A dead message whose id is pending again (written anew after it
		// died) stays dead: the outbox holds an id once.
		requeueDead: RequeueDeadSQL(prefix, ""),
		deleteDead:  r.Replace(`WITH del AS (DELETE FROM {p}dead d WHERE ` + deadWhere + ` RETURNING 1) SELECT count(*) FROM del`),
		prunePublished: r.Replace(`WITH old AS (
  SELECT ctid FROM {p}published WHERE published_at < now() - $1 * interval '1 millisecond' LIMIT $2
), del AS (
  DELETE FROM {p}published p USING old WHERE p.ctid = old.ctid RETURNING 1
)
SELECT count(*) FROM del`),
		replay: ReplaySQL(prefix, `{p}published p`, "", `moved AS (
  DELETE FROM {p}published p WHERE `+replayWhere+`
  RETURNING p.seq, p.id, p.topic, p.key, p.payload, p.headers, p.partition
)`),
		listReplays: r.Replace(`SELECT id, at, actor, since, until, topic, key, count, dry_run, as_new FROM {p}replays ORDER BY id DESC LIMIT $1`),
		replayCounts: r.Replace(`SELECT p.topic, count(*)::int,
  (count(*) FILTER (WHERE $5 > 0 AND p.published_at >= now() - $5 * interval '1 millisecond'))::int
FROM {p}published p WHERE ` + replayWhere + `
GROUP BY p.topic ORDER BY p.topic`),
	}
}

// TopicStatsSQL is TopicStats' statement for the tables named with
// prefix. morePending, if set, adds rows (topic, created_at) pending
// elsewhere than the outbox (a UNION ALL arm), and moreRecent rows
// (topic, n, lag) of n messages published elsewhere than the published
// table in the last minute, lag the longest time from creation to
// publish among them.
func TopicStatsSQL(prefix, morePending, moreRecent string) string {
	if morePending != "" {
		morePending = "\nUNION ALL\n" + morePending
	}
	if moreRecent != "" {
		moreRecent = "\n  UNION ALL\n  " + moreRecent
	}
	return strings.ReplaceAll(`WITH pend AS (
SELECT topic, created_at FROM {p}outbox`+morePending+`
), pending AS (
  SELECT topic, count(*) AS n, extract(epoch FROM now() - min(created_at)) AS age FROM pend GROUP BY topic
), dead AS (
  SELECT topic, count(*) AS n FROM {p}dead GROUP BY topic
), pub AS (
  SELECT topic, 1::bigint AS n, published_at - created_at AS lag FROM {p}published
  WHERE published_at > now() - interval '1 minute'`+moreRecent+`
), recent AS (
  SELECT topic, sum(n)::bigint AS n, extract(epoch FROM max(lag)) AS lag FROM pub GROUP BY topic
)
SELECT t.topic, coalesce(pending.n, 0), coalesce(dead.n, 0), coalesce(pending.age, 0)::float8, coalesce(recent.n, 0),
  greatest(coalesce(recent.lag, 0), 0)::float8
FROM (SELECT topic FROM pending UNION SELECT topic FROM dead UNION SELECT topic FROM recent) t
LEFT JOIN pending USING (topic) LEFT JOIN dead USING (topic) LEFT JOIN recent USING (topic)
ORDER BY t.topic`, "{p}", prefix)
}

// ReplayStatements are a replay's statements: under the messages' own
// ids (Move, Count, Audit) and as new messages (Copy, CopyCount,
// CopyAudit). Move, Count, Copy and CopyCount select by $1–$4 (the
// window, topic and key), Move and Copy taking the actor as $5; the
// audits record a dry run: the actor, the window, topic and key, and the
// count.
type ReplayStatements struct {
	Move, Count, Audit, Copy, CopyCount, CopyAudit string
}

// ReplaySQL is the replay's statements for the tables named with prefix.
// history is a FROM item aliased p of the published messages, with the
// published table's seq, id, topic, key, payload, headers, partition and
// created_at; move is a list of CTEs, the last named moved, that delete
// from the history the rows ReplayWhere selects and return their seq, id,
// topic, key, payload, headers and partition.
//
// Rows go back under their own ids, in their original order, with new
// seqs after everything pending; the history keeps one row per id, so
// they leave it until they are published again. Copies as new messages
// take the audit entry's id first, so that every copy can name it; they
// get fresh ids and leave the history as it was. Copies are inserted
// without a partition, so the rules trigger checks them and, while the
// database says log, moves them into the log (migration 14), where the
// outbox's insert returns no row: they are counted from their source.
//
// pending, when not empty, selects the id of every message pending
// elsewhere than the outbox (the log's). The statements under the
// messages' own ids then put it first (PendingElsewhere); the count
// leaves those ids out as it leaves out the outbox's, and move must too
// (NotPendingElsewhere): a replayed row would otherwise be sent beside
// the pending message of its id.
func ReplaySQL(prefix, history, pending, move string) ReplayStatements {
	r := strings.NewReplacer("{p}", prefix)
	replayNewWhere := ReplayNewWhere("p")
	with, count := "", `SELECT count(*) FROM `+history+` WHERE `+replayWhere
	if pending != "" {
		with = PendingElsewhere(pending) + ", "
		count = "WITH " + PendingElsewhere(pending) + "\n" + count + "\n  AND " + NotPendingElsewhere("p")
	}
	return ReplayStatements{
		Move: r.Replace(`WITH ` + with + move + `, staged AS (
  INSERT INTO {p}outbox (id, topic, key, payload, headers, partition)
  SELECT id, topic, key, payload, headers, partition FROM moved ORDER BY seq
  RETURNING 1
), n AS (
  SELECT count(*) AS n FROM staged
), audit AS (
  INSERT INTO {p}replays (actor, since, until, topic, key, count, dry_run) SELECT $5, $1, $2, $3, $4, n, false FROM n
)
SELECT n FROM n`),
		Count: r.Replace(count),
		Audit: r.Replace(`INSERT INTO {p}replays (actor, since, until, topic, key, count, dry_run) VALUES ($1, $2, $3, $4, $5, $6, true)`),
		Copy: r.Replace(`WITH aid AS (
  SELECT nextval(pg_get_serial_sequence('{p}replays', 'id')) AS id
), src AS MATERIALIZED (
  SELECT p.seq, p.id, p.topic, p.key, p.payload, p.headers FROM ` + history + ` WHERE ` + replayNewWhere + `
), copied AS (
  INSERT INTO {p}outbox (id, topic, key, payload, headers)
  SELECT gen_random_uuid(), topic, key, payload,
    headers || jsonb_build_object('` + postboxdriver.HeaderReplayOf + `', id::text, '` + postboxdriver.HeaderReplay + `', (SELECT id FROM aid)::text)
  FROM src ORDER BY seq
), n AS (
  SELECT count(*) AS n FROM src
), audit AS (
  INSERT INTO {p}replays (id, actor, since, until, topic, key, count, dry_run, as_new) OVERRIDING SYSTEM VALUE
  SELECT (SELECT id FROM aid), $5, $1, $2, $3, $4, n, false, true FROM n
)
SELECT n FROM n`),
		CopyCount: r.Replace(`SELECT count(*) FROM ` + history + ` WHERE ` + replayNewWhere),
		CopyAudit: r.Replace(`INSERT INTO {p}replays (actor, since, until, topic, key, count, dry_run, as_new) VALUES ($1, $2, $3, $4, $5, $6, true, true)`),
	}
}

// horizonSQL is 1 when a window starting at $1 starts more than $2
// milliseconds ago, else 0.
const horizonSQL = `SELECT ($1::timestamptz < now() - $2 * interval '1 millisecond')::int`

// RunReplay runs the replay r with st (Replay of postboxdriver.Executor):
// count runs a statement that returns one count, exec one that returns
// nothing.
func RunReplay(ctx context.Context, st ReplayStatements, r postboxdriver.ReplayParams,
	count func(ctx context.Context, sql string, args ...any) (int, error),
	exec func(ctx context.Context, sql string, args ...any) error,
) (int, error) {
	run, counted, audit := st.Move, st.Count, st.Audit
	if r.AsNew {
		// Copies under fresh ids: no consumer has seen them, so no horizon.
		run, counted, audit = st.Copy, st.CopyCount, st.CopyAudit
	} else if r.Horizon > 0 {
		tooOld, err := count(ctx, horizonSQL, r.Since, r.Horizon.Milliseconds())
		if err != nil {
			return 0, err
		}
		if tooOld > 0 {
			return 0, postboxdriver.ErrBeyondHorizon
		}
	}
	if !r.DryRun {
		return count(ctx, run, r.Since, r.Until, r.Topic, r.Key, r.Actor)
	}
	n, err := count(ctx, counted, r.Since, r.Until, r.Topic, r.Key)
	if err != nil {
		return 0, err
	}
	return n, exec(ctx, audit, r.Actor, r.Since, r.Until, r.Topic, r.Key, n)
}

// RequeueDeadSQL is RequeueDeadMessages' statement for the tables named
// with prefix ($1–$5 the filter's DeadArgs): the dead messages selected go
// back to the outbox under their seqs, but for those whose id is pending
// again, in the outbox or where pendingElsewhere (a condition on the dead
// row d, "" for none) says.
func RequeueDeadSQL(prefix, pendingElsewhere string) string {
	if pendingElsewhere != "" {
		pendingElsewhere = `
    AND NOT (` + pendingElsewhere + `)`
	}
	return strings.ReplaceAll(`WITH moved AS (
  DELETE FROM {p}dead d WHERE `+deadWhere+`
    AND NOT EXISTS (SELECT 1 FROM {p}outbox o WHERE o.id = d.id)`+pendingElsewhere+`
  RETURNING d.seq, d.id, d.topic, d.key, d.payload, d.headers, d.created_at, d.partition
), back AS (
  INSERT INTO {p}outbox (seq, id, topic, key, payload, headers, created_at, partition) OVERRIDING SYSTEM VALUE
  SELECT seq, id, topic, key, payload, headers, created_at, partition FROM moved
  RETURNING 1
)
SELECT count(*) FROM back`, "{p}", prefix)
}

// DeadArgs are the parameters $1–$5 of the statements that select dead
// messages by f.
func DeadArgs(f postboxdriver.DeadFilter) []any { return deadArgs(f) }

func deadArgs(f postboxdriver.DeadFilter) []any {
	ids := f.IDs
	if ids == nil {
		ids = []string{}
	}
	return []any{ids, f.Topic, f.Key, timeOrNil(f.Since), timeOrNil(f.Until)}
}

// timeOrNil binds a zero time as NULL: no bound.
func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func limitOr100(n int) int {
	if n <= 0 {
		return 100
	}
	return n
}

func scanDeadMessage(r Rows) (postboxdriver.DeadMessage, error) {
	var d postboxdriver.DeadMessage
	var headers string
	err := r.Scan(&d.Seq, &d.ID, &d.Topic, &d.Key, &d.Payload, &headers, &d.Attempts, &d.Error, &d.CreatedAt, &d.DeadAt)
	d.Headers = []byte(headers)
	return d, err
}

// PartitionStats implements postboxdriver.Executor.
func (c *Core) PartitionStats(ctx context.Context) (postboxdriver.PartitionStats, error) {
	var p postboxdriver.PartitionStats
	if err := c.queryRow(ctx, c.db, c.aq.partitionStats, nil, &p.Total, &p.Unowned, &p.Relays); err != nil {
		return p, err
	}
	var err error
	p.Leases, err = queryAll(ctx, c, c.aq.leaseList, nil, func(r Rows) (postboxdriver.Lease, error) {
		var l postboxdriver.Lease
		err := r.Scan(&l.Partition, &l.Owner, &l.Generation, &l.ExpiresAt, &l.Expired, &p.Now)
		return l, err
	})
	return p, err
}

// ConsumerDeadStats implements postboxdriver.Executor.
func (c *Core) ConsumerDeadStats(ctx context.Context) ([]postboxdriver.ConsumerDeadStat, error) {
	return queryAll(ctx, c, c.aq.consumerDeadStats, nil, func(r Rows) (postboxdriver.ConsumerDeadStat, error) {
		var s postboxdriver.ConsumerDeadStat
		err := r.Scan(&s.Consumer, &s.Topic, &s.Count, &s.RequeueRequested)
		return s, err
	})
}

// TopicStats implements postboxdriver.Executor.
func (c *Core) TopicStats(ctx context.Context) ([]postboxdriver.TopicStats, error) {
	return queryAll(ctx, c, c.aq.topicStats, nil, func(r Rows) (postboxdriver.TopicStats, error) { return ScanTopicStats(r.Scan) })
}

// ScanTopicStats reads a row of TopicStatsSQL's statement with scan.
func ScanTopicStats(scan func(dest ...any) error) (postboxdriver.TopicStats, error) {
	var t postboxdriver.TopicStats
	var age, lag float64
	err := scan(&t.Topic, &t.Pending, &t.Dead, &age, &t.PublishedLastMinute, &lag)
	t.OldestPendingAge = time.Duration(age * float64(time.Second))
	t.PublishLagLastMinute = time.Duration(lag * float64(time.Second))
	return t, err
}

// ListDeadMessages implements postboxdriver.Executor.
func (c *Core) ListDeadMessages(ctx context.Context, f postboxdriver.DeadFilter) ([]postboxdriver.DeadMessage, error) {
	return queryAll(ctx, c, c.aq.listDead, append(deadArgs(f), limitOr100(f.Limit)), scanDeadMessage)
}

// GetDeadMessage implements postboxdriver.Executor.
func (c *Core) GetDeadMessage(ctx context.Context, id string) (postboxdriver.DeadMessage, error) {
	return queryOne(ctx, c, c.aq.getDead, []any{id}, scanDeadMessage)
}

// RequeueDeadMessages implements postboxdriver.Executor.
func (c *Core) RequeueDeadMessages(ctx context.Context, f postboxdriver.DeadFilter) (int, error) {
	return c.count(ctx, c.aq.requeueDead, deadArgs(f)...)
}

// DeleteDeadMessages implements postboxdriver.Executor.
func (c *Core) DeleteDeadMessages(ctx context.Context, f postboxdriver.DeadFilter) (int, error) {
	return c.count(ctx, c.aq.deleteDead, deadArgs(f)...)
}

// PrunePublished implements postboxdriver.Executor.
func (c *Core) PrunePublished(ctx context.Context, age time.Duration, limit int) (int, error) {
	return c.count(ctx, c.aq.prunePublished, age.Milliseconds(), limit)
}

// Replay implements postboxdriver.Executor.
func (c *Core) Replay(ctx context.Context, r postboxdriver.ReplayParams) (int, error) {
	return RunReplay(ctx, c.aq.replay, r, c.count, func(ctx context.Context, sql string, args ...any) error {
		_, err := c.exec(ctx, sql, args...)
		return err
	})
}

// ListReplays implements postboxdriver.Executor.
func (c *Core) ListReplays(ctx context.Context, limit int) ([]postboxdriver.ReplayAudit, error) {
	return queryAll(ctx, c, c.aq.listReplays, []any{limitOr100(limit)}, func(r Rows) (postboxdriver.ReplayAudit, error) {
		var a postboxdriver.ReplayAudit
		err := r.Scan(&a.ID, &a.At, &a.Actor, &a.Since, &a.Until, &a.Topic, &a.Key, &a.Count, &a.DryRun, &a.AsNew)
		return a, err
	})
}

// ReplayCounts implements postboxdriver.Executor.
func (c *Core) ReplayCounts(ctx context.Context, r postboxdriver.ReplayParams, recent time.Duration) ([]postboxdriver.ReplayCount, error) {
	return queryAll(ctx, c, c.aq.replayCounts, ReplayCountsArgs(r, recent),
		func(rs Rows) (postboxdriver.ReplayCount, error) { return ScanReplayCount(rs.Scan) })
}

// ReplayCountsArgs are ReplayCounts' parameters: the window, topic, key,
// and recent in milliseconds.
func ReplayCountsArgs(r postboxdriver.ReplayParams, recent time.Duration) []any {
	return []any{r.Since, r.Until, r.Topic, r.Key, recent.Milliseconds()}
}

// ScanReplayCount reads a row of a ReplayCounts statement with scan: the
// topic, the count, the recent count.
func ScanReplayCount(scan func(dest ...any) error) (postboxdriver.ReplayCount, error) {
	var n postboxdriver.ReplayCount
	err := scan(&n.Topic, &n.Count, &n.Recent)
	return n, err
}

package postboxsqlite

import (
	"context"
	"database/sql"
	"strings"
	"time"

	"github.com/postbox-go/postbox/internal/sqlkit"
	"github.com/postbox-go/postbox/postboxdriver"
)

type adminQueries struct {
	partitionStats, consumerDeadStats,
	topicStats, listDead, getDead, requeueInsert, requeueDelete, deleteDead, prunePublished,
	horizon, replayCount, replayInsert, replayDelete, replayAudit, listReplays string
	replayNewAudit, replayNewInsert, replayNewCount, replayNewCounted, replayCounts string
}

// deadWhere selects dead messages by ?1 (a JSON array of ids, empty for
// any), ?2 topic, ?3 key, ?4 and ?5 the dead_at window (NULL for open).
const deadWhere = `(json_array_length(?1) = 0 OR d.id IN (SELECT value FROM json_each(?1)))
  AND (?2 = '' OR d.topic = ?2) AND (?3 = '' OR d.key = ?3)
  AND (?4 IS NULL OR d.dead_at >= ?4) AND (?5 IS NULL OR d.dead_at < ?5)`

const deadMessageColumns = `d.seq, d.id, d.topic, coalesce(d.key, ''), d.payload, d.headers, d.attempts, coalesce(d.last_error, ''), d.created_at, d.dead_at`

// replayWhere selects published rows by ?1..?4, leaving out any whose id
// is pending again already.
const replayWhere = replayNewWhere + `
  AND NOT EXISTS (SELECT 1 FROM {p}outbox o WHERE o.id = p.id)`

// replayNewWhere selects published rows by ?1..?4 for a replay as new
// messages: every one, since the copies have ids of their own.
const replayNewWhere = `p.created_at >= ?1 AND p.created_at < ?2 AND (?3 = '' OR p.topic = ?3) AND (?4 = '' OR p.key = ?4)`

// newUUID is a random (version 4) UUID in SQL: SQLite has no function for
// one.
const newUUID = `lower(hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-4' || substr(hex(randomblob(2)), 2) || '-' ||
  substr('89ab', 1 + (abs(random()) % 4), 1) || substr(hex(randomblob(2)), 2) || '-' || hex(randomblob(6)))`

func makeAdminQueries(prefix string) adminQueries {
	r := strings.NewReplacer("{p}", prefix, "{now}", nowExpr)
	return adminQueries{
		partitionStats: r.Replace(`SELECT count(*), coalesce(sum(CASE WHEN owner IS NULL OR expires_at <= {now} THEN 1 ELSE 0 END), 0),
  (SELECT count(*) FROM {p}relays WHERE expires_at > {now})
FROM {p}leases`),
		consumerDeadStats: r.Replace(`SELECT consumer, topic, count(*), count(requeue_requested_at) FROM {p}consumer_dead
GROUP BY consumer, topic ORDER BY consumer, topic`),
		topicStats: r.Replace(`WITH pending AS (
  SELECT topic, count(*) AS n, {now} - min(created_at) AS age FROM {p}outbox GROUP BY topic
), dead AS (
  SELECT topic, count(*) AS n FROM {p}dead GROUP BY topic
), recent AS (
  SELECT topic, count(*) AS n, max(published_at - created_at) AS lag FROM {p}published WHERE published_at > {now} - 60000 GROUP BY topic
), t AS (
  SELECT topic FROM pending UNION SELECT topic FROM dead UNION SELECT topic FROM recent
)
SELECT t.topic, coalesce(pending.n, 0), coalesce(dead.n, 0), coalesce(pending.age, 0), coalesce(recent.n, 0), max(coalesce(recent.lag, 0), 0)
FROM t LEFT JOIN pending USING (topic) LEFT JOIN dead USING (topic) LEFT JOIN recent USING (topic)
ORDER BY t.topic`),
		listDead: r.Replace(`SELECT ` + deadMessageColumns + ` FROM {p}dead d WHERE ` + deadWhere + `
ORDER BY d.dead_at DESC, d.seq DESC LIMIT ?6`),
		getDead: r.Replace(`SELECT ` + deadMessageColumns + ` FROM {p}dead d WHERE d.id = ?`),
		// Back under the original seq: first in line, and in order among
		// its key's messages still pending.
		// A dead message whose id is pending again (written anew after it
		// died) stays dead: the outbox holds an id once.
		requeueInsert: r.Replace(`INSERT INTO {p}outbox (seq, id, topic, key, payload, headers, partition, created_at)
SELECT d.seq, d.id, d.topic, d.key, d.payload, d.headers, d.partition, d.created_at FROM {p}dead d WHERE ` + deadWhere + `
  AND NOT EXISTS (SELECT 1 FROM {p}outbox o WHERE o.id = d.id)`),
		// After the insert, exactly the moved rows have their seq pending.
		requeueDelete: r.Replace(`DELETE FROM {p}dead AS d WHERE ` + deadWhere + `
  AND EXISTS (SELECT 1 FROM {p}outbox o WHERE o.seq = d.seq)`),
		deleteDead: r.Replace(`DELETE FROM {p}dead AS d WHERE ` + deadWhere),
		prunePublished: r.Replace(`DELETE FROM {p}published WHERE rowid IN (
  SELECT rowid FROM {p}published WHERE published_at < {now} - ?1 LIMIT ?2)`),
		horizon:     r.Replace(`SELECT ?1 < {now} - ?2`),
		replayCount: r.Replace(`SELECT count(*) FROM {p}published p WHERE ` + replayWhere),
		replayInsert: r.Replace(`INSERT INTO {p}outbox (id, topic, key, payload, headers, partition)
SELECT p.id, p.topic, p.key, p.payload, p.headers, p.partition FROM {p}published p WHERE ` + replayWhere + `
ORDER BY p.seq`),
		// After the insert, exactly the moved rows have their id pending.
		replayDelete: r.Replace(`DELETE FROM {p}published AS p WHERE p.created_at >= ?1 AND p.created_at < ?2
  AND (?3 = '' OR p.topic = ?3) AND (?4 = '' OR p.key = ?4)
  AND EXISTS (SELECT 1 FROM {p}outbox o WHERE o.id = p.id)`),
		replayAudit:    r.Replace(`INSERT INTO {p}replays (actor, since, until, topic, key, count, dry_run) VALUES (?, ?, ?, ?, ?, ?, ?)`),
		listReplays:    r.Replace(`SELECT id, at, actor, since, until, topic, key, count, dry_run, as_new FROM {p}replays ORDER BY id DESC LIMIT ?`),
		replayNewAudit: r.Replace(`INSERT INTO {p}replays (actor, since, until, topic, key, count, dry_run, as_new) VALUES (?, ?, ?, ?, ?, 0, ?, 1) RETURNING id`),
		// A copy keeps the original's partition: the same key, so the same
		// partition, for a keyed message; any partition serves a message
		// without a key.
		replayNewInsert: r.Replace(`INSERT INTO {p}outbox (id, topic, key, payload, headers, partition)
SELECT ` + newUUID + `, p.topic, p.key, p.payload,
  json_set(p.headers, '$."` + postboxdriver.HeaderReplayOf + `"', p.id, '$."` + postboxdriver.HeaderReplay + `"', CAST(?5 AS TEXT)), p.partition
FROM {p}published p WHERE ` + replayNewWhere + `
ORDER BY p.seq`),
		replayNewCount:   r.Replace(`SELECT count(*) FROM {p}published p WHERE ` + replayNewWhere),
		replayNewCounted: r.Replace(`UPDATE {p}replays SET count = ? WHERE id = ?`),
		replayCounts: r.Replace(`SELECT p.topic, count(*),
  coalesce(sum(CASE WHEN ?5 > 0 AND p.published_at >= {now} - ?5 THEN 1 ELSE 0 END), 0)
FROM {p}published p WHERE ` + replayWhere + `
GROUP BY p.topic ORDER BY p.topic`),
	}
}

// notFound maps QueryRow's no-row error to ErrNotFound.
func (s *store) notFound(err error) error { return s.wrap(sqlkit.NotFound(err)) }

// PartitionStats implements postboxdriver.Executor.
func (s *store) PartitionStats(ctx context.Context) (postboxdriver.PartitionStats, error) {
	var p postboxdriver.PartitionStats
	if err := s.conn().QueryRowContext(ctx, s.aq.partitionStats).Scan(&p.Total, &p.Unowned, &p.Relays); err != nil {
		return p, s.wrap(err)
	}
	var err error
	p.Leases, err = sqlkit.QueryAll(ctx, s.conn(), s.q.leases, nil, sqlkit.ScanLease(&p.Now))
	return p, s.wrap(err)
}

// ConsumerDeadStats implements postboxdriver.Executor.
func (s *store) ConsumerDeadStats(ctx context.Context) ([]postboxdriver.ConsumerDeadStat, error) {
	out, err := sqlkit.QueryAll(ctx, s.conn(), s.aq.consumerDeadStats, nil, sqlkit.ScanConsumerDeadStat)
	return out, s.wrap(err)
}

// TopicStats implements postboxdriver.Executor.
func (s *store) TopicStats(ctx context.Context) ([]postboxdriver.TopicStats, error) {
	out, err := sqlkit.QueryAll(ctx, s.conn(), s.aq.topicStats, nil, sqlkit.ScanTopicStats)
	return out, s.wrap(err)
}

// ListDeadMessages implements postboxdriver.Executor.
func (s *store) ListDeadMessages(ctx context.Context, f postboxdriver.DeadFilter) ([]postboxdriver.DeadMessage, error) {
	out, err := sqlkit.QueryAll(ctx, s.conn(), s.aq.listDead, append(sqlkit.DeadArgs(f), sqlkit.LimitOr100(f.Limit)),
		func(r *sql.Rows) (postboxdriver.DeadMessage, error) { return sqlkit.ScanDeadMessage(r) })
	return out, s.wrap(err)
}

// GetDeadMessage implements postboxdriver.Executor.
func (s *store) GetDeadMessage(ctx context.Context, id string) (postboxdriver.DeadMessage, error) {
	d, err := sqlkit.ScanDeadMessage(s.conn().QueryRowContext(ctx, s.aq.getDead, id))
	return d, s.notFound(err)
}

// RequeueDeadMessages implements postboxdriver.Executor: the copy and the
// delete run in one IMMEDIATE transaction, so they see the same rows.
func (s *store) RequeueDeadMessages(ctx context.Context, f postboxdriver.DeadFilter) (int, error) {
	var n int64
	err := s.write(ctx, func(c conn) error {
		var err error
		if n, err = sqlkit.Affected(c.ExecContext(ctx, s.aq.requeueInsert, sqlkit.DeadArgs(f)...)); err != nil {
			return err
		}
		_, err = c.ExecContext(ctx, s.aq.requeueDelete, sqlkit.DeadArgs(f)...)
		return err
	})
	return int(n), err
}

// DeleteDeadMessages implements postboxdriver.Executor.
func (s *store) DeleteDeadMessages(ctx context.Context, f postboxdriver.DeadFilter) (int, error) {
	n, err := sqlkit.Affected(s.conn().ExecContext(ctx, s.aq.deleteDead, sqlkit.DeadArgs(f)...))
	return int(n), s.wrap(err)
}

// PrunePublished implements postboxdriver.Executor.
func (s *store) PrunePublished(ctx context.Context, age time.Duration, limit int) (int, error) {
	n, err := sqlkit.Affected(s.conn().ExecContext(ctx, s.aq.prunePublished, age.Milliseconds(), limit))
	return int(n), s.wrap(err)
}

// Replay implements postboxdriver.Executor.
func (s *store) Replay(ctx context.Context, r postboxdriver.ReplayParams) (int, error) {
	since, until := r.Since.UnixMilli(), r.Until.UnixMilli()
	var n int64
	if r.AsNew {
		err := s.write(ctx, func(c conn) error {
			var id int64
			if err := c.QueryRowContext(ctx, s.aq.replayNewAudit, r.Actor, since, until, r.Topic, r.Key, r.DryRun).Scan(&id); err != nil {
				return err
			}
			var err error
			if r.DryRun {
				err = c.QueryRowContext(ctx, s.aq.replayNewCount, since, until, r.Topic, r.Key).Scan(&n)
			} else {
				n, err = sqlkit.Affected(c.ExecContext(ctx, s.aq.replayNewInsert, since, until, r.Topic, r.Key, id))
			}
			if err != nil {
				return err
			}
			_, err = c.ExecContext(ctx, s.aq.replayNewCounted, n, id)
			return err
		})
		return int(n), err
	}
	err := s.write(ctx, func(c conn) error {
		if r.Horizon > 0 {
			var tooOld bool
			if err := c.QueryRowContext(ctx, s.aq.horizon, since, r.Horizon.Milliseconds()).Scan(&tooOld); err != nil {
				return err
			}
			if tooOld {
				return postboxdriver.ErrBeyondHorizon
			}
		}
		if r.DryRun {
			if err := c.QueryRowContext(ctx, s.aq.replayCount, since, until, r.Topic, r.Key).Scan(&n); err != nil {
				return err
			}
		} else {
			var err error
			if n, err = sqlkit.Affected(c.ExecContext(ctx, s.aq.replayInsert, since, until, r.Topic, r.Key)); err != nil {
				return err
			}
			if _, err := c.ExecContext(ctx, s.aq.replayDelete, since, until, r.Topic, r.Key); err != nil {
				return err
			}
		}
		_, err := c.ExecContext(ctx, s.aq.replayAudit, r.Actor, since, until, r.Topic, r.Key, n, r.DryRun)
		return err
	})
	if err != nil {
		return 0, err
	}
	return int(n), nil
}

// ListReplays implements postboxdriver.Executor.
func (s *store) ListReplays(ctx context.Context, limit int) ([]postboxdriver.ReplayAudit, error) {
	out, err := sqlkit.QueryAll(ctx, s.conn(), s.aq.listReplays, []any{sqlkit.LimitOr100(limit)}, sqlkit.ScanReplayAudit)
	return out, s.wrap(err)
}

// ReplayCounts implements postboxdriver.Executor.
func (s *store) ReplayCounts(ctx context.Context, r postboxdriver.ReplayParams, recent time.Duration) ([]postboxdriver.ReplayCount, error) {
	out, err := sqlkit.QueryAll(ctx, s.conn(), s.aq.replayCounts, []any{r.Since.UnixMilli(), r.Until.UnixMilli(), r.Topic, r.Key, recent.Milliseconds()},
		sqlkit.ScanReplayCount)
	return out, s.wrap(err)
}

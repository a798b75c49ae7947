package postboxmysql

import (
	"context"
	"database/sql"
	"strings"
	"time"

	"github.com/postbox-go/postbox/internal/sqlkit"
	"github.com/postbox-go/postbox/postboxdriver"
)

type adminQueries struct {
	partitionStats, consumerDeadStats, topicStats, listDead, getDead, requeueInsert, requeueDelete, deleteDead, prunePublished,
	horizon, replayCount, replayInsert, replayDelete, replayAudit, listReplays,
	replayNewAudit, replayNewInsert, replayNewCount, replayNewCounted, replayCounts,
	claimTask, takeTask, taskOwner, releaseTask stmt
}

// deadWhere selects dead messages by ?1 (a JSON array of ids, empty for
// any), ?2 topic, ?3 key, ?4 and ?5 the dead_at window (NULL for open).
var deadWhere = `(JSON_LENGTH(?1) = 0 OR d.id IN ` + strs(1) + `)
  AND (?2 = '' OR d.topic = ?2) AND (?3 = '' OR d.` + "`key`" + ` = ?3)
  AND (?4 IS NULL OR d.dead_at >= ?4) AND (?5 IS NULL OR d.dead_at < ?5)`

const deadMessageColumns = "d.seq, d.id, d.topic, COALESCE(d.`key`, ''), d.payload, d.headers, d.attempts, COALESCE(d.last_error, ''), d.created_at, d.dead_at"

// replayNewWhere selects published rows by ?1..?4 for a replay as new
// messages: every one, since the copies have ids of their own.
const replayNewWhere = "p.created_at >= ?1 AND p.created_at < ?2 AND (?3 = '' OR p.topic = ?3) AND (?4 = '' OR p.`key` = ?4)"

// replayWhere selects published rows by ?1..?4, leaving out any whose id
// is pending again already.
const replayWhere = replayNewWhere + `
  AND NOT EXISTS (SELECT 1 FROM {p}outbox o WHERE o.id = p.id)`

func makeAdminQueries(prefix string) adminQueries {
	r := strings.NewReplacer("{p}", prefix, "{now}", nowExpr)
	q := func(s string) stmt { return prep(r.Replace(s)) }
	return adminQueries{
		partitionStats: q(`SELECT count(*), COALESCE(SUM(CASE WHEN owner IS NULL OR expires_at <= {now} THEN 1 ELSE 0 END), 0),
  (SELECT count(*) FROM {p}relays WHERE expires_at > {now})
FROM {p}leases`),
		consumerDeadStats: q(`SELECT consumer, topic, count(*), count(requeue_requested_at) FROM {p}consumer_dead
GROUP BY consumer, topic ORDER BY consumer, topic`),
		topicStats: q(`WITH pending AS (
  SELECT topic, count(*) AS n, {now} - min(created_at) AS age FROM {p}outbox GROUP BY topic
), dead AS (
  SELECT topic, count(*) AS n FROM {p}dead GROUP BY topic
), recent AS (
  SELECT topic, count(*) AS n, max(published_at - created_at) AS lag FROM {p}published WHERE published_at > {now} - 60000 GROUP BY topic
), t AS (
  SELECT topic FROM pending UNION SELECT topic FROM dead UNION SELECT topic FROM recent
)
SELECT t.topic, COALESCE(pending.n, 0), COALESCE(dead.n, 0), COALESCE(pending.age, 0), COALESCE(recent.n, 0), GREATEST(COALESCE(recent.lag, 0), 0)
FROM t LEFT JOIN pending USING (topic) LEFT JOIN dead USING (topic) LEFT JOIN recent USING (topic)
ORDER BY t.topic`),
		listDead: q(`SELECT ` + deadMessageColumns + ` FROM {p}dead d WHERE ` + deadWhere + `
ORDER BY d.dead_at DESC, d.seq DESC LIMIT ?6`),
		getDead: q(`SELECT ` + deadMessageColumns + ` FROM {p}dead d WHERE d.id = ?1`),
		// Back under the original seq: first in line, and in order among
		// its key's messages still pending. A dead message whose id is
		// pending again (written anew after it died) stays dead: the outbox
		// holds an id once.
		requeueInsert: q("INSERT INTO {p}outbox (seq, id, topic, `key`, payload, headers, created_at)\n" +
			"SELECT d.seq, d.id, d.topic, d.`key`, d.payload, d.headers, d.created_at FROM {p}dead d WHERE " + deadWhere + `
  AND NOT EXISTS (SELECT 1 FROM {p}outbox o WHERE o.id = d.id)`),
		// After the insert, exactly the moved rows have their seq pending.
		requeueDelete: q(`DELETE d FROM {p}dead AS d WHERE ` + deadWhere + `
  AND EXISTS (SELECT 1 FROM {p}outbox o WHERE o.seq = d.seq)`),
		deleteDead:     q(`DELETE d FROM {p}dead AS d WHERE ` + deadWhere),
		prunePublished: q(`DELETE FROM {p}published WHERE published_at < {now} - ?1 ORDER BY published_at LIMIT ?2`),
		horizon:        q(`SELECT ?1 < {now} - ?2`),
		replayCount:    q(`SELECT count(*) FROM {p}published p WHERE ` + replayWhere),
		replayInsert: q("INSERT INTO {p}outbox (id, topic, `key`, payload, headers)\n" +
			"SELECT p.id, p.topic, p.`key`, p.payload, p.headers FROM {p}published p WHERE " + replayWhere + `
ORDER BY p.seq`),
		// After the insert, exactly the moved rows have their id pending.
		replayDelete: q(`DELETE p FROM {p}published AS p WHERE ` + replayNewWhere + `
  AND EXISTS (SELECT 1 FROM {p}outbox o WHERE o.id = p.id)`),
		replayAudit:    q("INSERT INTO {p}replays (actor, since, until, topic, `key`, count, dry_run) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"),
		listReplays:    q("SELECT id, at, actor, since, until, topic, `key`, count, dry_run, as_new FROM {p}replays ORDER BY id DESC LIMIT ?1"),
		replayNewAudit: q("INSERT INTO {p}replays (actor, since, until, topic, `key`, count, dry_run, as_new) VALUES (?1, ?2, ?3, ?4, ?5, 0, ?6, TRUE)"),
		// A copy's partition comes from its key, so a keyed message keeps
		// its partition; any partition serves a message without a key.
		replayNewInsert: q("INSERT INTO {p}outbox (id, topic, `key`, payload, headers)\n" +
			"SELECT UUID(), p.topic, p.`key`, p.payload,\n" +
			`  JSON_SET(p.headers, '$."` + postboxdriver.HeaderReplayOf + `"', p.id, '$."` + postboxdriver.HeaderReplay + `"', CAST(?5 AS CHAR))
FROM {p}published p WHERE ` + replayNewWhere + `
ORDER BY p.seq`),
		// Maintenance claims (ClaimMaintenance): the task's row, made once.
		claimTask: q(`INSERT IGNORE INTO {p}maintenance (task) VALUES (?1)`),
		takeTask: q(`UPDATE {p}maintenance SET owner = ?2, expires_at = {now} + ?3
WHERE task = ?1 AND (owner IS NULL OR owner = ?2 OR expires_at <= {now})`),
		taskOwner:        q(`SELECT owner FROM {p}maintenance WHERE task = ?1`),
		releaseTask:      q(`UPDATE {p}maintenance SET owner = NULL, expires_at = {now} WHERE task = ?1 AND owner = ?2`),
		replayNewCount:   q(`SELECT count(*) FROM {p}published p WHERE ` + replayNewWhere),
		replayNewCounted: q(`UPDATE {p}replays SET count = ?1 WHERE id = ?2`),
		replayCounts: q(`SELECT p.topic, count(*),
  COALESCE(SUM(CASE WHEN ?5 > 0 AND p.published_at >= {now} - ?5 THEN 1 ELSE 0 END), 0)
FROM {p}published p WHERE ` + replayWhere + `
GROUP BY p.topic ORDER BY p.topic`),
	}
}

// notFound maps QueryRow's no-row error to ErrNotFound.
func (s *store) notFound(err error) error { return s.wrap(sqlkit.NotFound(err)) }

// PartitionStats implements postboxdriver.Executor.
func (s *store) PartitionStats(ctx context.Context) (postboxdriver.PartitionStats, error) {
	var p postboxdriver.PartitionStats
	if err := s.aq.partitionStats.row(ctx, s.conn()).Scan(&p.Total, &p.Unowned, &p.Relays); err != nil {
		return p, s.wrap(err)
	}
	var err error
	p.Leases, err = query(ctx, s.conn(), s.q.leases, nil, sqlkit.ScanLease(&p.Now))
	return p, s.wrap(err)
}

// ConsumerDeadStats implements postboxdriver.Executor.
func (s *store) ConsumerDeadStats(ctx context.Context) ([]postboxdriver.ConsumerDeadStat, error) {
	out, err := query(ctx, s.conn(), s.aq.consumerDeadStats, nil, sqlkit.ScanConsumerDeadStat)
	return out, s.wrap(err)
}

// TopicStats implements postboxdriver.Executor.
func (s *store) TopicStats(ctx context.Context) ([]postboxdriver.TopicStats, error) {
	out, err := query(ctx, s.conn(), s.aq.topicStats, nil, sqlkit.ScanTopicStats)
	return out, s.wrap(err)
}

// ListDeadMessages implements postboxdriver.Executor.
func (s *store) ListDeadMessages(ctx context.Context, f postboxdriver.DeadFilter) ([]postboxdriver.DeadMessage, error) {
	out, err := query(ctx, s.conn(), s.aq.listDead, append(sqlkit.DeadArgs(f), sqlkit.LimitOr100(f.Limit)),
		func(r *sql.Rows) (postboxdriver.DeadMessage, error) { return sqlkit.ScanDeadMessage(r) })
	return out, s.wrap(err)
}

// GetDeadMessage implements postboxdriver.Executor.
func (s *store) GetDeadMessage(ctx context.Context, id string) (postboxdriver.DeadMessage, error) {
	d, err := sqlkit.ScanDeadMessage(s.aq.getDead.row(ctx, s.conn(), id))
	return d, s.notFound(err)
}

// RequeueDeadMessages implements postboxdriver.Executor: the copy and the
// delete run in one transaction.
func (s *store) RequeueDeadMessages(ctx context.Context, f postboxdriver.DeadFilter) (int, error) {
	var n int64
	err := s.write(ctx, func(c conn) error {
		var err error
		if n, err = s.aq.requeueInsert.exec(ctx, c, sqlkit.DeadArgs(f)...); err != nil {
			return err
		}
		_, err = s.aq.requeueDelete.exec(ctx, c, sqlkit.DeadArgs(f)...)
		return err
	})
	return int(n), err
}

// DeleteDeadMessages implements postboxdriver.Executor.
func (s *store) DeleteDeadMessages(ctx context.Context, f postboxdriver.DeadFilter) (int, error) {
	n, err := s.aq.deleteDead.exec(ctx, s.conn(), sqlkit.DeadArgs(f)...)
	return int(n), s.wrap(err)
}

// PrunePublished implements postboxdriver.Executor.
func (s *store) PrunePublished(ctx context.Context, age time.Duration, limit int) (int, error) {
	n, err := s.aq.prunePublished.exec(ctx, s.conn(), age.Milliseconds(), limit)
	return int(n), s.wrap(err)
}

// Replay implements postboxdriver.Executor, in one transaction.
func (s *store) Replay(ctx context.Context, r postboxdriver.ReplayParams) (int, error) {
	since, until := r.Since.UnixMilli(), r.Until.UnixMilli()
	var n int64
	if r.AsNew {
		err := s.write(ctx, func(c conn) error {
			res, err := c.ExecContext(ctx, s.aq.replayNewAudit.sql, s.aq.replayNewAudit.args(r.Actor, since, until, r.Topic, r.Key, r.DryRun)...)
			if err != nil {
				return err
			}
			id, err := res.LastInsertId()
			if err != nil {
				return err
			}
			if r.DryRun {
				err = s.aq.replayNewCount.row(ctx, c, since, until, r.Topic, r.Key).Scan(&n)
			} else {
				n, err = s.aq.replayNewInsert.exec(ctx, c, since, until, r.Topic, r.Key, id)
			}
			if err != nil {
				return err
			}
			_, err = s.aq.replayNewCounted.exec(ctx, c, n, id)
			return err
		})
		return int(n), err
	}
	err := s.write(ctx, func(c conn) error {
		if r.Horizon > 0 {
			var tooOld bool
			if err := s.aq.horizon.row(ctx, c, since, r.Horizon.Milliseconds()).Scan(&tooOld); err != nil {
				return err
			}
			if tooOld {
				return postboxdriver.ErrBeyondHorizon
			}
		}
		if r.DryRun {
			if err := s.aq.replayCount.row(ctx, c, since, until, r.Topic, r.Key).Scan(&n); err != nil {
				return err
			}
		} else {
			var err error
			if n, err = s.aq.replayInsert.exec(ctx, c, since, until, r.Topic, r.Key); err != nil {
				return err
			}
			if _, err := s.aq.replayDelete.exec(ctx, c, since, until, r.Topic, r.Key); err != nil {
				return err
			}
		}
		_, err := s.aq.replayAudit.exec(ctx, c, r.Actor, since, until, r.Topic, r.Key, n, r.DryRun)
		return err
	})
	if err != nil {
		return 0, err
	}
	return int(n), nil
}

// ListReplays implements postboxdriver.Executor.
func (s *store) ListReplays(ctx context.Context, limit int) ([]postboxdriver.ReplayAudit, error) {
	out, err := query(ctx, s.conn(), s.aq.listReplays, []any{sqlkit.LimitOr100(limit)}, sqlkit.ScanReplayAudit)
	return out, s.wrap(err)
}

// ReplayCounts implements postboxdriver.Executor.
func (s *store) ReplayCounts(ctx context.Context, r postboxdriver.ReplayParams, recent time.Duration) ([]postboxdriver.ReplayCount, error) {
	out, err := query(ctx, s.conn(), s.aq.replayCounts, []any{r.Since.UnixMilli(), r.Until.UnixMilli(), r.Topic, r.Key, recent.Milliseconds()},
		sqlkit.ScanReplayCount)
	return out, s.wrap(err)
}

package pgsql

import (
	"context"
	"strings"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

var _ postboxdriver.Admin = (*Core)(nil)

type adminQueries struct {
	topicStats, listDead, getDead, requeueDead, deleteDead, prunePublished,
	replay, replayCount, replayAudit, horizon, listReplays string
}

// deadWhere selects dead messages by the filter's parameters $1..$5.
const deadWhere = `(cardinality($1::uuid[]) = 0 OR d.id = ANY($1::uuid[]))
  AND ($2 = '' OR d.topic = $2) AND ($3 = '' OR d.key = $3)
  AND ($4::timestamptz IS NULL OR d.dead_at >= $4) AND ($5::timestamptz IS NULL OR d.dead_at < $5)`

const deadMessageColumns = `d.seq, d.id::text, d.topic, coalesce(d.key, ''), d.payload, d.headers::text, d.attempts, coalesce(d.last_error, ''), d.created_at, d.dead_at`

// replayWhere selects published rows by the request's $1..$4, leaving out
// any whose id is pending again already (an earlier replay not yet sent).
const replayWhere = `p.created_at >= $1 AND p.created_at < $2 AND ($3 = '' OR p.topic = $3) AND ($4 = '' OR p.key = $4)
  AND NOT EXISTS (SELECT 1 FROM {p}outbox o WHERE o.id = p.id)`

func makeAdminQueries(prefix string) adminQueries {
	r := strings.NewReplacer("{p}", prefix)
	return adminQueries{
		topicStats: r.Replace(`WITH pending AS (
  SELECT topic, count(*) AS n, extract(epoch FROM now() - min(created_at)) AS age FROM {p}outbox GROUP BY topic
), dead AS (
  SELECT topic, count(*) AS n FROM {p}dead GROUP BY topic
), recent AS (
  SELECT topic, count(*) AS n FROM {p}published WHERE published_at > now() - interval '1 minute' GROUP BY topic
)
SELECT t.topic, coalesce(pending.n, 0), coalesce(dead.n, 0), coalesce(pending.age, 0)::float8, coalesce(recent.n, 0)
FROM (SELECT topic FROM pending UNION SELECT topic FROM dead UNION SELECT topic FROM recent) t
LEFT JOIN pending USING (topic) LEFT JOIN dead USING (topic) LEFT JOIN recent USING (topic)
ORDER BY t.topic`),
		listDead: r.Replace(`SELECT ` + deadMessageColumns + ` FROM {p}dead d WHERE ` + deadWhere + `
ORDER BY d.dead_at DESC, d.seq DESC LIMIT $6`),
		getDead: r.Replace(`SELECT ` + deadMessageColumns + ` FROM {p}dead d WHERE d.id = $1::uuid`),
		// The original seq puts a requeued message back in its place: first
		// in line, and in order among its key's messages still pending.
		requeueDead: r.Replace(`WITH moved AS (
  DELETE FROM {p}dead d WHERE ` + deadWhere + `
  RETURNING d.seq, d.id, d.topic, d.key, d.payload, d.headers, d.created_at
), back AS (
  INSERT INTO {p}outbox (seq, id, topic, key, payload, headers, created_at) OVERRIDING SYSTEM VALUE
  SELECT seq, id, topic, key, payload, headers, created_at FROM moved
  RETURNING 1
)
SELECT count(*) FROM back`),
		deleteDead: r.Replace(`WITH del AS (DELETE FROM {p}dead d WHERE ` + deadWhere + ` RETURNING 1) SELECT count(*) FROM del`),
		prunePublished: r.Replace(`WITH old AS (
  SELECT ctid FROM {p}published WHERE published_at < now() - $1 * interval '1 millisecond' LIMIT $2
), del AS (
  DELETE FROM {p}published p USING old WHERE p.ctid = old.ctid RETURNING 1
)
SELECT count(*) FROM del`),
		horizon: `SELECT $1::timestamptz < now() - $2 * interval '1 millisecond'`,
		// Rows go back under their own ids, in their original order, with
		// new seqs after everything pending; the history keeps one row per
		// id, so they leave it until they are published again.
		replay: r.Replace(`WITH moved AS (
  DELETE FROM {p}published p WHERE ` + replayWhere + `
  RETURNING p.seq, p.id, p.topic, p.key, p.payload, p.headers
), staged AS (
  INSERT INTO {p}outbox (id, topic, key, payload, headers)
  SELECT id, topic, key, payload, headers FROM moved ORDER BY seq
  RETURNING 1
), n AS (
  SELECT count(*) AS n FROM staged
), audit AS (
  INSERT INTO {p}replays (actor, since, until, topic, key, count, dry_run) SELECT $5, $1, $2, $3, $4, n, false FROM n
)
SELECT n FROM n`),
		replayCount: r.Replace(`SELECT count(*) FROM {p}published p WHERE ` + replayWhere),
		replayAudit: r.Replace(`INSERT INTO {p}replays (actor, since, until, topic, key, count, dry_run) VALUES ($1, $2, $3, $4, $5, $6, true)`),
		listReplays: r.Replace(`SELECT id, at, actor, since, until, topic, key, count, dry_run FROM {p}replays ORDER BY id DESC LIMIT $1`),
	}
}

func deadArgs(f postboxdriver.DeadMessageFilter) []any {
	var since, until *time.Time
	if !f.Since.IsZero() {
		since = &f.Since
	}
	if !f.Until.IsZero() {
		until = &f.Until
	}
	ids := f.IDs
	if ids == nil {
		ids = []string{}
	}
	return []any{ids, f.Topic, f.Key, since, until}
}

func scanDeadMessage(r Rows) (postboxdriver.DeadMessage, error) {
	var d postboxdriver.DeadMessage
	var headers string
	err := r.Scan(&d.Seq, &d.ID, &d.Topic, &d.Key, &d.Payload, &headers, &d.Attempts, &d.LastError, &d.CreatedAt, &d.DeadAt)
	d.Headers = []byte(headers)
	return d, err
}

// TopicStats implements postboxdriver.Admin.
func (c *Core) TopicStats(ctx context.Context) ([]postboxdriver.TopicStats, error) {
	rows, err := c.db.Query(ctx, c.aq.topicStats)
	if err != nil {
		return nil, c.wrap(err)
	}
	var out []postboxdriver.TopicStats
	err = scanAll(rows, func(r Rows) error {
		var t postboxdriver.TopicStats
		var age float64
		if err := r.Scan(&t.Topic, &t.Pending, &t.Dead, &age, &t.PublishedLastMinute); err != nil {
			return err
		}
		t.OldestPendingAge = time.Duration(age * float64(time.Second))
		out = append(out, t)
		return nil
	})
	return out, c.wrap(err)
}

// ListDeadMessages implements postboxdriver.Admin.
func (c *Core) ListDeadMessages(ctx context.Context, f postboxdriver.DeadMessageFilter) ([]postboxdriver.DeadMessage, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	rows, err := c.db.Query(ctx, c.aq.listDead, append(deadArgs(f), limit)...)
	if err != nil {
		return nil, c.wrap(err)
	}
	var out []postboxdriver.DeadMessage
	err = scanAll(rows, func(r Rows) error {
		d, err := scanDeadMessage(r)
		out = append(out, d)
		return err
	})
	return out, c.wrap(err)
}

// GetDeadMessage implements postboxdriver.Admin.
func (c *Core) GetDeadMessage(ctx context.Context, id string) (postboxdriver.DeadMessage, error) {
	rows, err := c.db.Query(ctx, c.aq.getDead, id)
	if err != nil {
		return postboxdriver.DeadMessage{}, c.wrap(err)
	}
	var d postboxdriver.DeadMessage
	found := false
	err = scanAll(rows, func(r Rows) error {
		found = true
		var err error
		d, err = scanDeadMessage(r)
		return err
	})
	if err == nil && !found {
		err = postboxdriver.ErrNotFound
	}
	return d, c.wrap(err)
}

// RequeueDeadMessages implements postboxdriver.Admin.
func (c *Core) RequeueDeadMessages(ctx context.Context, f postboxdriver.DeadMessageFilter) (int, error) {
	var n int
	err := c.queryRow(ctx, c.db, c.aq.requeueDead, deadArgs(f), &n)
	return n, err
}

// DeleteDeadMessages implements postboxdriver.Admin.
func (c *Core) DeleteDeadMessages(ctx context.Context, f postboxdriver.DeadMessageFilter) (int, error) {
	var n int
	err := c.queryRow(ctx, c.db, c.aq.deleteDead, deadArgs(f), &n)
	return n, err
}

// PrunePublished implements postboxdriver.Admin.
func (c *Core) PrunePublished(ctx context.Context, age time.Duration, limit int) (int, error) {
	var n int
	err := c.queryRow(ctx, c.db, c.aq.prunePublished, []any{age.Milliseconds(), limit}, &n)
	return n, err
}

// Replay implements postboxdriver.Admin.
func (c *Core) Replay(ctx context.Context, r postboxdriver.ReplayRequest) (int, error) {
	var tooOld bool
	if err := c.queryRow(ctx, c.db, c.aq.horizon, []any{r.Since, r.Horizon.Milliseconds()}, &tooOld); err != nil {
		return 0, err
	}
	if tooOld {
		return 0, postboxdriver.ErrBeyondHorizon
	}
	var n int
	if r.DryRun {
		if err := c.queryRow(ctx, c.db, c.aq.replayCount, []any{r.Since, r.Until, r.Topic, r.Key}, &n); err != nil {
			return 0, err
		}
		return n, c.wrap(c.db.Exec(ctx, c.aq.replayAudit, r.Actor, r.Since, r.Until, r.Topic, r.Key, n))
	}
	err := c.queryRow(ctx, c.db, c.aq.replay, []any{r.Since, r.Until, r.Topic, r.Key, r.Actor}, &n)
	return n, err
}

// ListReplays implements postboxdriver.Admin.
func (c *Core) ListReplays(ctx context.Context, limit int) ([]postboxdriver.ReplayAudit, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := c.db.Query(ctx, c.aq.listReplays, limit)
	if err != nil {
		return nil, c.wrap(err)
	}
	var out []postboxdriver.ReplayAudit
	err = scanAll(rows, func(r Rows) error {
		var a postboxdriver.ReplayAudit
		if err := r.Scan(&a.ID, &a.At, &a.Actor, &a.Since, &a.Until, &a.Topic, &a.Key, &a.Count, &a.DryRun); err != nil {
			return err
		}
		out = append(out, a)
		return nil
	})
	return out, c.wrap(err)
}

// Package band is the reading of design §3's next storage model ("a log
// read by snapshot bands"), outside the product, so that its argument can
// be checked against a real PostgreSQL before the drivers adopt it: a log
// whose rows carry their writer's transaction id, read by one reader per
// set of partitions whose position is a snapshot and a seq bound, the
// band it reads being the rows its last snapshot did not see.
//
// Read returns the next rows in seq order and moves the position: the
// reader here keeps it in memory, where the drivers will keep it in their
// leases table and move it in the statement that records a batch.
package band

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Schema is the log and what the checks write beside it, for the tables
// named with prefix. The log's xid comes first, so that its default
// assigns the writer's transaction id before seq's nextval runs (design
// §3, "The position").
func Schema(prefix string) string {
	return strings.NewReplacer("{p}", prefix).Replace(`
CREATE TABLE {p}log (
    xid       xid8   NOT NULL DEFAULT pg_current_xact_id(),
    seq       bigint GENERATED ALWAYS AS IDENTITY,
    partition int    NOT NULL,
    key       text   NOT NULL,
    n         int    NOT NULL,
    PRIMARY KEY (partition, seq)
);
CREATE INDEX {p}log_xid_idx ON {p}log (xid);
CREATE INDEX {p}log_key_idx ON {p}log (key, n);
CREATE TABLE {p}domain (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY);`)
}

// Row is one log row as read.
type Row struct {
	Seq       int64
	Partition int
	Key       string
	N         int
	// Xip says the row came through the xip arm: its transaction was
	// running when the position's snapshot was taken, and it drew a seq
	// at or below the position's bound.
	Xip bool
}

// Reader reads the log's partitions 0..parts-1 by snapshot bands.
type Reader struct {
	pool  *pgxpool.Pool
	sql   string
	parts int
	limit int

	// The position: every row visible in lo is done, and every row of a
	// transaction whose id is at least xmax(lo) has a seq above loSeq of
	// its partition.
	lo    string
	loSeq []int64
	// loNext is an id above every id assigned before lo was taken.
	loNext string
	// An open band, when a read returned limit rows: the snapshot hi
	// bounds it, and its rows up to seq cursor are done; bandMax holds
	// the largest seq read of each partition in the band.
	hi      string
	hiNext  string
	cursor  int64
	bandMax []int64
}

// NewReader reads the log of prefix from its start, limit rows a read.
func NewReader(pool *pgxpool.Pool, prefix string, parts, limit int) *Reader {
	var arms []string
	for k := range parts {
		// One index range on (partition, seq) per partition, each
		// limited: the merge in seq order (a Merge Append) stops after
		// the batch.
		arms = append(arms, fmt.Sprintf(`(SELECT o.seq, o.partition, o.key, o.n, false AS xip FROM {p}log o
  WHERE o.partition = %d AND o.seq > ($2::bigint[])[%d] AND o.seq > $4
    AND NOT pg_visible_in_snapshot(o.xid, $1::pg_snapshot)
    AND ($3::pg_snapshot IS NULL OR pg_visible_in_snapshot(o.xid, $3::pg_snapshot))
  ORDER BY o.seq LIMIT $5)`, k, k+1))
	}
	// The transactions running when lo was taken: those in its xip list,
	// and those whose id was assigned before lo but above the last
	// completed one, which PostgreSQL leaves out of the list (its xmax is
	// the last completed id plus one, not the next id): their rows at or
	// below the bound, by the xid index.
	// Two arms rather than an OR, so that each is an index scan.
	for _, ids := range []string{
		`o.xid = ANY(ARRAY(SELECT pg_snapshot_xip($1::pg_snapshot)))`,
		`o.xid >= pg_snapshot_xmax($1::pg_snapshot) AND o.xid < $6::xid8`,
	} {
		arms = append(arms, `(SELECT o.seq, o.partition, o.key, o.n, true AS xip FROM {p}log o
  WHERE `+ids+`
    AND o.seq <= ($2::bigint[])[o.partition + 1] AND o.seq > $4
    AND ($3::pg_snapshot IS NULL OR pg_visible_in_snapshot(o.xid, $3::pg_snapshot)))`)
	}
	// The statement's own transaction id, assigned after its snapshot was
	// taken, bounds the ids assigned before the snapshot: it is the next
	// position's $6. Having an id, the statement commits like a write, so
	// without waiting for a flush.
	sql := `WITH b AS (` + strings.Join(arms, "\nUNION ALL\n") + `
ORDER BY 1 LIMIT $5)
SELECT pg_current_snapshot()::text, pg_current_xact_id()::text, b.seq, b.partition, b.key, b.n, b.xip
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS one LEFT JOIN b ON true ORDER BY b.seq`
	return &Reader{
		pool: pool, sql: strings.ReplaceAll(sql, "{p}", prefix), parts: parts, limit: limit,
		// Nothing is visible in '1:1:': the first read starts at the log's
		// beginning.
		lo: "1:1:", loNext: "1", loSeq: make([]int64, parts), bandMax: make([]int64, parts),
	}
}

// Read returns the next rows, at most the reader's limit, in seq order,
// and moves the position past them. A caller that publishes the rows
// would move it only once they are published; here reading is the end.
func (r *Reader) Read(ctx context.Context) ([]Row, error) {
	var hi any
	if r.hi != "" {
		hi = r.hi
	}
	rows, err := r.pool.Query(ctx, r.sql, r.lo, r.loSeq, hi, r.cursor, r.limit, r.loNext)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Row
	var snap, next string
	for rows.Next() {
		var seq *int64
		var part, n *int
		var key *string
		var xip *bool
		if err := rows.Scan(&snap, &next, &seq, &part, &key, &n, &xip); err != nil {
			return nil, err
		}
		if seq != nil {
			out = append(out, Row{Seq: *seq, Partition: *part, Key: *key, N: *n, Xip: *xip})
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	r.advance(snap, next, out)
	return out, nil
}

// advance moves the position past rows, read under the statement's
// snapshot snap by a statement whose own id is next (design §3, "The
// advance").
func (r *Reader) advance(snap, next string, rows []Row) {
	if r.hi == "" && len(rows) == r.limit {
		// A backlog: the band up to this read's snapshot is read on in
		// seq order, bounded by that snapshot.
		r.hi, r.hiNext = snap, next
		clear(r.bandMax)
	}
	for _, row := range rows {
		r.bandMax[row.Partition] = max(r.bandMax[row.Partition], row.Seq)
	}
	if len(rows) == r.limit {
		// Every band row up to the last seq read was read: the merge is in
		// global seq order.
		r.cursor = rows[len(rows)-1].Seq
		return
	}
	// The band is read whole: every row its snapshot saw is done, and a
	// transaction not visible in it either had its id when the snapshot
	// was taken (below next: the next xip arm) or got it later and so
	// drew seqs above every seq read.
	if r.hi != "" {
		snap, next = r.hi, r.hiNext
	}
	r.lo, r.loNext = snap, next
	for p := range r.loSeq {
		r.loSeq[p] = max(r.loSeq[p], r.bandMax[p])
	}
	r.hi, r.hiNext, r.cursor = "", "", 0
	clear(r.bandMax)
}

package pgsql

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

// The storages a relay reads, and a database says its relays read
// (migration 13, design §3 "Switching a database to the log"): the
// outbox, or the log of migration 12 with the outbox beside it.
const (
	StorageTable = "table"
	StorageLog   = "log"
)

// coreOf is what a Core has, and so every type that embeds one: the
// Store of postboxpgx, which the log's Store wraps.
type coreOf interface{ core() *Core }

func (c *Core) core() *Core { return c }

// CoreOf is the Core that x embeds, or nil.
func CoreOf(x any) *Core {
	if h, ok := x.(coreOf); ok {
		return h.core()
	}
	return nil
}

// ReadsLog makes the Core that x embeds register its relays as readers of
// the log (Coordinate's heartbeat) and let them run under either setting
// of the database (CheckStorage), and returns it; nil when x embeds none.
// The log's Store calls it on the Store it wraps, before any use.
func ReadsLog(x any) *Core {
	c := CoreOf(x)
	if c != nil {
		c.storage = StorageLog
	}
	return c
}

// readsLog says whether the Core's relays read the log.
func (c *Core) readsLog() bool { return c.storage == StorageLog }

// relayStorage is what the Core's relays read, as their heartbeat
// registers it.
func (c *Core) relayStorage() string {
	if c.readsLog() {
		return StorageLog
	}
	return StorageTable
}

// LogPendingWhere is the test that the position x has not passed the log
// row g of its partition.
const LogPendingWhere = `NOT pg_visible_in_snapshot(g.xid, x.lo)
    AND NOT (x.hi IS NOT NULL AND pg_visible_in_snapshot(g.xid, x.hi) AND g.seq <= x.band_cursor)
    AND NOT EXISTS (SELECT 1 FROM {p}log_done m WHERE m.partition = g.partition AND m.seq = g.seq)`

// LogPendingArms are the two searches for the log rows no position has
// passed, as FROM and WHERE clauses over the positions x and the log g,
// with onX added as a condition on x and onG on g. A pending row has a
// seq above lo_seq, found by a range of the primary key, or at or below
// it was written by a transaction running when lo was taken, found by the
// xid index as the read's xip arm finds it (design §3, "The position").
// Either reads what is pending, not the history the log keeps: the
// second tests the partition and lo_seq with "+ 0", so that PostgreSQL
// uses the xid index alone rather than ANDing it with the partition's
// range of the primary key (the read's xip arm says why). OFFSET 0 keeps
// each a probe per partition: joined, PostgreSQL hashed the positions and
// scanned the whole log for each.
func LogPendingArms(onX, onG string) [2]string {
	return [2]string{
		`FROM {p}positions x CROSS JOIN LATERAL (SELECT g.* FROM {p}log g
    WHERE g.partition = x.partition AND g.seq > x.lo_seq AND ` + onG + ` OFFSET 0) g
  WHERE ` + onX + ` AND ` + LogPendingWhere,
		`FROM {p}positions x CROSS JOIN LATERAL (SELECT g.* FROM {p}log g
    WHERE (g.xid = ANY(ARRAY(SELECT pg_snapshot_xip(x.lo))) OR g.xid >= pg_snapshot_xmax(x.lo) AND g.xid < x.lo_next)
      AND g.partition + 0 = x.partition AND g.seq + 0 <= x.lo_seq AND ` + onG + ` OFFSET 0) g
  WHERE ` + onX + ` AND ` + LogPendingWhere,
	}
}

// checkStorageSQL reads the database's storage, since when, and whether
// the log holds a row no position has passed (LogPendingArms), which only
// a relay over the log publishes. A database whose row was deleted says
// table, as every database did before migration 13.
var checkStorageSQL = func() string {
	a := LogPendingArms("true", "true")
	return `SELECT coalesce(s.storage, 'table'), coalesce(s.changed_at, 'epoch'),
  EXISTS (SELECT 1 ` + a[0] + ` LIMIT 1) OR EXISTS (SELECT 1 ` + a[1] + ` LIMIT 1)
FROM (SELECT 1) one LEFT JOIN {p}storage s ON true`
}()

// CheckStorage implements postboxdriver.StorageGuard. A relay over the log
// runs under either setting, so it asks nothing. A relay over the table
// is refused while the database says log, since it never reads the log,
// and while the log holds a row no position has passed: it would publish
// the outbox's later messages of that row's key first. The way back from
// the log is writers first, then relays, once the log is drained.
func (c *Core) CheckStorage(ctx context.Context) error {
	if c.readsLog() {
		return nil
	}
	var storage string
	var since time.Time
	var pending bool
	if err := c.queryRow(ctx, c.db, c.q.checkStorage, nil, &storage, &since, &pending); err != nil {
		return err
	}
	switch {
	case storage == StorageLog:
		return c.refusedTable("", since)
	case pending:
		return fmt.Errorf("%w: the log holds messages no relay over it has passed, and this relay reads the table: "+
			"it would publish the outbox's later messages of their keys first; run the relays over the log until the log is drained",
			postboxdriver.ErrStorageRefused)
	}
	return nil
}

// refusedTable is the error of a relay over the table (relayID, when the
// heartbeat was refused) on a database that says log, since since.
func (c *Core) refusedTable(relayID string, since time.Time) error {
	who := "this relay"
	if relayID != "" {
		who = "relay " + relayID
	}
	at := ""
	if !since.IsZero() && since.Unix() != 0 {
		at = " since " + since.UTC().Format(time.RFC3339)
	}
	return fmt.Errorf("%w: the database says its relays read the log%s, and %s reads the table (prefix %q): "+
		"set its storage to log, or switch the database back with `postbox storage table`",
		postboxdriver.ErrStorageRefused, at, who, c.prefix)
}

// StorageSetting is the storage setting a Core has, and so the Store of
// either PostgreSQL driver: what the operator's command asks of it.
type StorageSetting interface {
	Storage(ctx context.Context) (StorageState, error)
	SwitchStorage(ctx context.Context, to string) (StorageState, error)
}

var _ StorageSetting = (*Core)(nil)

// StorageState is what a database says its relays read, and what each
// live relay reads (`postbox storage`).
type StorageState struct {
	// Storage is StorageTable or StorageLog, and ChangedAt when it was
	// last switched (the migration's time at first).
	Storage   string    `json:"storage"`
	ChangedAt time.Time `json:"changed_at"`
	// Relays are the live relays, by id, with what each reads.
	Relays []RelayStorage `json:"relays"`
}

// RelayStorage is a live relay and what it reads.
type RelayStorage struct {
	ID        string    `json:"id"`
	Storage   string    `json:"storage"`
	ExpiresAt time.Time `json:"expires_at"`
}

// storageStateSQL is the database's storage (its one row, with an empty id) and
// the live relays.
const storageStateSQL = `SELECT '', storage, changed_at FROM {p}storage
UNION ALL
SELECT id, storage, expires_at FROM {p}relays WHERE expires_at > now()
ORDER BY 1`

// Storage reads what the database says its relays read, and the live
// relays.
func (c *Core) Storage(ctx context.Context) (StorageState, error) {
	return c.storageState(ctx, c.db)
}

func (c *Core) storageState(ctx context.Context, q Querier) (StorageState, error) {
	st := StorageState{Storage: StorageTable, Relays: []RelayStorage{}}
	rows, err := q.Query(ctx, c.q.storageState)
	if err != nil {
		return st, c.wrap(err)
	}
	err = scanAll(rows, func(r Rows) error {
		var rs RelayStorage
		if err := r.Scan(&rs.ID, &rs.Storage, &rs.ExpiresAt); err != nil {
			return err
		}
		if rs.ID == "" {
			st.Storage, st.ChangedAt = rs.Storage, rs.ExpiresAt
		} else {
			st.Relays = append(st.Relays, rs)
		}
		return nil
	})
	return st, c.wrap(err)
}

// storageLockTimeout bounds a switch's wait for the storage table's lock.
// Every write of the log's Store holds that table's lock to its
// transaction's end, and so does a relay's heartbeat.
const storageLockTimeout = 5 * time.Second

// storageLockAttempt bounds each of a switch's tries for the lock. While a
// try waits, the writes and heartbeats that begin queue behind it; between
// tries they go through. So a transaction that read the setting and stays
// open stalls the others for at most this long at a time, not for as long
// as it stays open (up to storageLockTimeout, when the switch gives up).
// A write commits in a few milliseconds, so a try that waits only for
// writes already running gets the lock.
const storageLockAttempt = 50 * time.Millisecond

// SwitchStorage sets what the database says its relays read, to
// StorageTable or StorageLog, and returns the state after the switch.
// The switch to the log is refused (postboxdriver.ErrStorageRefused)
// while a live relay reads the table, naming it: such a relay never reads
// the log. It locks the storage table first, which every heartbeat and
// every write of the log's Store reads, holding the lock to its
// transaction's end: the switch waits for those that read it before (a
// heartbeat's registration is then in the relays it checks), and those
// that read it after read the new setting (a heartbeat over the table is
// refused, a write goes where it says). It waits in tries of
// storageLockAttempt, each a transaction of its own, for
// storageLockTimeout in all. The switch back to the table is never
// refused; relays over the table then wait for the log to drain
// (CheckStorage).
func (c *Core) SwitchStorage(ctx context.Context, to string) (StorageState, error) {
	if to != StorageTable && to != StorageLog {
		return StorageState{}, fmt.Errorf("postbox: storage %q: want %s or %s", to, StorageTable, StorageLog)
	}
	deadline := time.Now().Add(storageLockTimeout)
	var err error
	for {
		err = c.switchOnce(ctx, to)
		if sqlState(err) != "55P03" {
			break
		}
		if time.Now().Add(storageLockAttempt).After(deadline) {
			err = fmt.Errorf("postbox: switch storage: a transaction that read the setting (a write to the log or a relay's heartbeat) "+
				"did not end within %s; nothing was switched: %w", storageLockTimeout, err)
			break
		}
		// The writes queued behind the try go through.
		select {
		case <-ctx.Done():
			return StorageState{}, ctx.Err()
		case <-time.After(storageLockAttempt):
		}
	}
	if err != nil {
		return StorageState{}, c.wrap(err)
	}
	return c.Storage(ctx)
}

// switchOnce is one try of SwitchStorage, which waits for the storage
// table's lock for at most storageLockAttempt.
func (c *Core) switchOnce(ctx context.Context, to string) error {
	return c.db.Tx(ctx, func(q Querier) error {
		if _, err := q.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, storageLockAttempt.String()); err != nil {
			return err
		}
		if _, err := q.Exec(ctx, c.q.lockStorage); err != nil {
			return err
		}
		st, err := c.storageState(ctx, q)
		if err != nil {
			return err
		}
		if to == StorageLog {
			var table []string
			for _, r := range st.Relays {
				if r.Storage == StorageTable {
					table = append(table, r.ID)
				}
			}
			if len(table) > 0 {
				return fmt.Errorf("%w: %d live relays read the table (%s) and would never read the log; "+
					"restart them with storage log first (prefix %q)",
					postboxdriver.ErrStorageRefused, len(table), strings.Join(table, ", "), c.prefix)
			}
		}
		if st.Storage == to {
			return nil
		}
		_, err = q.Exec(ctx, c.q.switchStorage, to)
		return err
	})
}

package postboxmysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

// ClaimMaintenance implements postboxdriver.Executor: the task's row is
// made once, free, by a statement of its own; then a transaction takes it
// where it is free, expired or already owner's, and reads it back. The
// update takes the row's lock at once, which decides between processes
// claiming together (an insert that met the row and then updated it would
// hold a shared lock first, and two such deadlock).
func (s *store) ClaimMaintenance(ctx context.Context, task, owner string, ttl time.Duration) (bool, error) {
	if _, err := s.aq.claimTask.exec(ctx, s.conn(), task); err != nil {
		return false, s.wrap(err)
	}
	var holder sql.NullString
	err := s.write(ctx, func(c conn) error {
		if _, err := s.aq.takeTask.exec(ctx, c, task, owner, ttl.Milliseconds()); err != nil {
			return err
		}
		return s.aq.taskOwner.row(ctx, c, task).Scan(&holder)
	})
	return err == nil && holder.Valid && holder.String == owner, err
}

// ReleaseMaintenance implements postboxdriver.Executor.
func (s *store) ReleaseMaintenance(ctx context.Context, task, owner string) error {
	_, err := s.aq.releaseTask.exec(ctx, s.conn(), task, owner)
	return s.wrap(err)
}

// OldestSnapshot implements postboxdriver.Executor: InnoDB's purge cannot
// pass the oldest open transaction of another session, whose read view
// keeps every row the relay deleted since, and makes its reads slower.
// The server reports it only to a user with the PROCESS privilege; without
// it there is nothing to report.
func (s *store) OldestSnapshot(ctx context.Context) (postboxdriver.Snapshot, bool, error) {
	var snap postboxdriver.Snapshot
	var us int64
	err := s.conn().QueryRowContext(ctx, `SELECT TIMESTAMPDIFF(MICROSECOND, trx_started, NOW(6)), trx_mysql_thread_id, trx_state
FROM information_schema.innodb_trx WHERE trx_mysql_thread_id <> CONNECTION_ID() ORDER BY trx_started LIMIT 1`).Scan(&us, &snap.PID, &snap.State)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return snap, false, nil
	case err != nil:
		if errNumber(err) == errAccessDenied {
			return snap, false, nil
		}
		return snap, false, err
	}
	snap.Age = time.Duration(us) * time.Microsecond
	return snap, true, nil
}

// errAccessDenied is ER_SPECIFIC_ACCESS_DENIED_ERROR (PROCESS missing).
const errAccessDenied = 1227

// CheckConnections implements postboxdriver.Executor: nothing in front of
// MySQL is known to break the relay's statements.
func (s *store) CheckConnections(context.Context) error { return nil }

// DurabilityWarnings implements postboxdriver.Executor: InnoDB must flush
// its log at each commit, and the binary log, when on, must be synced at
// each commit too, or a crash can undo transactions that committed after
// the relay published their messages.
func (s *store) DurabilityWarnings(ctx context.Context) ([]string, error) {
	var flush, logBin, syncBinlog int
	if err := s.conn().QueryRowContext(ctx, `SELECT @@innodb_flush_log_at_trx_commit, @@log_bin, @@sync_binlog`).Scan(&flush, &logBin, &syncBinlog); err != nil {
		return nil, s.wrap(err)
	}
	var out []string
	if flush != 1 {
		out = append(out, fmt.Sprintf("MySQL runs with innodb_flush_log_at_trx_commit = %d (not 1): a crash can undo transactions that committed, after the relay published their messages", flush))
	}
	if logBin == 1 && syncBinlog != 1 {
		out = append(out, fmt.Sprintf("MySQL writes a binary log with sync_binlog = %d (not 1): a crash can lose committed transactions from the binary log that replicas and a failover rely on", syncBinlog))
	}
	return out, nil
}

var _ postboxdriver.Executor = (*store)(nil)

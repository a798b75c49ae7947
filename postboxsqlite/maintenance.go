package postboxsqlite

import (
	"context"
	"time"

	"github.com/postbox-go/postbox/internal/sqlkit"
)

// ClaimMaintenance implements postboxdriver.Executor: one upsert in a
// write transaction, so SQLite's single writer decides between two
// processes claiming at once.
func (s *store) ClaimMaintenance(ctx context.Context, task, owner string, ttl time.Duration) (bool, error) {
	var claimed bool
	err := s.write(ctx, func(c conn) error {
		n, err := sqlkit.Affected(c.ExecContext(ctx, `INSERT INTO `+s.prefix+`maintenance AS m (task, owner, expires_at)
VALUES (?1, ?2, (SELECT `+nowExpr+`) + ?3)
ON CONFLICT (task) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at
WHERE m.owner IS NULL OR m.owner = excluded.owner OR m.expires_at <= (SELECT `+nowExpr+`)`, task, owner, ttl.Milliseconds()))
		claimed = n == 1
		return err
	})
	return claimed, err
}

// ReleaseMaintenance implements postboxdriver.Executor.
func (s *store) ReleaseMaintenance(ctx context.Context, task, owner string) error {
	return s.write(ctx, func(c conn) error {
		_, err := c.ExecContext(ctx, `UPDATE `+s.prefix+`maintenance SET owner = NULL, expires_at = (SELECT `+nowExpr+`)
WHERE task = ?1 AND owner = ?2`, task, owner)
		return err
	})
}

package pgsql

import (
	"context"
	"time"
)

// ClaimMaintenance implements postboxdriver.Executor: one upsert, so of
// two processes claiming a free task at once exactly one gets it (the
// other waits for its commit and finds the claim held).
func (c *Core) ClaimMaintenance(ctx context.Context, task, owner string, ttl time.Duration) (bool, error) {
	n, err := c.count(ctx, `WITH up AS (
  INSERT INTO `+c.prefix+`maintenance AS m (task, owner, expires_at) VALUES ($1, $2, now() + $3 * interval '1 millisecond')
  ON CONFLICT (task) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at
  WHERE m.owner IS NULL OR m.owner = EXCLUDED.owner OR m.expires_at <= now()
  RETURNING 1
) SELECT count(*) FROM up`, task, owner, ttl.Milliseconds())
	return n == 1, err
}

// ReleaseMaintenance implements postboxdriver.Executor.
func (c *Core) ReleaseMaintenance(ctx context.Context, task, owner string) error {
	_, err := c.exec(ctx, `UPDATE `+c.prefix+`maintenance SET owner = NULL, expires_at = now() WHERE task = $1 AND owner = $2`, task, owner)
	return err
}

package pgsql

import (
	"context"
	"fmt"
	"slices"

	"github.com/postbox-go/postbox/postboxdriver"
)

// InboxInsertMany records (consumer, id) for every id in q's transaction,
// in id order, and reports which ids were new, in the order of ids.
func (c *Core) InboxInsertMany(ctx context.Context, q Querier, consumer string, ids []string) ([]bool, error) {
	out := make([]bool, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := q.Query(ctx, `INSERT INTO `+c.prefix+`inbox (consumer, message_id)
SELECT $1, id FROM unnest($2::text[]) AS u(id) ORDER BY id COLLATE "C"
ON CONFLICT DO NOTHING
RETURNING message_id`, consumer, ids)
	if err != nil {
		return nil, c.wrap(err)
	}
	at := make(map[string]int, len(ids))
	for i, id := range ids {
		at[id] = i
	}
	err = scanAll(rows, func(r Rows) error {
		var id string
		if err := r.Scan(&id); err != nil {
			return err
		}
		if i, ok := at[id]; ok {
			out[i] = true
		}
		return nil
	})
	if err != nil {
		return nil, c.wrap(err)
	}
	return out, nil
}

// InboxDelete deletes the records of ids for consumer in q's transaction.
func (c *Core) InboxDelete(ctx context.Context, q Querier, consumer string, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	ids = slices.Clone(ids)
	slices.Sort(ids)
	return c.wrap(q.Exec(ctx, `DELETE FROM `+c.prefix+`inbox WHERE consumer = $1 AND message_id = ANY($2::text[])`, consumer, ids))
}

// Savepoint opens a savepoint in q's transaction. The statements carry no
// arguments, so both drivers send them in one round trip each.
func (c *Core) Savepoint(ctx context.Context, q Querier, name string) error {
	return savepointStmt(ctx, q, "SAVEPOINT ", name)
}

// RollbackToSavepoint returns q's transaction to the savepoint name.
func (c *Core) RollbackToSavepoint(ctx context.Context, q Querier, name string) error {
	return savepointStmt(ctx, q, "ROLLBACK TO SAVEPOINT ", name)
}

// ReleaseSavepoint ends the savepoint name, keeping its work.
func (c *Core) ReleaseSavepoint(ctx context.Context, q Querier, name string) error {
	return savepointStmt(ctx, q, "RELEASE SAVEPOINT ", name)
}

func savepointStmt(ctx context.Context, q Querier, verb, name string) error {
	if !postboxdriver.ValidSavepointName(name) {
		return fmt.Errorf("postbox: savepoint name %q is not a lower-case SQL identifier", name)
	}
	return q.Exec(ctx, verb+name)
}

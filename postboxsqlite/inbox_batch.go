package postboxsqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/postbox-go/postbox/postboxdriver"
)

var _ postboxdriver.InboxBatcher[*sql.Tx] = (*store)(nil)

// InboxInsertManyTx implements postboxdriver.InboxBatcher.
func (s *store) InboxInsertManyTx(ctx context.Context, tx *sql.Tx, consumer string, ids []string) ([]bool, error) {
	out := make([]bool, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	list, err := json.Marshal(ids)
	if err != nil {
		return nil, err
	}
	rows, err := tx.QueryContext(ctx, s.iq.insertMany, consumer, string(list))
	if err != nil {
		return nil, s.wrap(err)
	}
	at := make(map[string]int, len(ids))
	for i, id := range ids {
		at[id] = i
	}
	err = scanAll(rows, func(r *sql.Rows) error {
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
		return nil, s.wrap(err)
	}
	return out, nil
}

// InboxDeleteTx implements postboxdriver.InboxBatcher.
func (s *store) InboxDeleteTx(ctx context.Context, tx *sql.Tx, consumer string, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	ids = slices.Clone(ids)
	slices.Sort(ids)
	list, err := json.Marshal(ids)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, s.iq.deleteMany, consumer, string(list))
	return s.wrap(err)
}

// SavepointTx implements postboxdriver.Savepointer.
func (s *store) SavepointTx(ctx context.Context, tx *sql.Tx, name string) error {
	return savepointStmt(ctx, tx, "SAVEPOINT ", name)
}

// RollbackToSavepointTx implements postboxdriver.Savepointer.
func (s *store) RollbackToSavepointTx(ctx context.Context, tx *sql.Tx, name string) error {
	return savepointStmt(ctx, tx, "ROLLBACK TO SAVEPOINT ", name)
}

// ReleaseSavepointTx implements postboxdriver.Savepointer.
func (s *store) ReleaseSavepointTx(ctx context.Context, tx *sql.Tx, name string) error {
	return savepointStmt(ctx, tx, "RELEASE SAVEPOINT ", name)
}

func savepointStmt(ctx context.Context, tx *sql.Tx, verb, name string) error {
	if !postboxdriver.ValidSavepointName(name) {
		return fmt.Errorf("postbox: savepoint name %q is not a lower-case SQL identifier", name)
	}
	_, err := tx.ExecContext(ctx, verb+name)
	return err
}

package postboxsql

import (
	"context"
	"database/sql"

	"github.com/postbox-go/postbox/postboxdriver"
)

var _ postboxdriver.InboxBatcher[*sql.Tx] = (*store)(nil)

func (s *store) InboxInsertManyTx(ctx context.Context, tx *sql.Tx, consumer string, ids []string) ([]bool, error) {
	return s.InboxInsertMany(ctx, txQuerier{tx}, consumer, ids)
}

func (s *store) InboxDeleteTx(ctx context.Context, tx *sql.Tx, consumer string, ids []string) error {
	return s.InboxDelete(ctx, txQuerier{tx}, consumer, ids)
}

func (s *store) SavepointTx(ctx context.Context, tx *sql.Tx, name string) error {
	return s.Savepoint(ctx, txQuerier{tx}, name)
}

func (s *store) RollbackToSavepointTx(ctx context.Context, tx *sql.Tx, name string) error {
	return s.RollbackToSavepoint(ctx, txQuerier{tx}, name)
}

func (s *store) ReleaseSavepointTx(ctx context.Context, tx *sql.Tx, name string) error {
	return s.ReleaseSavepoint(ctx, txQuerier{tx}, name)
}

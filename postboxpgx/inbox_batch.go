package postboxpgx

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-go/postbox/postboxdriver"
)

var _ postboxdriver.InboxBatcher[pgx.Tx] = (*store)(nil)

func (s *store) InboxInsertManyTx(ctx context.Context, tx pgx.Tx, consumer string, ids []string) ([]bool, error) {
	return s.InboxInsertMany(ctx, querier{tx}, consumer, ids)
}

func (s *store) InboxDeleteTx(ctx context.Context, tx pgx.Tx, consumer string, ids []string) error {
	return s.InboxDelete(ctx, querier{tx}, consumer, ids)
}

func (s *store) SavepointTx(ctx context.Context, tx pgx.Tx, name string) error {
	return s.Savepoint(ctx, querier{tx}, name)
}

func (s *store) RollbackToSavepointTx(ctx context.Context, tx pgx.Tx, name string) error {
	return s.RollbackToSavepoint(ctx, querier{tx}, name)
}

func (s *store) ReleaseSavepointTx(ctx context.Context, tx pgx.Tx, name string) error {
	return s.ReleaseSavepoint(ctx, querier{tx}, name)
}

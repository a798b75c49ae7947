// Package pgxq holds what the two pgx-based drivers (postboxpgx and
// postboxsql, through pgx's stdlib) share about a pgx connection.
package pgxq

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-go/postbox/internal/pgsql"
)

// NamesStatements reports whether a connection made with cfg prepares its
// statements under a name (pgx's cache_statement mode), which a
// transaction-pooling pooler such as PgBouncer cannot carry from one
// transaction to the next.
func NamesStatements(cfg *pgx.ConnConfig) bool {
	return cfg.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement && cfg.StatementCacheCapacity > 0
}

// Unnamed adapts conn to pgsql.Querier with the simple protocol, so that
// no statement is prepared under a name: what the connection check runs.
func Unnamed(conn *pgx.Conn) pgsql.Querier { return unnamed{conn} }

type unnamed struct{ c *pgx.Conn }

func (u unnamed) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := u.c.Exec(ctx, sql, append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...)
	return tag.RowsAffected(), err
}

func (u unnamed) Query(ctx context.Context, sql string, args ...any) (pgsql.Rows, error) {
	return u.c.Query(ctx, sql, append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...)
}

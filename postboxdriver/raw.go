package postboxdriver

import "context"

// Raw lets postbox's own sibling packages (the Idempotency-Key middleware)
// run their dialect's SQL, in the user's transaction or on the store's
// connections. Queries use the dialect's placeholders: $1, $2 ... on
// PostgreSQL, ? on SQLite.
type Raw[TTx any] interface {
	Dialect() string
	ExecTx(ctx context.Context, tx TTx, query string, args ...any) (int64, error)
	QueryTx(ctx context.Context, tx TTx, query string, args ...any) (Rows, error)
	Exec(ctx context.Context, query string, args ...any) (int64, error)
	Query(ctx context.Context, query string, args ...any) (Rows, error)
}

// Rows is a result set; Close must be called.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

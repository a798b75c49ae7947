package postboxpgx

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-go/postbox/postboxdriver"
)

var (
	_ postboxdriver.Signaler = (*store)(nil)
	_ postboxdriver.Listener = (*store)(nil)
)

// Listen implements postboxdriver.Listener on a connection of its own,
// made with the pool's connection settings and outside the pool, so that
// it takes none of the pool's connections.
func (s *store) Listen(ctx context.Context, ready func(), heard func(postboxdriver.Heard)) error {
	c, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return err
	}
	return s.Core.Listen(ctx, listenConn{querier[*pgx.Conn]{c}}, ready, heard)
}

// listenConn adapts a pgx connection to pgsql.ListenConn.
type listenConn struct{ querier[*pgx.Conn] }

func (l listenConn) Wait(ctx context.Context) (string, error) {
	n, err := l.c.WaitForNotification(ctx)
	if err != nil {
		return "", err
	}
	return n.Payload, nil
}

func (l listenConn) Close(ctx context.Context) error { return l.c.Close(ctx) }

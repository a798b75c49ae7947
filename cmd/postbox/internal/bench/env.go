package bench

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pglog"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxnats"
	"github.com/postbox-go/postbox/postboxpgx"
)

// defaultDatabaseURL is the PostgreSQL the benchmarks use when none is
// given and the benchmark does not take testdb's.
const defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// defaultURLs fills the connection URLs left empty: the database with
// database, the NATS server (when natsURL is not nil) with NATS's default.
func defaultURLs(databaseURL *string, database string, natsURL *string) {
	if *databaseURL == "" {
		*databaseURL = database
	}
	if natsURL != nil && *natsURL == "" {
		*natsURL = nats.DefaultURL
	}
}

// warnings keeps what a relay logs at WARN and above during a run: its
// pauses, its marks lost to fencing, its failures to renew. They say that
// the run met a stall or a fault, which also explains a message the relay
// sent twice. The first maxListed are kept, and all are counted.
type warnings struct {
	mu    sync.Mutex
	lines []string
	n     int
}

// maxListed is how many of a run's warnings, and of its messages
// acknowledged twice, its result lists.
const maxListed = 20

// Write takes one record from the text handler of logger.
func (w *warnings) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n++
	if len(w.lines) < maxListed {
		w.lines = append(w.lines, strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

// logger is a relay's logger whose warnings w keeps; it drops the rest.
func (w *warnings) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// result is how many warnings came, and the first of them.
func (w *warnings) result() (int, []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n, slices.Clone(w.lines)
}

// randTag is a run's random tag, which names its tables, streams and
// subjects apart from those of other runs.
func randTag() string {
	return fmt.Sprintf("%d", rand.Uint32()) //nolint:gosec // a name, not a secret
}

// makePayload is a message body of n bytes.
func makePayload(n int) []byte {
	payload := make([]byte, n)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	return payload
}

// connectNATS connects to the NATS server at url.
func connectNATS(url string) (*nats.Conn, error) {
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", url, err)
	}
	return nc, nil
}

// benchStream is a JetStream stream a run made for itself, on subjects
// beginning with prefix (which ends in a dot).
type benchStream struct {
	nc     *nats.Conn // set when the stream owns the connection
	js     jetstream.JetStream
	name   string
	prefix string
}

// ensureStream makes the stream name, on the subjects below prefix, with
// replicas copies (0: the server's default, one), through a JetStream
// context of its own on nc made with opts.
func ensureStream(ctx context.Context, nc *nats.Conn, name, prefix string, replicas int, opts ...jetstream.JetStreamOpt) (*benchStream, error) {
	js, err := jetstream.New(nc, opts...)
	if err != nil {
		return nil, err
	}
	if _, err := postboxnats.EnsureStream(ctx, js, jetstream.StreamConfig{Name: name, Subjects: []string{prefix + ">"}, Replicas: replicas}); err != nil {
		return nil, err
	}
	return &benchStream{js: js, name: name, prefix: prefix}, nil
}

// openStream connects to the NATS server at url and makes the stream name
// on the subjects below prefix, with replicas copies (0: one); close
// deletes it and closes the connection.
func openStream(ctx context.Context, url, name, prefix string, replicas int, opts ...jetstream.JetStreamOpt) (*benchStream, error) {
	nc, err := connectNATS(url)
	if err != nil {
		return nil, err
	}
	s, err := ensureStream(ctx, nc, name, prefix, replicas, opts...)
	if err != nil {
		nc.Close()
		return nil, err
	}
	s.nc = nc
	return s, nil
}

// close deletes the stream, then closes the connection if the stream owns
// it.
func (s *benchStream) close(ctx context.Context) {
	_ = s.js.DeleteStream(context.WithoutCancel(ctx), s.name)
	if s.nc != nil {
		s.nc.Close()
	}
}

// publisher is a postboxnats publisher to the stream's subjects.
func (s *benchStream) publisher() (*postboxnats.Publisher, error) {
	return postboxnats.New(s.js, &postboxnats.Config{SubjectPrefix: s.prefix})
}

// writersPool opens a pool on url for writers concurrent writers, with
// two connections more at the most, each changed by mod when it is not
// nil, and checks that it connects.
func writersPool(ctx context.Context, url string, writers int, mod func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("--database-url: %w", err)
	}
	cfg.MaxConns = int32(writers + 2)
	cfg.MinConns = int32(writers)
	if mod != nil {
		mod(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	return pool, nil
}

// migrated makes the postbox tables under prefix on pool and returns a
// driver on pool and the clean-up that drops the tables again; when it
// fails, nothing is left to drop.
func migrated(ctx context.Context, pool *pgxpool.Pool, prefix string) (*postboxpgx.Driver, func(), error) {
	driver := postboxpgx.New(pool)
	m, err := postboxmigrate.New(driver, &postboxmigrate.Config{Prefix: prefix})
	if err != nil {
		return nil, nil, err
	}
	if _, err := m.Up(ctx); err != nil {
		dropPrefix(pool, prefix)
		return nil, nil, err
	}
	return driver, func() { dropPrefix(pool, prefix) }, nil
}

// dropPrefix drops the tables under prefix.
func dropPrefix(pool *pgxpool.Pool, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = testdb.DropTables(ctx, pool, prefix)
}

// writeBacklog writes n messages of payload through c, a thousand a call,
// over keys keys (none for 0), as a service's writers would.
func writeBacklog(ctx context.Context, c benchClient, payload []byte, n, keys int) error {
	const chunk = 1000
	msgs := make([]postbox.Message, 0, chunk)
	for i := range n {
		msg := postbox.Message{Topic: "m", Payload: payload}
		if keys > 0 {
			msg.Key = fmt.Sprintf("key-%d", i%keys)
		}
		msgs = append(msgs, msg)
		if len(msgs) == chunk || i == n-1 {
			if err := c.Write(ctx, msgs...); err != nil {
				return err
			}
			msgs = msgs[:0]
		}
	}
	return nil
}

// waitOutboxEmpty polls, every d, until the outbox under prefix holds no
// row.
func waitOutboxEmpty(ctx context.Context, db database, prefix string, d time.Duration) error {
	return pollUntil(ctx, d, func() (bool, error) { return db.empty(ctx, prefix+"outbox") })
}

// waitLogDrained polls, every d, until the relay has recorded n messages
// as published over the log and the outbox under prefix holds no
// exception.
func waitLogDrained(ctx context.Context, db database, logs *pglog.Driver[pgx.Tx], prefix string, n int64, d time.Duration) error {
	return pollUntil(ctx, d, func() (bool, error) {
		if logs.Published() < n {
			return false, nil
		}
		return db.empty(ctx, prefix+"outbox")
	})
}

// pollUntil calls done every d until it reports true or fails, or ctx
// ends.
func pollUntil(ctx context.Context, d time.Duration, done func() (bool, error)) error {
	tick := time.NewTicker(d)
	defer tick.Stop()
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// outboxPending counts the rows left in the outbox under prefix.
func outboxPending(ctx context.Context, pool *pgxpool.Pool, prefix string) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, "SELECT count(*) FROM "+prefix+"outbox").Scan(&n)
	return n, err
}

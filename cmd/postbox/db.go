package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/cmd/postbox/internal/relayd"
	"github.com/postbox-go/postbox/internal/pgsql"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxpgx"
)

// dbFlags are the flags every database command shares.
type dbFlags struct {
	url       string
	prefix    string
	retention string
	storage   string
	json      bool
}

func (f *dbFlags) register(cmd *cobra.Command) {
	p := cmd.PersistentFlags()
	p.StringVar(&f.url, "database", os.Getenv("POSTBOX_DATABASE_URL"),
		"database: postgres://... for PostgreSQL, mysql://user:password@host:3306/dbname for MySQL and MariaDB, sqlite:PATH for SQLite (env POSTBOX_DATABASE_URL)")
	p.StringVar(&f.prefix, "prefix", envOr("POSTBOX_PREFIX", postbox.DefaultPrefix), "table prefix (env POSTBOX_PREFIX)")
	p.StringVar(&f.retention, "retention", envOr("POSTBOX_RETENTION", "168h"), "how long published messages are kept: the prune age and the replay horizon (env POSTBOX_RETENTION)")
	p.StringVar(&f.storage, "storage", envOr("POSTBOX_STORAGE", relayd.StorageTable),
		"what the relays of the database read, as their storage setting says: table, or log (PostgreSQL: status, replay and prune then count and move the log's rows too) (env POSTBOX_STORAGE)")
	p.BoolVar(&f.json, "json", false, "print JSON instead of tables")
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// conn is an open database with the operator's tools over it.
type conn struct {
	admin    *postbox.Admin
	inbox    consumerDead
	migrator *postboxmigrate.Migrator
	close    func()
	// retention is the one in force: --retention, with 0 turned into
	// the default.
	retention time.Duration
	// storage is the database's storage setting, nil but on PostgreSQL.
	storage pgsql.StorageSetting
}

// retentionText says what retention is in force, in words.
func (c *conn) retentionText() string {
	if c.retention < 0 {
		return "forever (a negative --retention keeps everything)"
	}
	return c.retention.String()
}

// consumerDead is a consumer side's dead messages: *postbox.Inbox[TTx]
// for any TTx.
type consumerDead interface {
	ListDead(ctx context.Context, f postbox.DeadFilter) ([]postbox.DeadMessage, error)
	GetDead(ctx context.Context, consumer, messageID string) (postbox.DeadMessage, error)
	DeleteDeadSelected(ctx context.Context, s postbox.DeadSelection) (int, error)
	RequestRequeue(ctx context.Context, s postbox.DeadSelection) (int, error)
}

// errUsage marks a bad flag or argument: the message names it.
type errUsage struct{ msg string }

func (e *errUsage) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &errUsage{fmt.Sprintf(format, args...)} }

func (f *dbFlags) open(cmd *cobra.Command) (*conn, error) {
	ctx := cmd.Context()
	retention, err := parseRetention(f.retention)
	if err != nil {
		return nil, err
	}
	if retention == 0 {
		fmt.Fprintf(cmd.ErrOrStderr(), "postbox: --retention 0 means the default, %s\n", postbox.DefaultRetention)
	}
	ccfg := &postbox.Config{Prefix: f.prefix, Retention: retention}
	mcfg := &postboxmigrate.Config{Prefix: f.prefix}
	pg := relayd.URLKind(f.url) == relayd.KindPostgres
	if why := relayd.StorageProblem(f.url, f.storage); why != "" {
		return nil, usagef("--storage %q: %s", f.storage, why)
	}
	switch {
	case f.url == "":
		return nil, usagef("--database is required (or POSTBOX_DATABASE_URL): %s", relayd.URLForms)
	case pg:
		pcfg, err := pgxpool.ParseConfig(f.url)
		if err != nil {
			return nil, usagef("--database: %v", err)
		}
		if !strings.Contains(f.url, "default_query_exec_mode") {
			// An operator's command runs a few statements: describing
			// each instead of preparing it under a name costs nothing
			// here, and works through a transaction pooler (PgBouncer).
			pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
		}
		pool, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			return nil, usagef("--database: %v", err)
		}
		if err := pool.Ping(ctx); err != nil {
			pool.Close()
			return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
		}
		var d postboxdriver.Driver[pgx.Tx] = postboxpgx.New(pool)
		if f.storage == relayd.StorageLog {
			d = postboxpgx.New(pool, postboxpgx.WithLog())
		}
		c, err := finish(d, ccfg, mcfg, pool.Close)
		if err != nil {
			return nil, err
		}
		st, err := postboxpgx.New(pool).Open(f.prefix)
		if err != nil {
			c.close()
			return nil, err
		}
		c.storage, _ = st.(pgsql.StorageSetting)
		return c, nil
	case relayd.URLKind(f.url) != "":
		if relayd.URLKind(f.url) == relayd.KindSQLite && strings.Trim(strings.TrimPrefix(f.url, "sqlite:"), "/") == "" {
			return nil, usagef("--database sqlite: needs a file path, e.g. sqlite:/var/lib/app/app.db")
		}
		d, db, err := relayd.OpenSQL(f.url)
		if err != nil {
			return nil, err
		}
		return finish(d, ccfg, mcfg, func() { _ = db.Close() })
	default:
		return nil, usagef("--database %q: want %s", relayd.Redact(f.url), relayd.URLForms)
	}
}

func finish[TTx any](d postboxdriver.Driver[TTx], ccfg *postbox.Config, mcfg *postboxmigrate.Config, closeFn func()) (*conn, error) {
	client, err := postbox.NewClient(d, ccfg)
	if err != nil {
		closeFn()
		return nil, err
	}
	admin := client.Admin()
	m, err := postboxmigrate.New(d, mcfg)
	if err != nil {
		closeFn()
		return nil, err
	}
	return &conn{admin: admin, inbox: client.Inbox(), migrator: m, close: closeFn, retention: client.Config().Retention}, nil
}

// parseRetention reads --retention: a duration, "7d", or a negative
// duration ("-1s") to keep everything.
func parseRetention(s string) (time.Duration, error) {
	neg := strings.HasPrefix(s, "-")
	d, err := relayd.ParseDuration(strings.TrimPrefix(s, "-"))
	if err != nil {
		return 0, usagef("--retention %q: %v; a negative duration keeps everything", s, err)
	}
	if neg {
		d = -d
	}
	return d, nil
}

// printJSON writes v as indented JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/cmd/postbox/internal/relayd"
	"github.com/postbox-go/postbox/postboxadmin"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxmysql"
	"github.com/postbox-go/postbox/postboxpgx"
	"github.com/postbox-go/postbox/postboxsqlite"
)

// parseTime reads an RFC 3339 time, or a duration meaning that long ago
// ("2h", "7d").
func parseTime(flag, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if d, err := relayd.ParseDuration(s); err == nil {
		return time.Now().Add(-d), nil
	}
	return time.Time{}, usagef("--%s %q: want an RFC 3339 time (2026-01-02T15:04:05Z) or a duration ago (90m, 2h, 7d)", flag, s)
}

func table(w io.Writer, header string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

func withConn(f *dbFlags, run func(ctx context.Context, c *conn, out io.Writer) error) func(*cobra.Command, []string) error {
	return withConnArgs(f, func(ctx context.Context, c *conn, out io.Writer, _ []string) error { return run(ctx, c, out) })
}

// withConnArgs is withConn for a command that reads its arguments.
func withConnArgs(f *dbFlags, run func(ctx context.Context, c *conn, out io.Writer, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		c, err := f.open(cmd)
		if err != nil {
			return err
		}
		defer c.close()
		return run(cmd.Context(), c, cmd.OutOrStdout(), args)
	}
}

func newMigrate(f *dbFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "migrate", Short: "Create or upgrade postbox's tables; print their SQL"}
	cmd.AddCommand(&cobra.Command{
		Use: "up", Short: "Apply every pending migration", Args: cobra.NoArgs,
		RunE: withConn(f, func(ctx context.Context, c *conn, out io.Writer) error {
			done, err := c.migrator.Up(ctx)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(out, map[string]any{"applied": done})
			}
			if len(done) == 0 {
				fmt.Fprintln(out, "schema is current")
			}
			for _, v := range done {
				fmt.Fprintf(out, "applied %03d\n", v)
			}
			return nil
		}),
	}, &cobra.Command{
		Use: "status", Short: "List the migrations and whether each is applied", Args: cobra.NoArgs,
		RunE: withConn(f, func(ctx context.Context, c *conn, out io.Writer) error {
			st, err := c.migrator.Status(ctx)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(out, st)
			}
			var rows [][]string
			for _, s := range st {
				state := "pending"
				if s.Applied {
					state = "applied"
				}
				rows = append(rows, []string{fmt.Sprintf("%03d", s.Version), s.Name, state})
			}
			return table(out, "VERSION\tNAME\tSTATE", rows)
		}),
	})
	var dialect string
	sqlCmd := &cobra.Command{
		Use:   "sql",
		Short: "Print the migrations' SQL for goose, atlas or golang-migrate (no database needed)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, closeDB, err := offlineMigrator(dialect, f.prefix)
			if err != nil {
				return err
			}
			defer closeDB()
			_, err = io.WriteString(cmd.OutOrStdout(), m.SQL())
			return err
		},
	}
	sqlCmd.Flags().StringVar(&dialect, "dialect", "postgres", "postgres, mysql or sqlite")
	cmd.AddCommand(sqlCmd)
	return cmd
}

// offlineMigrator reads the embedded migrations without a connection; the
// caller closes what it opened.
func offlineMigrator(dialect, prefix string) (*postboxmigrate.Migrator, func(), error) {
	cfg := &postboxmigrate.Config{Prefix: prefix}
	var db *sql.DB
	var d postboxdriver.Driver[*sql.Tx]
	var err error
	switch dialect {
	case "postgres":
		m, err := postboxmigrate.New(postboxpgx.New(nil), cfg)
		return m, func() {}, err
	case "sqlite":
		if db, err = sql.Open("sqlite", ":memory:"); err == nil { // never connected
			d, err = postboxsqlite.New(db)
		}
	case "mysql":
		if db, err = postboxmysql.Open(""); err == nil { // never connected
			d, err = postboxmysql.New(db)
		}
	default:
		return nil, nil, usagef("--dialect %q: want postgres, mysql or sqlite", dialect)
	}
	closeDB := func() {
		if db != nil {
			_ = db.Close()
		}
	}
	if err != nil {
		closeDB()
		return nil, nil, err
	}
	m, err := postboxmigrate.New(d, cfg)
	if err != nil {
		closeDB()
		return nil, nil, err
	}
	return m, closeDB, nil
}

func newStatus(f *dbFlags) *cobra.Command {
	var config string
	cmd := &cobra.Command{
		Use: "status", Short: "Pending, oldest pending age, dead and recent publishes, overall and per topic; the oldest snapshot another session holds", Args: cobra.NoArgs,
		Long: `status reports one database's outbox (--database), or with --config the
databases (shards) of a postbox relay configuration, each on its own: a
shard that cannot be read is reported down, with why, and the others are
reported as usual; the command then exits 1.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if config != "" {
				return shardsStatus(cmd, f, config)
			}
			return withConn(f, func(ctx context.Context, c *conn, out io.Writer) error {
				st, err := c.admin.Status(ctx)
				if err != nil {
					return err
				}
				if f.json {
					return printJSON(out, statusJSON(st))
				}
				return printStatus(out, st)
			})(cmd, args)
		},
	}
	cmd.Flags().StringVar(&config, "config", "", "a postbox relay configuration (YAML; POSTBOX_* applied): report each of its databases")
	return cmd
}

// shardsStatus is status --config: every database of a relay's
// configuration, one that is down reported with why.
func shardsStatus(cmd *cobra.Command, f *dbFlags, path string) error {
	cfg, err := relayd.Load(path, os.Getenv)
	if err != nil {
		return usagef("--config: %v", err)
	}
	if len(cfg.Databases) == 0 {
		return usagef("--config %s: no databases", path)
	}
	ctx, out := cmd.Context(), cmd.OutOrStdout()
	var shards []map[string]any
	down := 0
	for i, db := range cfg.Databases {
		sf := *f
		sf.url, sf.prefix, sf.storage = db.URL, db.Prefix, db.Storage
		if sf.prefix == "" {
			sf.prefix = postbox.DefaultPrefix
		}
		if sf.storage == "" {
			sf.storage = relayd.StorageTable
		}
		entry := map[string]any{"shard": strconv.Itoa(i), "database": relayd.Redact(db.URL), "up": false}
		var st postbox.Status
		c, err := sf.open(cmd)
		if err == nil {
			st, err = c.admin.Status(ctx)
			c.close()
		}
		if err != nil {
			down++
			entry["error"] = err.Error()
		} else {
			entry["up"], entry["status"] = true, statusJSON(st)
		}
		shards = append(shards, entry)
		if f.json {
			continue
		}
		if err != nil {
			fmt.Fprintf(out, "shard %d (%s): DOWN: %v\n\n", i, relayd.Redact(db.URL), err)
			continue
		}
		fmt.Fprintf(out, "shard %d (%s): up\n", i, relayd.Redact(db.URL))
		if err := printStatus(out, st); err != nil {
			return err
		}
		fmt.Fprintln(out)
	}
	if f.json {
		if err := printJSON(out, map[string]any{"shards": shards}); err != nil {
			return err
		}
	}
	if down > 0 {
		return fmt.Errorf("%d of %d shard(s) down", down, len(cfg.Databases))
	}
	return nil
}

// statusJSON is status --json's rendering of st.
func statusJSON(st postbox.Status) map[string]any {
	var held any
	if h := st.HeldSnapshot; h != nil {
		held = map[string]any{"age_seconds": h.Age.Seconds(), "pid": h.PID, "state": h.State}
	}
	return map[string]any{
		"pending": st.Pending, "dead": st.Dead, "published_kept": st.Published,
		"pending_estimated": st.PendingEstimated, "published_kept_estimated": st.PublishedEstimated,
		"oldest_pending_age_seconds": st.OldestPendingAge.Seconds(), "topics": topicsJSON(st.Topics),
		"held_snapshot": held,
		"partitions":    map[string]int{"total": st.Partitions.Total, "unowned": st.Partitions.Unowned, "relays": st.Partitions.Relays},
	}
}

// approx is n, marked "≈" when it is the database's estimate.
func approx(n int64, estimated bool) string {
	if estimated {
		return "≈" + strconv.FormatInt(n, 10)
	}
	return strconv.FormatInt(n, 10)
}

// printStatus is status's text rendering of st.
func printStatus(out io.Writer, st postbox.Status) error {
	fmt.Fprintf(out, "pending %s (oldest %s)  dead %d  published kept %s\n",
		approx(st.Pending, st.PendingEstimated), st.OldestPendingAge.Round(time.Millisecond), st.Dead,
		approx(st.Published, st.PublishedEstimated))
	fmt.Fprintf(out, "relays %d live; %d of %d partitions held by none\n", st.Partitions.Relays, st.Partitions.Unowned, st.Partitions.Total)
	if h := st.HeldSnapshot; h != nil {
		fmt.Fprintf(out, "oldest snapshot held by another session: pid %d (%s) for %s; the outbox's dead rows stay until it ends\n",
			h.PID, h.State, h.Age.Round(time.Millisecond))
	}
	fmt.Fprintln(out)
	var rows [][]string
	for _, t := range st.Topics {
		rows = append(rows, []string{t.Topic, strconv.FormatInt(t.Pending, 10), t.OldestPendingAge.Round(time.Millisecond).String(),
			strconv.FormatInt(t.Dead, 10), fmt.Sprintf("%.1f", float64(t.PublishedLastMinute)/60)})
	}
	return table(out, "TOPIC\tPENDING\tOLDEST\tDEAD\tPUBLISHED/S (1 MIN)", rows)
}

func topicsJSON(ts []postbox.TopicStats) []map[string]any {
	out := make([]map[string]any, 0, len(ts))
	for _, t := range ts {
		out = append(out, map[string]any{
			"topic": t.Topic, "pending": t.Pending, "dead": t.Dead,
			"oldest_pending_age_seconds": t.OldestPendingAge.Seconds(), "published_last_minute": t.PublishedLastMinute,
		})
	}
	return out
}

// deadFilterFlags are the selection flags of the dead commands; the
// consumers' side adds --consumer.
type deadFilterFlags struct {
	consumer, topic, key, since, until string
	limit                              int
	all                                bool
}

func (d *deadFilterFlags) register(cmd *cobra.Command, bulk, consumer bool) {
	fl := cmd.Flags()
	if consumer {
		fl.StringVar(&d.consumer, "consumer", "", "only this consumer")
	}
	fl.StringVar(&d.topic, "topic", "", "only this topic")
	fl.StringVar(&d.key, "key", "", "only this key")
	fl.StringVar(&d.since, "since", "", "dead at or after (RFC 3339, or a duration ago: 2h, 7d)")
	fl.StringVar(&d.until, "until", "", "dead before (RFC 3339, or a duration ago)")
	if bulk {
		fl.BoolVar(&d.all, "all", false, "select every dead message when no id or filter is given")
	} else {
		fl.IntVar(&d.limit, "limit", 100, "most messages to list")
	}
}

func (d *deadFilterFlags) filter(ids []string) (postbox.DeadFilter, error) {
	since, err := parseTime("since", d.since)
	if err != nil {
		return postbox.DeadFilter{}, err
	}
	until, err := parseTime("until", d.until)
	if err != nil {
		return postbox.DeadFilter{}, err
	}
	return postbox.DeadFilter{IDs: ids, Consumer: d.consumer, Topic: d.topic, Key: d.key, Since: since, Until: until, Limit: d.limit}, nil
}

// deadSide is what differs between the outbox's dead messages (`postbox
// dead`, through Admin) and the consumers' (`postbox consumer-dead`,
// through the inbox): how to read them and how to show them. The commands
// themselves are built once, by deadList, deadShow and deadBulk.
type deadSide struct {
	consumer bool // the consumers' side: --consumer, and a consumer per message
	list     func(ctx context.Context, c *conn, f postbox.DeadFilter) ([]postbox.DeadMessage, error)
	get      func(ctx context.Context, c *conn, args []string) (postbox.DeadMessage, error)
	json     func(d *postbox.DeadMessage) map[string]any
	header   string // the list's columns
	row      func(d *postbox.DeadMessage) []string
	detail   func(out io.Writer, d *postbox.DeadMessage)
}

var outboxDead = deadSide{
	list: func(ctx context.Context, c *conn, f postbox.DeadFilter) ([]postbox.DeadMessage, error) {
		return c.admin.ListDead(ctx, f)
	},
	get: func(ctx context.Context, c *conn, args []string) (postbox.DeadMessage, error) {
		return c.admin.GetDead(ctx, args[0])
	},
	json:   deadJSON,
	header: "ID\tTOPIC\tKEY\tATTEMPTS\tDEAD AT\tLAST ERROR",
	row: func(d *postbox.DeadMessage) []string {
		return []string{d.ID, safe(d.Topic), safe(oneLine(d.Key, 40)), strconv.Itoa(d.Attempts), d.DeadAt.UTC().Format(time.RFC3339), reason(d, 80)}
	},
	detail: func(out io.Writer, d *postbox.DeadMessage) {
		fmt.Fprintf(out, "id          %s\nseq         %d\ntopic       %s\nkey         %s\nattempts    %d\ncreated at  %s\ndead at     %s\nlast error  %s\n",
			d.ID, d.Seq, safe(d.Topic), safe(d.Key), d.Attempts, rfc3339(d.CreatedAt), rfc3339(d.DeadAt), safe(d.Error))
	},
}

// deadList is the `list` command of a side.
func deadList(f *dbFlags, side deadSide, short string) *cobra.Command {
	var lf deadFilterFlags
	list := &cobra.Command{Use: "list", Short: short, Args: cobra.NoArgs}
	lf.register(list, false, side.consumer)
	list.RunE = withConn(f, func(ctx context.Context, c *conn, out io.Writer) error {
		filter, err := lf.filter(nil)
		if err != nil {
			return err
		}
		ds, err := side.list(ctx, c, filter)
		if err != nil {
			return err
		}
		if f.json {
			js := make([]map[string]any, 0, len(ds))
			for i := range ds {
				js = append(js, side.json(&ds[i]))
			}
			return printJSON(out, js)
		}
		rows := make([][]string, 0, len(ds))
		for i := range ds {
			rows = append(rows, side.row(&ds[i]))
		}
		return table(out, side.header, rows)
	})
	return list
}

// deadShow is the `show` command of a side: the message with its headers
// and payload.
func deadShow(f *dbFlags, side deadSide, use, short string, args int) *cobra.Command {
	return &cobra.Command{
		Use: use, Short: short, Args: cobra.ExactArgs(args),
		RunE: withConnArgs(f, func(ctx context.Context, c *conn, out io.Writer, args []string) error {
			d, err := side.get(ctx, c, args)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(out, side.json(&d))
			}
			side.detail(out, &d)
			writeHeaders(out, d.Headers)
			writePayload(out, d.Payload)
			return nil
		}),
	}
}

// deadBulk is a command acting on the dead messages of a side that its
// ids or its filter select; done says what it did with %d of them.
func deadBulk(f *dbFlags, side deadSide, use, short, done string, op func(ctx context.Context, c *conn, s postbox.DeadSelection) (int, error)) *cobra.Command {
	var bf deadFilterFlags
	cmd := &cobra.Command{Use: use + " [ID...]", Short: short}
	bf.register(cmd, true, side.consumer)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		// A bad selection is refused before anything connects.
		filter, err := bf.filter(args)
		if err != nil {
			return err
		}
		return withConn(f, func(ctx context.Context, c *conn, out io.Writer) error {
			n, err := op(ctx, c, postbox.DeadSelection{DeadFilter: filter, All: bf.all})
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(out, map[string]int{"count": n})
			}
			fmt.Fprintf(out, done+"\n", n)
			return nil
		})(cmd, args)
	}
	return cmd
}

func newDead(f *dbFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "dead", Short: "Messages past their attempt budget: list, show, requeue, delete"}
	cmd.AddCommand(
		deadList(f, outboxDead, "List dead messages, newest first"),
		deadShow(f, outboxDead, "show ID", "Show one dead message with its payload and headers", 1),
		deadBulk(f, outboxDead, "requeue", "Move dead messages back to the outbox with their attempts reset", "requeued %d message(s)",
			func(ctx context.Context, c *conn, s postbox.DeadSelection) (int, error) {
				return c.admin.RequeueDead(ctx, s)
			}),
		deadBulk(f, outboxDead, "delete", "Delete dead messages", "deleted %d message(s)",
			func(ctx context.Context, c *conn, s postbox.DeadSelection) (int, error) {
				return c.admin.DeleteDead(ctx, s)
			}))
	return cmd
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n-1] + "…"
	}
	return s
}

func newReplay(f *dbFlags) *cobra.Command {
	var since, until, topic, key, actor, window string
	var dry, asNew, acceptDropped bool
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Send published messages again, under their own ids or as new messages (audited; refused past the retention horizon)",
		Long: `replay sends published messages created in [--since, --until) again.

Under their own ids (the default), consumers whose inbox holds an id run
nothing, and the others (a new consumer, one that lost its state) process the
messages. A broker with a duplicate window (JetStream's Duplicates, 2m by
default; the Redis publisher's dedupe key) drops the copy of a message it saw
within that window: give the window with --dedupe-window and replay says how
many it would drop, and refuses a real run while any would be, unless
--accept-dropped. The daemon's API (POST /v1/replay) reads the windows from
the brokers itself.

With --as-new, copies are sent as new messages: fresh ids, every header kept,
plus postbox-replay-of (the original id) and postbox-replay (the audit entry):
every consumer runs them again, whatever its inbox or the broker remembers.
Use it when consumers must run again; use the default to fill in consumers
that missed messages without running the others twice.`,
		Args: cobra.NoArgs,
		RunE: withConn(f, func(ctx context.Context, c *conn, out io.Writer) error {
			s, err := parseTime("since", since)
			if err != nil {
				return err
			}
			u, err := parseTime("until", until)
			if err != nil {
				return err
			}
			if u.IsZero() {
				u = time.Now()
			}
			var win time.Duration
			if window != "" {
				if win, err = relayd.ParseDuration(window); err != nil || win < 0 {
					return usagef("--dedupe-window %q: want a duration, e.g. 2m", window)
				}
			}
			req := postbox.ReplayRequest{Since: s, Until: u, Topic: topic, Key: key, DryRun: dry, AsNew: asNew, Actor: actor}
			var preview postbox.ReplayPreview
			if !asNew {
				var w postbox.DedupeWindow
				if win > 0 {
					w = func(context.Context, string) (time.Duration, string, error) {
						return win, "the broker (--dedupe-window)", nil
					}
				}
				if preview, err = c.admin.ReplayPreview(ctx, req, w); err != nil {
					return err
				}
				if d := preview.Dropped(); d > 0 && !dry && !acceptDropped {
					return usagef("--as-new: not replayed: %d of the %d message(s) were published within the last %s, the broker's duplicate window, "+
						"and it would drop them as copies; replay them with --as-new for consumers that must run again, after the window, "+
						"or with --accept-dropped", d, preview.Count, win)
				}
			}
			n, err := c.admin.Replay(ctx, req)
			if err != nil {
				return err
			}
			if f.json {
				topics := make([]map[string]any, 0, len(preview.Topics))
				for _, t := range preview.Topics {
					topics = append(topics, map[string]any{"topic": t.Topic, "count": t.Count, "dedupe_window_seconds": t.Window.Seconds(), "dropped": t.Dropped})
				}
				return printJSON(out, map[string]any{"count": n, "dry_run": dry, "as_new": asNew, "since": s.UTC(), "until": u.UTC(),
					"topic": topic, "key": key, "dropped": preview.Dropped(), "topics": topics})
			}
			span := fmt.Sprintf("created in [%s, %s)", s.UTC().Format(time.RFC3339), u.UTC().Format(time.RFC3339))
			switch {
			case asNew && dry:
				fmt.Fprintf(out, "would send %d message(s) %s as new messages (fresh ids, the original in postbox-replay-of)\n", n, span)
			case asNew:
				fmt.Fprintf(out, "sent %d message(s) %s to the outbox as new messages (fresh ids, the original in postbox-replay-of): every consumer runs them again\n", n, span)
			default:
				verb := "re-staged"
				if dry {
					verb = "would re-stage"
				}
				fmt.Fprintf(out, "%s %d message(s) %s under their own ids: consumers whose inbox holds an id run nothing\n", verb, n, span)
				for _, t := range preview.Topics {
					if t.Dropped > 0 {
						fmt.Fprintf(out, "%s: %d of %d published within the last %s: the broker drops them as copies (--as-new sends them as new messages)\n",
							t.Topic, t.Dropped, t.Count, t.Window)
					}
				}
				if win == 0 {
					fmt.Fprintln(out, "a broker with a duplicate window (JetStream, Redis) drops copies of messages it saw within it: --dedupe-window checks, --as-new avoids")
				}
			}
			return nil
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&since, "since", "", "messages created at or after (RFC 3339, or a duration ago); required")
	fl.StringVar(&until, "until", "", "messages created before (default now)")
	fl.StringVar(&topic, "topic", "", "only this topic")
	fl.StringVar(&key, "key", "", "only this key")
	fl.BoolVar(&dry, "dry-run", false, "count only")
	fl.BoolVar(&asNew, "as-new", false, "send copies as new messages: fresh ids, the original id in the postbox-replay-of header")
	fl.StringVar(&window, "dedupe-window", "", "the broker's duplicate window (JetStream Duplicates, e.g. 2m): say how many copies it would drop, and refuse while any would")
	fl.BoolVar(&acceptDropped, "accept-dropped", false, "replay under the original ids even though the broker drops some as copies")
	fl.StringVar(&actor, "actor", defaultActor(), "who asks, for the audit")
	var limit int
	log := &cobra.Command{
		Use: "log", Short: "The replay audit, newest first", Args: cobra.NoArgs,
		RunE: withConn(f, func(ctx context.Context, c *conn, out io.Writer) error {
			as, err := c.admin.Replays(ctx, limit)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(out, as)
			}
			var rows [][]string
			for _, a := range as {
				rows = append(rows, []string{strconv.FormatInt(a.ID, 10), a.At.UTC().Format(time.RFC3339), a.Actor,
					a.Since.UTC().Format(time.RFC3339) + " .. " + a.Until.UTC().Format(time.RFC3339), a.Topic, a.Key,
					strconv.Itoa(a.Count), strconv.FormatBool(a.DryRun), strconv.FormatBool(a.AsNew)})
			}
			return table(out, "ID\tAT\tACTOR\tWINDOW\tTOPIC\tKEY\tCOUNT\tDRY RUN\tAS NEW", rows)
		}),
	}
	log.Flags().IntVar(&limit, "limit", 50, "most entries")
	cmd.AddCommand(log)
	return cmd
}

func defaultActor() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, _ := os.Hostname()
	return name + "@" + host
}

func newPrune(f *dbFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "prune",
		Short: "Delete published messages older than --retention, in batches (never pending or dead ones)",
		Long: `prune deletes published messages older than --retention (default 7d; 0 means
the default, and says so; a negative retention keeps everything, and prune then
deletes nothing), in batches, until none is left. Pending and dead messages are
never touched. The relay prunes by itself: this is for a one-off.`,
		Args: cobra.NoArgs,
		RunE: withConn(f, func(ctx context.Context, c *conn, out io.Writer) error {
			progress := func(n int) {
				if !f.json {
					fmt.Fprintf(out, "\rdeleted %d", n)
				}
			}
			n, err := c.admin.Prune(ctx, progress)
			if !f.json && n > 0 {
				fmt.Fprintln(out)
			}
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(out, map[string]any{"deleted": n, "retention_seconds": c.retention.Seconds()})
			}
			fmt.Fprintf(out, "deleted %d published message(s) older than %s\n", n, c.retentionText())
			return nil
		}),
	}
}

// exitCode maps an error to the process's exit status: 2 for bad input
// (a flag, an argument, a validation failure, an admin listener refused
// without tokens), 3 for a missing message, 1 for the rest.
func exitCode(err error) int {
	var u *errUsage
	var ve *postbox.ValidationError
	var ce *postbox.ConfigError
	var le *postboxadmin.ListenError
	if errors.As(err, &u) || errors.As(err, &ve) || errors.As(err, &ce) || errors.As(err, &le) ||
		errors.Is(err, postbox.ErrEmptySelection) || errors.Is(err, postboxdriver.ErrBeyondHorizon) {
		return 2
	}
	if errors.Is(err, postboxdriver.ErrNotFound) {
		return 3
	}
	return 1
}

package compare

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxnats"
	"github.com/postbox-go/postbox/postboxpgx"
)

// postbox writes the backlog with Client.Write, 1,000 messages per
// transaction, and times a relay with default settings from Start until
// the outbox is empty and the stream holds every message.
func (r *run) postbox(ctx context.Context, res *Result) error {
	prefix := "bench_cmp_" + r.tag + "_"
	name := "BENCH_CMP_PB_" + r.tag
	subjects := "bench.cmp.pb." + r.tag + "."
	drop, err := r.stream(ctx, name, subjects+">")
	if err != nil {
		return err
	}
	defer drop()

	driver := postboxpgx.New(r.pool)
	m, err := postboxmigrate.New(driver, &postboxmigrate.Config{Prefix: prefix})
	if err != nil {
		return err
	}
	defer r.dropPrefix(prefix)
	if _, err := m.Up(ctx); err != nil {
		return err
	}
	pub, err := postboxnats.New(r.js, &postboxnats.Config{SubjectPrefix: subjects})
	if err != nil {
		return err
	}
	defer func() { _ = pub.Close(context.WithoutCancel(ctx)) }()
	client, err := postbox.NewClient(driver, &postbox.Config{
		Prefix:    prefix,
		Publisher: pub,
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return err
	}

	n := r.opts.Messages
	fmt.Fprintf(r.out, "postbox: writing a backlog of %d messages (%d keys)\n", n, r.opts.Keys)
	start := time.Now()
	const chunk = 1000
	msgs := make([]postbox.Message, 0, chunk)
	for i := 0; i < n; i++ {
		msg := postbox.Message{Topic: "m", Payload: r.payload}
		if r.opts.Keys > 0 {
			msg.Key = fmt.Sprintf("key-%d", i%r.opts.Keys)
		}
		msgs = append(msgs, msg)
		if len(msgs) == chunk || i == n-1 {
			if err := client.Write(ctx, msgs...); err != nil {
				return err
			}
			msgs = msgs[:0]
		}
	}
	res.PostboxWriteRate = float64(n) / time.Since(start).Seconds()
	if _, err := r.pool.Exec(ctx, "VACUUM ANALYZE "+prefix+"outbox"); err != nil {
		return err
	}

	c := client.Config()
	fmt.Fprintf(r.out, "postbox: draining to JetStream (defaults: %d lanes, batch %d, window %d)\n", c.Lanes, c.BatchSize, c.PublishWindow)
	start = time.Now()
	if err := client.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = client.Stop(context.WithoutCancel(ctx)) }()
	err = poll(ctx, func() (bool, error) {
		var empty bool
		if err := r.pool.QueryRow(ctx, "SELECT NOT EXISTS (SELECT 1 FROM "+prefix+"outbox)").Scan(&empty); err != nil || !empty {
			return false, err
		}
		got, err := r.streamMsgs(ctx, name)
		if err != nil {
			return false, err
		}
		if got > n {
			return false, fmt.Errorf("%w: %d, want %d", errTooMany, got, n)
		}
		return got == n, nil
	})
	if err != nil {
		return err
	}
	res.PostboxElapsed = time.Since(start)
	res.PostboxRate = float64(n) / res.PostboxElapsed.Seconds()
	fmt.Fprintf(r.out, "postbox: drained %d messages in %s: %.0f msg/s\n", n, res.PostboxElapsed.Round(time.Millisecond), res.PostboxRate)
	return nil
}

// dropPrefix drops every table whose name starts with prefix.
func (r *run) dropPrefix(prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := r.pool.Query(ctx, `SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = current_schema() AND starts_with(tablename, $1)`, prefix)
	if err != nil {
		return
	}
	var names []string
	for rows.Next() {
		var n string
		if rows.Scan(&n) == nil {
			names = append(names, n)
		}
	}
	rows.Close()
	for _, n := range names {
		r.exec("DROP TABLE IF EXISTS " + n + " CASCADE")
	}
}

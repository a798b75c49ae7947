package compare

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
)

// watermill writes the backlog through the forwarder's publisher decorating
// a watermill-sql publisher made on each transaction (as Watermill's
// forwarder docs show), 1,000 messages per transaction, then times
// Watermill's forwarder (watermill-sql subscriber in, watermill-nats
// JetStream publisher out) from Run until the stream holds the target
// count or the phase's cap is reached.
//
// Configuration, after the watermill-sql and watermill-nats docs:
// DefaultPostgreSQLSchema with DefaultPostgreSQLOffsetsAdapter (the pair
// documented for PostgreSQL; JSON payload column, which fits the
// forwarder's JSON envelope), or on request the documented alternative,
// the queue schema with DeleteOnAck; SubscribeBatchSize at its default
// unless set; JetStream with TrackMsgId, so each message carries its UUID
// as Nats-Msg-Id as postbox's messages carry their id; the stream made
// beforehand rather than auto-provisioned, as for postbox.
func (r *run) watermill(ctx context.Context, res *Result) error {
	topic := "postbox_bench_cmp_" + r.tag // the forwarder's SQL topic
	name := "BENCH_CMP_WM_" + r.tag
	dest := "bench.cmp.wm." + r.tag + ".m"
	drop, err := r.stream(ctx, name, "bench.cmp.wm."+r.tag+".>")
	if err != nil {
		return err
	}
	defer drop()

	// Errors only, so that a forwarder that fails and retries shows up
	// in the output rather than only as a low rate. Stopping the
	// forwarder cancels the subscriber's idle poll, which it logs as an
	// error: the gate silences the log once the clock has stopped.
	quiet := new(atomic.Bool)
	logger := watermill.NewSlogLogger(slog.New(gate{slog.NewTextHandler(r.out, &slog.HandlerOptions{Level: slog.LevelError}), quiet}))
	var schema wmsql.SchemaAdapter = wmsql.DefaultPostgreSQLSchema{SubscribeBatchSize: r.opts.WatermillBatch}
	var offsets wmsql.OffsetsAdapter = wmsql.DefaultPostgreSQLOffsetsAdapter{}
	if r.opts.WatermillSchema == SchemaQueue {
		schema = wmsql.PostgreSQLQueueSchema{SubscribeBatchSize: r.opts.WatermillBatch}
		offsets = wmsql.PostgreSQLQueueOffsetsAdapter{DeleteOnAck: true}
	}
	// Both schemas name their table "watermill_<topic>"; only the
	// default one has an offsets table.
	table := `"watermill_` + topic + `"`
	sub, err := wmsql.NewSubscriber(wmsql.BeginnerFromPgx(r.pool), wmsql.SubscriberConfig{
		SchemaAdapter:  schema,
		OffsetsAdapter: offsets,
	}, logger)
	if err != nil {
		return err
	}
	defer sub.Close()
	defer r.exec("DROP TABLE IF EXISTS " + table + `, "watermill_offsets_` + topic + `"`)
	// The tables are made before the backlog is written; subscribing
	// (which the forwarder does when it runs) would start consuming.
	if err := sub.SubscribeInitialize(topic); err != nil {
		return err
	}

	n := r.opts.Messages
	fmt.Fprintf(r.out, "watermill: writing a backlog of %d messages\n", n)
	start := time.Now()
	const chunk = 1000
	msgs := make([]*message.Message, 0, chunk)
	for i := 0; i < n; i++ {
		msg := message.NewMessage(watermill.NewUUID(), r.payload)
		msg.SetContext(ctx) // the SQL publisher runs its INSERT under the first message's context
		msgs = append(msgs, msg)
		if len(msgs) == chunk || i == n-1 {
			if err := r.watermillWrite(ctx, schema, topic, dest, logger, msgs); err != nil {
				return err
			}
			msgs = msgs[:0]
		}
	}
	res.WatermillWriteRate = float64(n) / time.Since(start).Seconds()
	if _, err := r.pool.Exec(ctx, "VACUUM ANALYZE "+table); err != nil {
		return err
	}

	pub, err := wmnats.NewPublisher(wmnats.PublisherConfig{
		URL:       r.opts.NatsURL,
		JetStream: wmnats.JetStreamConfig{TrackMsgId: true},
	}, logger)
	if err != nil {
		return err
	}
	defer pub.Close()
	fwd, err := forwarder.NewForwarder(sub, pub, logger, forwarder.Config{ForwarderTopic: topic})
	if err != nil {
		return err
	}
	defer func() { _ = fwd.Close() }()

	target := r.opts.WatermillMax
	res.WatermillTarget = target
	batch := r.opts.WatermillBatch
	if batch == 0 {
		batch = 100
	}
	fmt.Fprintf(r.out, "watermill: forwarding to JetStream (%s schema, subscribe batch %d), timing %d messages, cap %s\n", r.opts.WatermillSchema, batch, target, r.opts.WatermillTimeout)
	capCtx, cancel := context.WithTimeout(ctx, r.opts.WatermillTimeout)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	ran := make(chan error, 1)
	start = time.Now()
	go func() { ran <- fwd.Run(runCtx) }()
	var reached int
	var at time.Duration
	err = poll(capCtx, func() (bool, error) {
		select {
		case err := <-ran:
			if err == nil {
				err = errors.New("no error")
			}
			return false, fmt.Errorf("the forwarder stopped early: %w", err)
		default:
		}
		got, err := r.streamMsgs(ctx, name)
		if err != nil {
			return false, err
		}
		if got > n {
			return false, fmt.Errorf("%w: %d, want %d", errTooMany, got, n)
		}
		if got != reached {
			reached, at = got, time.Since(start)
		}
		return got >= target, nil
	})
	capped := errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil
	if err != nil && !capped {
		return err
	}
	res.WatermillReached = reached
	res.WatermillCapped = capped
	res.WatermillElapsed = at
	if at > 0 {
		res.WatermillRate = float64(reached) / at.Seconds()
	}
	if capped {
		fmt.Fprintf(r.out, "watermill: capped at %s: %d of %d messages acknowledged, the last after %s: %.0f msg/s\n",
			r.opts.WatermillTimeout, reached, target, at.Round(time.Millisecond), res.WatermillRate)
	} else {
		fmt.Fprintf(r.out, "watermill: forwarded %d messages in %s: %.0f msg/s\n", reached, at.Round(time.Millisecond), res.WatermillRate)
	}
	quiet.Store(true)
	if err := fwd.Close(); err != nil {
		return err
	}
	stop()
	if err := <-ran; err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("the forwarder: %w", err)
	}
	return nil
}

// watermillWrite writes one chunk in a transaction of its own, through a
// publisher made on that transaction.
func (r *run) watermillWrite(ctx context.Context, schema wmsql.SchemaAdapter, topic, dest string, logger watermill.LoggerAdapter, msgs []*message.Message) (err error) {
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	sqlPub, err := wmsql.NewPublisher(wmsql.TxFromPgx(tx), wmsql.PublisherConfig{SchemaAdapter: schema}, logger)
	if err != nil {
		return err
	}
	pub := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: topic})
	if err := pub.Publish(dest, msgs...); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// gate is a slog.Handler that drops every record while off is set.
type gate struct {
	slog.Handler
	off *atomic.Bool
}

func (g gate) Enabled(ctx context.Context, l slog.Level) bool {
	return !g.off.Load() && g.Handler.Enabled(ctx, l)
}

func (g gate) WithAttrs(attrs []slog.Attr) slog.Handler {
	return gate{g.Handler.WithAttrs(attrs), g.off}
}

func (g gate) WithGroup(name string) slog.Handler {
	return gate{g.Handler.WithGroup(name), g.off}
}

package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/cpuuse"
	"github.com/postbox-go/postbox/internal/pglog"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxamqp"
)

// RabbitMQOptions configure the RabbitMQ drain benchmark.
type RabbitMQOptions struct {
	DatabaseURL string
	AMQPURL     string
	Messages    int // default 100,000
	Keys        int // distinct ordering keys; 0 means keyless; default 1,000
	// Window is the raw baseline's outstanding confirms; default 256,
	// the relay's default publish window.
	Window int
	// Classic uses classic queues instead of quorum queues.
	Classic bool
	// RawHeaders has the raw baseline carry the headers table a relay's
	// message carries (the CloudEvents attributes, the partition key,
	// the replay horizon), so that the ratio compares like with like.
	RawHeaders bool
	// Timeout bounds the drain; default 30 minutes.
	Timeout time.Duration
	// CPUProfile, when set, names a file that receives a CPU profile of
	// the drain phase (the relay, in this process).
	CPUProfile string
	// Storage is "table" (the default: the outbox, its backlog inserted
	// with SQL as another writer would) or "log" (the log of design §3,
	// as postboxpgx.WithLog, its backlog written through the Client).
	Storage string
}

// RabbitMQResult is one run's figures.
type RabbitMQResult struct {
	Messages     int
	RawRate      float64 // raw confirmed publishes per second
	WriteRate    float64 // backlog rows written per second
	DrainRate    float64 // backlog rows published, confirmed and marked per second
	DrainElapsed time.Duration
	Ratio        float64 // DrainRate / RawRate
	QueueDepth   int     // messages in the drain's queue at the end
	// RawCPU and DrainCPU are the CPU per message of this process (the
	// raw publisher, then the relay), PostgreSQL's and RabbitMQ's
	// (beam.smp) in each phase; CPUKnown is false where /proc is not
	// readable.
	RawCPU, DrainCPU CPUUse
	CPUKnown         bool
}

// Validate checks the options, naming the flag of each bad value.
func (o *RabbitMQOptions) Validate() error {
	var errs []error
	if o.Messages < 1 || o.Messages > 100_000_000 {
		errs = append(errs, fmt.Errorf("--messages %d: want 1 to 100000000", o.Messages))
	}
	if o.Keys < 0 {
		errs = append(errs, fmt.Errorf("--keys %d: want 0 (keyless) or more", o.Keys))
	}
	if o.Window < 1 || o.Window > 65535 {
		errs = append(errs, fmt.Errorf("--window %d: want 1 to 65535", o.Window))
	}
	if o.Timeout < time.Second {
		errs = append(errs, fmt.Errorf("--timeout %s: want at least 1s", o.Timeout))
	}
	if o.Storage != "" && o.Storage != "table" && o.Storage != "log" {
		errs = append(errs, fmt.Errorf("--storage %q: want table or log", o.Storage))
	}
	return errors.Join(errs...)
}

func (o *RabbitMQOptions) defaults() {
	defaultURLs(&o.DatabaseURL, testdb.PostgresURL(), nil)
	o.AMQPURL = cmp.Or(o.AMQPURL, "amqp://guest:guest@127.0.0.1:5672/")
	o.Messages = cmp.Or(o.Messages, 100_000)
	o.Window = cmp.Or(o.Window, postbox.DefaultPublishWindow)
	o.Timeout = cmp.Or(o.Timeout, 30*time.Minute)
}

// RabbitMQ measures the raw confirmed publish rate to a quorum queue (the
// baseline), then drains an outbox backlog of the same messages through
// postboxamqp with a relay at default settings, and checks the queue holds
// exactly the backlog.
func RabbitMQ(ctx context.Context, opts RabbitMQOptions, out io.Writer) (RabbitMQResult, error) {
	opts.defaults()
	res := RabbitMQResult{Messages: opts.Messages}
	if err := opts.Validate(); err != nil {
		return res, err
	}
	conn, err := amqp.Dial(opts.AMQPURL)
	if err != nil {
		return res, fmt.Errorf("connect to RabbitMQ: %w", err)
	}
	defer conn.Close()
	tag := randTag()
	raw := postboxamqp.Topology{Exchange: "bench.raw." + tag, Queue: "bench.raw." + tag, Bindings: []string{"#"}, Classic: opts.Classic}
	drain := postboxamqp.Topology{Exchange: "bench.drain." + tag, Queue: "bench.drain." + tag, Bindings: []string{"#"}, Classic: opts.Classic}
	defer func() {
		for _, t := range []postboxamqp.Topology{raw, drain} {
			if err := deleteTopology(conn, t); err != nil {
				fmt.Fprintf(out, "rabbitmq: clean-up: %v\n", err)
			}
		}
	}()
	for _, t := range []postboxamqp.Topology{raw, drain} {
		if err := postboxamqp.EnsureTopology(ctx, conn, t); err != nil {
			return res, err
		}
	}
	payload := makePayload(256)

	kind := "quorum"
	if opts.Classic {
		kind = "classic"
	}
	fmt.Fprintf(out, "raw RabbitMQ: publishing %d persistent messages of %d bytes to a %s queue, %d confirms outstanding\n", opts.Messages, len(payload), kind, opts.Window)
	rawCPU := cpuuse.PhaseOf(rabbitMQProcess)
	var headers func(i int, id string) amqp.Table
	if opts.RawHeaders {
		at := time.Now().UTC().Format(time.RFC3339Nano)
		headers = func(i int, id string) amqp.Table { return relayHeaders(id, at, i, opts.Keys) }
	}
	if res.RawRate, err = rawConfirmed(ctx, conn, raw.Exchange, payload, opts.Messages, opts.Window, headers); err != nil {
		return res, err
	}
	var rawKnown bool
	res.RawCPU, rawKnown = rawCPU(opts.Messages)
	if n, err := queueDepth(conn, raw.Queue); err != nil {
		return res, err
	} else if n != opts.Messages {
		return res, fmt.Errorf("raw queue holds %d messages, want %d", n, opts.Messages)
	}
	fmt.Fprintf(out, "raw RabbitMQ: %.0f msg/s\n", res.RawRate)
	// The raw queue's messages are no longer needed; purging them frees
	// the broker for the drain.
	if err := purge(conn, raw.Queue); err != nil {
		return res, err
	}

	pool, err := pgxpool.New(ctx, opts.DatabaseURL)
	if err != nil {
		return res, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer pool.Close()
	prefix := "bench_rmq_" + tag + "_"
	driver, drop, err := migrated(ctx, pool, prefix)
	if err != nil {
		return res, err
	}
	defer drop()
	pub, err := postboxamqp.New(postboxamqp.URL(opts.AMQPURL), &postboxamqp.Config{Exchange: drain.Exchange})
	if err != nil {
		return res, err
	}
	defer func() { _ = pub.Close(context.WithoutCancel(ctx)) }()
	cfg := &postbox.Config{Prefix: prefix, Publisher: pub, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	var logs *pglog.Driver[pgx.Tx]
	var client *postbox.Client[pgx.Tx]
	table := prefix + "outbox"
	if opts.Storage == "log" {
		if err := pglog.UseLog(ctx, pool, prefix); err != nil {
			return res, fmt.Errorf("switch the database to the log: %w", err)
		}
		logs, table = pglog.New(driver, pool, 0), prefix+"log"
		client, err = postbox.NewClient(logs, cfg)
	} else {
		client, err = postbox.NewClient(driver, cfg)
	}
	if err != nil {
		return res, err
	}
	fmt.Fprintf(out, "postbox: writing a backlog of %d messages to PostgreSQL (%d keys, storage %s)\n", opts.Messages, opts.Keys, cmp.Or(opts.Storage, "table"))
	began := time.Now()
	if logs != nil {
		err = writeBacklog(ctx, client, payload, opts.Messages, opts.Keys)
	} else {
		for done := 0; err == nil && done < opts.Messages; done += 50_000 {
			err = fillBacklog(ctx, pool, prefix, min(50_000, opts.Messages-done), max(opts.Keys, 1), opts.Keys == 0)
		}
	}
	if err != nil {
		return res, err
	}
	res.WriteRate = float64(opts.Messages) / time.Since(began).Seconds()
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+table); err != nil {
		return res, err
	}
	// What is left to publish: the outbox's rows, or the log's messages
	// not yet recorded as published.
	pending := func(ctx context.Context) (int64, error) {
		if logs != nil {
			return int64(opts.Messages) - logs.Published(), nil
		}
		return outboxPending(ctx, pool, prefix)
	}

	fmt.Fprintf(out, "postbox: draining the backlog to RabbitMQ through postboxamqp (relay defaults)\n")
	dctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	stopProfile, err := startCPUProfile(opts.CPUProfile)
	if err != nil {
		return res, err
	}
	defer stopProfile()
	drainCPU := cpuuse.PhaseOf(rabbitMQProcess)
	began = time.Now()
	if err := client.Start(dctx); err != nil {
		return res, err
	}
	defer func() { _ = client.Stop(context.WithoutCancel(ctx)) }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	lastReport := time.Now()
	for {
		pending, err := pending(dctx)
		if err != nil {
			return res, err
		}
		if pending == 0 {
			break
		}
		if time.Since(lastReport) > 5*time.Second {
			lastReport = time.Now()
			fmt.Fprintf(out, "  %s: %d pending\n", time.Since(began).Round(time.Second), pending)
		}
		select {
		case <-tick.C:
		case <-dctx.Done():
			return res, fmt.Errorf("drain: %d rows still pending: %w", pending, dctx.Err())
		}
	}
	res.DrainElapsed = time.Since(began)
	var drainKnown bool
	res.DrainCPU, drainKnown = drainCPU(opts.Messages)
	res.CPUKnown = rawKnown && drainKnown
	stopProfile()
	res.DrainRate = float64(opts.Messages) / res.DrainElapsed.Seconds()
	res.Ratio = res.DrainRate / res.RawRate
	if err := client.Stop(ctx); err != nil {
		return res, err
	}
	if res.QueueDepth, err = queueDepth(conn, drain.Queue); err != nil {
		return res, err
	}
	if res.QueueDepth != opts.Messages {
		return res, fmt.Errorf("queue %s holds %d messages after the drain, want %d", drain.Queue, res.QueueDepth, opts.Messages)
	}
	fmt.Fprintf(out, "postbox: drained %d messages in %s: %.0f msg/s; the queue holds %d\n", opts.Messages, res.DrainElapsed.Round(time.Millisecond), res.DrainRate, res.QueueDepth)
	if res.CPUKnown {
		fmt.Fprintf(out, "CPU per message, raw: publisher %s, RabbitMQ %s; drain: relay %s, postgres %s, RabbitMQ %s\n",
			us(res.RawCPU.Self), us(res.RawCPU.Broker), us(res.DrainCPU.Self), us(res.DrainCPU.Database), us(res.DrainCPU.Broker))
	}
	return res, nil
}

// rabbitMQProcess is the name of RabbitMQ's server process.
const rabbitMQProcess = "beam.smp"

// relayHeaders is the headers table postboxamqp sends for the i-th
// message of the backlog, with id and the time at: the CloudEvents
// attributes the relay sets (named as the AMQP binding names them), the
// partition key (keys of them; none for 0) and the replay horizon.
func relayHeaders(id, at string, i, keys int) amqp.Table {
	h := amqp.Table{
		"cloudEvents:specversion":   "1.0",
		"cloudEvents:id":            id,
		"cloudEvents:type":          "orders.created",
		"cloudEvents:source":        "bench",
		"cloudEvents:time":          at,
		postbox.HeaderReplayHorizon: "604800",
	}
	if keys > 0 {
		h["cloudEvents:partitionkey"] = fmt.Sprintf("key-%d", i%keys)
	}
	return h
}

// rawConfirmed publishes n persistent, mandatory messages with a message
// id each, and the headers of headers(i, id) when it is set, keeping at most
// window confirms outstanding, and returns the confirmed rate. Any nack
// or return is an error.
func rawConfirmed(ctx context.Context, conn *amqp.Connection, exchange string, payload []byte, n, window int, headers func(i int, id string) amqp.Table) (float64, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return 0, err
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, window))
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	ids := make([]string, n)
	for i := range ids {
		ids[i] = postbox.NewID()
	}
	settle := func() error {
		select {
		case c, ok := <-confirms:
			if !ok {
				return errors.New("raw publish: channel closed")
			}
			if !c.Ack {
				return fmt.Errorf("raw publish: nack for delivery tag %d", c.DeliveryTag)
			}
			return nil
		case r := <-returns:
			return fmt.Errorf("raw publish: returned %d %s", r.ReplyCode, r.ReplyText)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	began := time.Now()
	outstanding := 0
	for i := range n {
		for outstanding >= window {
			if err := settle(); err != nil {
				return 0, err
			}
			outstanding--
		}
		var h amqp.Table
		if headers != nil {
			h = headers(i, ids[i])
		}
		err := ch.PublishWithContext(ctx, exchange, "orders.created", true, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, MessageId: ids[i], ContentType: "application/octet-stream",
			Timestamp: time.Now(), Type: "orders.created", Body: payload, Headers: h,
		})
		if err != nil {
			return 0, fmt.Errorf("raw publish: %w", err)
		}
		outstanding++
	}
	for outstanding > 0 {
		if err := settle(); err != nil {
			return 0, err
		}
		outstanding--
	}
	return float64(n) / time.Since(began).Seconds(), nil
}

// queueDepth reads a queue's ready messages, waiting a moment for a quorum
// queue's count to settle.
func queueDepth(conn *amqp.Connection, queue string) (int, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	var last int
	for range 50 {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			return 0, err
		}
		if q.Messages == last && last > 0 {
			return last, nil
		}
		last = q.Messages
		time.Sleep(100 * time.Millisecond)
	}
	return last, nil
}

func purge(conn *amqp.Connection, queue string) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	_, err = ch.QueuePurge(queue, false)
	return err
}

func deleteTopology(conn *amqp.Connection, t postboxamqp.Topology) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if _, err := ch.QueueDelete(t.Queue, false, false, false); err != nil {
		return err
	}
	return ch.ExchangeDelete(t.Exchange, false, false)
}

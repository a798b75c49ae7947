// Command compare measures postbox's backlog drain against Watermill's
// forwarder and the raw JetStream publish rate of the same run, on the
// PostgreSQL and NATS servers given by its flags (loopback by default).
//
//	go run ./cmd/compare --messages 100000 --runs 3
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"

	"github.com/postbox-go/postbox/bench/compare"
)

func main() {
	var opts compare.Options
	var runs int
	flag.StringVar(&opts.DatabaseURL, "database-url", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL connection URL")
	flag.StringVar(&opts.NatsURL, "nats-url", "nats://127.0.0.1:4222", "NATS server URL (JetStream enabled)")
	flag.IntVar(&opts.Messages, "messages", 100_000, "backlog size (e.g. 1000000)")
	flag.IntVar(&runs, "runs", 1, "repeat the whole measurement; the table shows each run and the median")
	flag.IntVar(&opts.PayloadBytes, "payload", 256, "payload bytes")
	flag.IntVar(&opts.Keys, "keys", 1000, "distinct postbox ordering keys (0: keyless)")
	flag.IntVar(&opts.Window, "window", 256, "raw async publish window")
	flag.IntVar(&opts.SyncSample, "sync-sample", 0, "messages of the raw synchronous baseline (default min(messages, 20000))")
	flag.IntVar(&opts.WatermillMax, "watermill-max", 0, "time the forwarder on at most this many messages (default all)")
	flag.DurationVar(&opts.WatermillTimeout, "watermill-timeout", 0, "cap on the forwarder phase; the rate is taken over what it reached (default 3m)")
	flag.IntVar(&opts.WatermillBatch, "watermill-batch", 0, "watermill-sql SubscribeBatchSize (default Watermill's, 100)")
	flag.StringVar(&opts.WatermillSchema, "watermill-schema", compare.SchemaDefault, "watermill-sql PostgreSQL adapters: default (DefaultPostgreSQLSchema + offsets adapter) or queue (PostgreSQLQueueSchema, DeleteOnAck)")
	flag.DurationVar(&opts.PhaseTimeout, "phase-timeout", 0, "timeout of every other phase (default 10m)")
	flag.Parse()
	if flag.NArg() > 0 || runs < 1 {
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, opts, runs, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		stop()
		os.Exit(1)
	}
}

func run(ctx context.Context, opts compare.Options, runs int, out io.Writer) error {
	var results []compare.Result
	for i := range runs {
		fmt.Fprintf(out, "run %d of %d\n", i+1, runs)
		res, err := compare.Run(ctx, opts, out)
		if err != nil {
			return err
		}
		results = append(results, res)
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "run\traw async msg/s\traw sync msg/s\tpostbox msg/s\tpostbox/raw\tWatermill msg/s\tWatermill/raw\tpostbox/Watermill\tWatermill reached\t")
	for i, r := range results {
		reached := fmt.Sprintf("%d/%d", r.WatermillReached, r.WatermillTarget)
		if r.WatermillCapped {
			reached += " (capped)"
		}
		fmt.Fprintf(tw, "%d\t%.0f\t%.0f\t%.0f\t%.2f\t%.0f\t%.3f\t%.1fx\t%s\t\n",
			i+1, r.RawRate, r.RawSyncRate, r.PostboxRate, r.PostboxRatio(), r.WatermillRate, r.WatermillRatio(), r.Speedup(), reached)
	}
	med, ratios := compare.Median(results)
	fmt.Fprintf(tw, "median\t%.0f\t%.0f\t%.0f\t%.2f\t%.0f\t%.3f\t%.1fx\t\t\n",
		med.RawRate, med.RawSyncRate, med.PostboxRate, ratios.Postbox, med.WatermillRate, ratios.Watermill, ratios.Speedup)
	if err := tw.Flush(); err != nil {
		return err
	}
	batch := opts.WatermillBatch
	if batch == 0 {
		batch = 100
	}
	schema := opts.WatermillSchema
	if schema == "" {
		schema = compare.SchemaDefault
	}
	fmt.Fprintf(out, "\n%d messages of %d bytes, %d postbox keys; Watermill: %s watermill-sql schema, subscribe batch %d\n",
		med.Messages, med.PayloadBytes, opts.Keys, schema, batch)
	fmt.Fprintf(out, "backlog writes (medians): postbox %.0f msg/s, Watermill %.0f msg/s\n", med.PostboxWriteRate, med.WatermillWriteRate)
	return nil
}

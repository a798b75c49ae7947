package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/postbox-go/postbox/internal/bench"
)

func init() { benchCommands = append(benchCommands, newBenchInbox) }

func newBenchInbox() *cobra.Command {
	var opts bench.InboxOptions
	var runs int
	cmd := &cobra.Command{
		Use:   "inbox",
		Short: "Consumer throughput, NATS JetStream through the inbox on PostgreSQL, against the same subscriber without the inbox",
		Long: `Fills a JetStream stream with --messages messages over --keys keys, then consumes it
three times with the postboxnats Subscriber, each through a durable consumer of its own:
  raw    the processor only acks;
  plain  a counter upsert per key, in a transaction per message, no inbox;
  inbox  the same upsert in the handler's transaction through the inbox
         (one transaction per message, or group commits with --batch).
Every counter is then checked against its key's message count (exactly once).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			var results []bench.InboxResult
			for i := range runs {
				fmt.Fprintf(out, "run %d of %d\n", i+1, runs)
				res, err := bench.Inbox(cmd.Context(), opts, out)
				if err != nil {
					return err
				}
				results = append(results, res)
			}
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "\nrun\traw ack msg/s\tplain tx msg/s\tinbox msg/s\tinbox / plain\tinbox / raw\t")
			for i, r := range results {
				fmt.Fprintf(tw, "%d\t%.0f\t%.0f\t%.0f\t%.2f\t%.2f\t\n", i+1, r.RawRate, r.PlainRate, r.InboxRate, r.Ratio, r.RawRatio)
			}
			med := bench.MedianInbox(results)
			fmt.Fprintf(tw, "median\t%.0f\t%.0f\t%.0f\t%.2f\t%.2f\t\n", med.RawRate, med.PlainRate, med.InboxRate, med.Ratio, med.RawRatio)
			return tw.Flush()
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.DatabaseURL, "database-url", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL connection URL")
	f.StringVar(&opts.NatsURL, "nats-url", "nats://127.0.0.1:4222", "NATS server URL (JetStream enabled)")
	f.IntVar(&opts.Messages, "messages", 20_000, "messages in the stream")
	f.IntVar(&runs, "runs", 1, "repeat the measurement; the table shows each run and the median")
	f.IntVar(&opts.PayloadBytes, "payload", 256, "payload bytes")
	f.IntVar(&opts.Keys, "keys", 1000, "distinct keys (one counter row each)")
	f.IntVar(&opts.MaxInFlight, "in-flight", 0, "subscriber MaxInFlight (default the library's)")
	f.IntVar(&opts.PoolSize, "pool", 0, "pgx pool MaxConns (default pgxpool's)")
	f.BoolVar(&opts.PerKey, "per-key", false, "subscriber per-key order")
	f.IntVar(&opts.Batch, "batch", 0, "group commit: Inbox.BatchProcessor with this MaxBatch (0: a transaction per message)")
	f.DurationVar(&opts.BatchWait, "batch-wait", 0, "BatchConfig.MaxWait")
	f.IntVar(&opts.BatchConcurrency, "batch-concurrency", 0, "BatchConfig.Concurrency (default the library's)")
	f.StringVar(&opts.CPUProfile, "cpuprofile", "", "write a CPU profile of the inbox phase to this file")
	f.DurationVar(&opts.Progress, "progress", 0, "interval of progress lines (default 1s)")
	return cmd
}

package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/cmd/postbox/internal/bench"
)

func init() { benchCommands = append(benchCommands, newBenchInbox) }

func newBenchInbox() *cobra.Command {
	var opts bench.InboxOptions
	var runs int
	cmd := &cobra.Command{
		Use:   "inbox",
		Short: "Consumer throughput, NATS JetStream through the inbox on PostgreSQL, against the same subscriber without the inbox",
		Long: `Fills a JetStream stream with --messages messages of --payload bytes over --keys keys, then
consumes it with the postboxnats Subscriber, each phase through a durable consumer of its own:
  raw     the processor only acks;
  plain   a counter upsert per key in a transaction per message, no inbox;
  single  the same upsert in the handler's transaction through the inbox,
          a transaction per message (Inbox.Processor);
  batch   the same through Inbox.BatchProcessor (group commit, --batch);
  call    the same batches through Inbox.BatchHandlerProcessor: one handler
          call a batch, its counts merged by key into one upsert (--no-call
          skips it).
Each phase's counters are then checked against the messages sent (exactly once).
--fail-every N fails the first delivery of one message in N in the inbox phases,
after its write, to measure what a failing handler costs; a failed message is
applied on its redelivery, after the inbox's backoff, which the phase's time
includes (compare the CPU a message).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.FailEvery < 0 {
				return fmt.Errorf("--fail-every %d: must be 0 (no failures) or more", opts.FailEvery)
			}
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
			fmt.Fprintln(tw, "\nrun\traw ack msg/s\tplain msg/s\tinbox single msg/s\tinbox batch msg/s\tmsgs/commit\tbest / plain\tbest / raw\tbatch / single\tinbox call msg/s\tmsgs/commit\tcall / raw\tcall / batch\t")
			row := func(name string, r bench.InboxResult, ratio func(func(bench.InboxResult) float64) float64) {
				perCommit := func(commits int) float64 {
					if commits > 0 {
						return float64(r.Messages) / float64(commits)
					}
					return 0
				}
				fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%.0f\t%.1f\t%.2f\t%.2f\t%.2f\t%.0f\t%.1f\t%.2f\t%.2f\t\n", name, r.RawRate, r.PlainRate, r.SingleRate, r.BatchRate, perCommit(r.BatchCommits),
					ratio(func(r bench.InboxResult) float64 { return bench.Ratio(r.Best(), r.PlainRate) }),
					ratio(func(r bench.InboxResult) float64 { return bench.Ratio(r.Best(), r.RawRate) }),
					ratio(func(r bench.InboxResult) float64 { return bench.Ratio(r.BatchRate, r.SingleRate) }),
					r.CallRate, perCommit(r.CallCommits),
					ratio(func(r bench.InboxResult) float64 { return bench.Ratio(r.CallRate, r.RawRate) }),
					ratio(func(r bench.InboxResult) float64 { return bench.Ratio(r.CallRate, r.BatchRate) }))
			}
			for i, r := range results {
				row(fmt.Sprint(i+1), r, func(f func(bench.InboxResult) float64) float64 { return f(r) })
			}
			// Ratios are medians of the per-run ratios.
			med := bench.MedianInbox(results)
			row("median", med, func(f func(bench.InboxResult) float64) float64 { return bench.MedianOf(results, f) })
			if len(med.CPU) > 0 {
				m := bench.Micros
				fmt.Fprintln(tw, "\nCPU µs per message, median\tthis process\tPostgreSQL\tnats-server\ttotal\t")
				for _, phase := range bench.InboxPhases {
					if u, ok := med.CPU[phase]; ok {
						fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%.1f\t\n", phase, m(u.Self), m(u.Database), m(u.Broker), m(u.Total()))
					}
				}
			}
			return tw.Flush()
		},
	}
	f := cmd.Flags()
	databaseURLFlag(cmd, &opts.DatabaseURL)
	natsURLFlag(cmd, &opts.NatsURL)
	f.IntVar(&opts.Messages, "messages", 20_000, "messages in the stream")
	f.IntVar(&runs, "runs", 1, "repeat the measurement; the table shows each run and the median")
	f.IntVar(&opts.PayloadBytes, "payload", 256, "payload bytes")
	f.IntVar(&opts.Keys, "keys", 1000, "distinct keys (one counter row each)")
	f.IntVar(&opts.MaxInFlight, "in-flight", 0, "subscriber MaxInFlight (default the library's)")
	f.IntVar(&opts.PoolSize, "pool", 0, "pgx pool MaxConns (default pgxpool's)")
	f.BoolVar(&opts.PerKey, "per-key", false, "subscriber per-key order")
	f.IntVar(&opts.Batch, "batch", postbox.DefaultBatchMax, "MaxBatch of the batched and call phases (0 skips them)")
	f.DurationVar(&opts.BatchWait, "batch-wait", 0, "BatchConfig.MaxWait")
	f.IntVar(&opts.BatchConcurrency, "batch-concurrency", 0, "BatchConfig.Concurrency (default the library's)")
	f.BoolVar(&opts.NoSingle, "no-single", false, "skip the phase with a transaction per message")
	f.BoolVar(&opts.NoCall, "no-call", false, "skip the phase with a handler call a batch")
	f.IntVar(&opts.FailEvery, "fail-every", 0, "fail the first delivery of one message in this many in the inbox phases (0: none)")
	f.StringVar(&opts.CPUProfile, "cpuprofile", "", "write a CPU profile of the last inbox phase to this file")
	f.DurationVar(&opts.Progress, "progress", 0, "interval of progress lines (default 1s)")
	return cmd
}

package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/postbox-go/postbox/cmd/postbox/internal/bench"
)

func init() { benchCommands = append(benchCommands, newBenchRabbitMQ) }

func newBenchRabbitMQ() *cobra.Command {
	var opts bench.RabbitMQOptions
	var runs int
	cmd := &cobra.Command{
		Use:   "rabbitmq",
		Short: "Backlog drain, PostgreSQL to RabbitMQ through postboxamqp, against the raw confirmed publish rate",
		Long: `rabbitmq first publishes N persistent, mandatory messages of 256 bytes with
amqp091-go straight to a quorum queue (made by postboxamqp.EnsureTopology) with
publisher confirms and a window of outstanding confirms: the raw baseline (with
--raw-headers, each carrying the headers table of a relay's message). Then it
writes a backlog of N such messages into the outbox (or, with --storage log, the
log of design §3) and times a relay at default
settings draining it through postboxamqp to a second quorum queue, and checks the
queue holds exactly N. Each phase's CPU per message is read from /proc for this
process, PostgreSQL and RabbitMQ (beam.smp). Queues, exchanges and tables are
deleted at the end.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := opts.Validate(); err != nil {
				return usagef("%v", err)
			}
			if runs < 1 || runs > 100 {
				return usagef("--runs %d: want 1 to 100", runs)
			}
			out := cmd.OutOrStdout()
			var results []bench.RabbitMQResult
			for i := range runs {
				fmt.Fprintf(out, "run %d of %d\n", i+1, runs)
				res, err := bench.RabbitMQ(cmd.Context(), opts, out)
				if err != nil {
					return err
				}
				results = append(results, res)
			}
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "\nrun\traw confirmed msg/s\tpostbox drain msg/s\tratio\tbacklog write msg/s\tqueue depth\t")
			var dr []bench.DrainResult
			for i, r := range results {
				fmt.Fprintf(tw, "%d\t%.0f\t%.0f\t%.2f\t%.0f\t%d\t\n", i+1, r.RawRate, r.DrainRate, r.Ratio, r.WriteRate, r.QueueDepth)
				dr = append(dr, bench.DrainResult{Messages: r.Messages, RawRate: r.RawRate, DrainRate: r.DrainRate, WriteRate: r.WriteRate, Ratio: r.Ratio,
					RawCPU: r.RawCPU, DrainCPU: r.DrainCPU, CPUKnown: r.CPUKnown})
			}
			med := bench.Median(dr)
			if len(results) > 1 {
				fmt.Fprintf(tw, "median\t%.0f\t%.0f\t%.2f\t%.0f\t\t\n", med.RawRate, med.DrainRate, med.Ratio, med.WriteRate)
			}
			if med.CPUKnown {
				m := bench.Micros
				fmt.Fprintln(tw, "\nCPU µs per message\traw: publisher\tRabbitMQ\ttotal\tdrain: relay\tPostgreSQL\tRabbitMQ\ttotal\t")
				row := func(name string, r bench.DrainResult) {
					fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t\n", name,
						m(r.RawCPU.Self), m(r.RawCPU.Broker), m(r.RawCPU.Self+r.RawCPU.Broker),
						m(r.DrainCPU.Self), m(r.DrainCPU.Database), m(r.DrainCPU.Broker), m(r.DrainCPU.Total()))
				}
				for i, r := range dr {
					row(fmt.Sprint(i+1), r)
				}
				if len(dr) > 1 {
					row("median", med)
				}
			}
			return tw.Flush()
		},
	}
	f := cmd.Flags()
	databaseURLFlag(cmd, &opts.DatabaseURL)
	f.StringVar(&opts.AMQPURL, "amqp-url", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ URL")
	f.IntVar(&opts.Messages, "messages", 100_000, "backlog size (1000000 for the full-scale run)")
	f.IntVar(&runs, "runs", 1, "repeat the measurement; the table shows each run and the median")
	f.IntVar(&opts.Keys, "keys", 1000, "distinct ordering keys (0: keyless)")
	f.IntVar(&opts.Window, "window", 256, "outstanding confirms of the raw baseline")
	f.BoolVar(&opts.Classic, "classic", false, "classic queues instead of quorum queues")
	f.BoolVar(&opts.RawHeaders, "raw-headers", false, "the raw baseline carries the headers table of a relay's message (CloudEvents attributes, partition key, replay horizon)")
	f.DurationVar(&opts.Timeout, "timeout", 30*60e9, "bound on the drain")
	f.StringVar(&opts.CPUProfile, "cpuprofile", "", "write a CPU profile of the drain phase to this file")
	f.StringVar(&opts.Storage, "storage", "table", "table (the outbox, its backlog inserted with SQL) or log (the log read by snapshot bands, design §3, as postboxpgx.WithLog; its backlog written through the Client)")
	return cmd
}

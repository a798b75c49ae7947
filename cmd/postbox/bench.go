package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/postbox-go/postbox/internal/bench"
)

func newBench() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmarks against real servers, each with a baseline from the same run",
	}
	var opts bench.DrainOptions
	drain := &cobra.Command{
		Use:   "drain",
		Short: "Backlog drain, PostgreSQL to NATS JetStream, against the raw JetStream publish rate",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			res, err := bench.Drain(cmd.Context(), opts, out)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "\nmeasure\tmsg/s\tratio to raw\t")
			fmt.Fprintf(tw, "raw JetStream async publish\t%.0f\t1.00\t\n", res.RawRate)
			fmt.Fprintf(tw, "postbox drain PostgreSQL -> JetStream\t%.0f\t%.2f\t\n", res.DrainRate, res.Ratio)
			fmt.Fprintf(tw, "(backlog write, for reference)\t%.0f\t\t\n", res.WriteRate)
			return tw.Flush()
		},
	}
	f := drain.Flags()
	f.StringVar(&opts.DatabaseURL, "database-url", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL connection URL")
	f.StringVar(&opts.NatsURL, "nats-url", "nats://127.0.0.1:4222", "NATS server URL (JetStream enabled)")
	f.IntVar(&opts.Messages, "messages", 100_000, "backlog size")
	f.IntVar(&opts.PayloadBytes, "payload", 256, "payload bytes")
	f.IntVar(&opts.Keys, "keys", 1000, "distinct ordering keys (0: keyless)")
	f.IntVar(&opts.Window, "window", 256, "publish window")
	f.IntVar(&opts.BatchSize, "batch", 500, "relay batch size")
	f.IntVar(&opts.Lanes, "lanes", 0, "relay lanes (default the library's)")
	f.StringVar(&opts.CPUProfile, "cpuprofile", "", "write a CPU profile of the drain phase to this file")
	cmd.AddCommand(drain)
	return cmd
}

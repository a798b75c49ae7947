package main

import (
	"encoding/json"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/postbox-go/postbox/cmd/postbox/internal/bench"
)

func init() { benchCommands = append(benchCommands, newBenchSnapshot) }

func newBenchSnapshot() *cobra.Command {
	var opts bench.SnapshotOptions
	var jsonPath string
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "A held snapshot (a long transaction elsewhere) under steady write load: relay fetch and batch latency, pending rows, dead tuples, each second",
		Long: `snapshot runs a relay at default settings to JetStream while a writer adds --rate
messages per second. After --before, another connection opens a REPEATABLE READ
transaction, takes its snapshot (SELECT 1) and keeps it --hold long, which holds
the xmin horizon: nothing deleted since can be vacuumed or marked dead in the
indexes. Then it is released and the run goes on for --after. Every second the
study records the relay's time per batch (Config.Metrics), the relay's own fetch
statement probed on one lane's partitions, pending rows, the outbox's n_dead_tup
and the age of the oldest snapshot; --json writes every sample for plotting. At
the end every written message must be in the stream and the outbox empty.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := opts.Validate(); err != nil {
				return usagef("%v", err)
			}
			out := cmd.OutOrStdout()
			res, err := bench.Snapshot(cmd.Context(), opts, out)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "\nphase\tfetch p50 ms\tfetch max ms\tlast second ms\tfetch / before\tbatch p50 ms\tpending max\tdead tuples max\t")
			for _, p := range res.Phases {
				fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%d\t%d\t\n", p.Phase, p.FetchP50Ms, p.FetchMaxMs, p.LastFetchMs, p.FetchVsPre, p.BatchP50Ms, p.PendingMax, p.DeadMax)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(out, "written %d, in the stream %d\n", res.Written, res.Streamed)
			if jsonPath != "" {
				b, err := json.MarshalIndent(res, "", "  ")
				if err != nil {
					return err
				}
				if err := os.WriteFile(jsonPath, b, 0o600); err != nil {
					return err
				}
				fmt.Fprintf(out, "samples written to %s\n", jsonPath)
			}
			return nil
		},
	}
	f := cmd.Flags()
	databaseURLFlag(cmd, &opts.DatabaseURL)
	natsURLFlag(cmd, &opts.NatsURL)
	f.DurationVar(&opts.Before, "before", 10e9, "steady load before the snapshot is taken")
	f.DurationVar(&opts.Hold, "hold", 60e9, "how long the snapshot is held (5m for the full-scale run)")
	f.DurationVar(&opts.After, "after", 60e9, "steady load after it is released")
	f.IntVar(&opts.Rate, "rate", 2000, "messages written per second")
	f.IntVar(&opts.Keys, "keys", 1000, "distinct ordering keys (0: keyless)")
	f.StringVar(&jsonPath, "json", "", "write every per-second sample and the phase summary to this file")
	return cmd
}

package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/postbox-go/postbox/cmd/postbox/internal/bench"
)

func init() { benchCommands = append(benchCommands, newBenchHistory) }

func newBenchHistory() *cobra.Command {
	var opts bench.HistoryOptions
	cmd := &cobra.Command{
		Use:   "history",
		Short: "Claim (fetch) and mark latency on a fixed backlog as the published history grows to 10M rows",
		Long: `history fills the published history with INSERT … SELECT generate_series at steps
0, max/10, 3·max/10 and max rows, and at each step times the relay's own fetch
statement (one lane's share, batch 500) on a fixed pending backlog, then the
fenced mark that moves the backlog into the history batch by batch. Latencies
are reported with their ratio to step 0 of the same run. Every table is dropped
at the end. The 10M-row default writes about 5 GB.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := opts.Validate(); err != nil {
				return usagef("%v", err)
			}
			out := cmd.OutOrStdout()
			res, err := bench.History(cmd.Context(), opts, out)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "\npublished rows\thistory MB\tfetch p50\tfetch p99\tcontrol p50\tcontrol p99\tp50 / control\tp99 / control\tp50 / step 0\tp99 / step 0\tmark p50\tmark p99\tmark / control\tmark / step 0\t")
			for _, s := range res.Steps {
				fmt.Fprintf(tw, "%d\t%.0f\t%s\t%s\t%s\t%s\t%.2f\t%.2f\t%.2f\t%.2f\t%s\t%s\t%.2f\t%.2f\t\n", s.Published, s.HistoryMB,
					ms(s.FetchP50), ms(s.FetchP99), ms(s.CtlFetchP50), ms(s.CtlFetchP99), s.FetchVsCtl, s.FetchVsCtl9, s.FetchRatio, s.FetchRatio9,
					ms(s.MarkP50), ms(s.MarkP99), s.MarkVsCtl, s.MarkRatio)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if res.ExplainFirst != "" {
				fmt.Fprintf(out, "\nEXPLAIN (ANALYZE, BUFFERS) of the fetch, empty history:\n%s", res.ExplainFirst)
				fmt.Fprintf(out, "\nEXPLAIN (ANALYZE, BUFFERS) of the fetch, full history:\n%s", res.ExplainLast)
			}
			return nil
		},
	}
	f := cmd.Flags()
	databaseURLFlag(cmd, &opts.DatabaseURL)
	f.IntVar(&opts.Max, "max", 10_000_000, "history rows at the last step (steps: 0, max/10, 3·max/10, max)")
	f.IntVar(&opts.Pending, "pending", 10_000, "pending backlog the fetch reads")
	f.IntVar(&opts.Reps, "reps", 1000, "timed fetches per step")
	f.IntVar(&opts.Keys, "keys", 1000, "distinct ordering keys")
	f.IntVar(&opts.FillChunk, "fill-chunk", 500_000, "history rows per INSERT statement")
	f.BoolVar(&opts.Explain, "explain", true, "print EXPLAIN (ANALYZE, BUFFERS) of the fetch at the first and last step")
	return cmd
}

// ms prints a latency in milliseconds with three decimals.
func ms(d time.Duration) string { return fmt.Sprintf("%.3f ms", d.Seconds()*1000) }

package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/postbox-go/postbox/cmd/postbox/internal/bench"
)

func init() { benchCommands = append(benchCommands, newBenchNotify) }

func newBenchNotify() *cobra.Command {
	var opts bench.NotifyOptions
	var jsonFile string
	cmd := &cobra.Command{
		Use:   "notify",
		Short: "LISTEN/NOTIFY study: commit throughput without and with a NOTIFY in each transaction",
		Long: `Writers commit one small insert per transaction; a listener is connected and
LISTENing all along. Three phases per run, rotating which goes first: no
notify; pg_notify in the insert's own statement (same round trips); pg_notify
as a statement of its own. Prints each run's commits/s and the ratios to the
no-notify phase of the same run, and checks that the listener received one
notification per notifying commit.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := firstErr(
				atLeast("writers", opts.Writers, 1),
				atLeastDuration("duration", opts.Duration, 100*time.Millisecond),
				atLeast("runs", opts.Runs, 1),
				atLeastDuration("warmup", opts.Warmup, 0),
			); err != nil {
				return err
			}
			if opts.Warmup == 0 {
				opts.Warmup = -1 // --warmup 0 skips it
			}
			out := cmd.OutOrStdout()
			res, err := bench.Notify(cmd.Context(), opts, out)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintf(tw, "\nrun\t")
			for _, m := range bench.NotifyModes {
				fmt.Fprintf(tw, "%s commits/s\t", m)
			}
			for _, m := range bench.NotifyModes[1:] {
				fmt.Fprintf(tw, "%s ratio\t", m)
			}
			fmt.Fprintln(tw)
			line := func(name string, rate, ratio map[bench.NotifyMode]float64) {
				fmt.Fprintf(tw, "%s\t", name)
				for _, m := range bench.NotifyModes {
					fmt.Fprintf(tw, "%.0f\t", rate[m])
				}
				for _, m := range bench.NotifyModes[1:] {
					fmt.Fprintf(tw, "%.3f\t", ratio[m])
				}
				fmt.Fprintln(tw)
			}
			for i, r := range res.Runs {
				line(fmt.Sprint(i+1), r.Rate, r.Ratio)
			}
			line("median", res.Rate, res.Ratio)
			if err := tw.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(out, "%d writers; checked: %d rows as committed, %d notifications received, as many as were sent\n", res.Writers, res.Rows, res.Notifications)
			return writeJSON(jsonFile, res)
		},
	}
	f := cmd.Flags()
	databaseURLFlag(cmd, &opts.DatabaseURL)
	f.IntVar(&opts.Writers, "writers", 16, "concurrent writers")
	f.DurationVar(&opts.Duration, "duration", 5*time.Second, "length of each phase")
	f.IntVar(&opts.Runs, "runs", 5, "runs; each runs every phase")
	f.DurationVar(&opts.Warmup, "warmup", time.Second, "uncounted warm-up before the first run")
	f.StringVar(&jsonFile, "json", "", "also write the results as JSON to this file")
	return cmd
}

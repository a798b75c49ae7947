package main

import (
	"encoding/json"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/postbox-go/postbox/cmd/postbox/internal/bench"
)

func init() { benchCommands = append(benchCommands, newBenchWrite) }

func newBenchWrite() *cobra.Command {
	var opts bench.WriteOptions
	var jsonFile string
	cmd := &cobra.Command{
		Use:   "write",
		Short: "Write overhead: domain transactions per second without and with a postbox message in each",
		Long: `Measures committed domain transactions per second (one orders row each, and a
batched case of --batch rows each) at each writer count, without postbox and
with Client.WriteTx of one 256-byte message per row in the same transaction.
The two phases alternate, run by run; the table shows each run and the
medians. No relay runs: the figure is the cost of the write itself.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := firstErr(
				atLeast("runs", opts.Runs, 1),
				atLeastDuration("duration", opts.Duration, 100*time.Millisecond),
				atLeast("payload", opts.PayloadBytes, 1),
				atLeast("batch-writers", opts.BatchWriters, 1),
				atLeastDuration("warmup", opts.Warmup, 0),
			); err != nil {
				return err
			}
			if len(opts.Writers) == 0 {
				return fmt.Errorf("--writers needs at least one writer count")
			}
			if opts.Batch == 0 {
				opts.Batch = -1 // --batch 0 skips the batched case
			}
			if opts.Warmup == 0 {
				opts.Warmup = -1 // --warmup 0 skips it
			}
			out := cmd.OutOrStdout()
			res, err := bench.Write(cmd.Context(), opts, out)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "\nwriters\trows/tx\trun\twithout postbox tx/s\twith postbox tx/s\tratio\tfewer tx/s\t")
			for _, c := range res.Cases {
				for i, r := range c.Runs {
					fmt.Fprintf(tw, "%d\t%d\t%d\t%.0f\t%.0f\t%.3f\t%.1f%%\t\n", c.Writers, c.Rows, i+1, r.Without, r.With, r.Ratio, 100*(1-r.Ratio))
				}
				fmt.Fprintf(tw, "%d\t%d\tmedian\t%.0f\t%.0f\t%.3f\t%.1f%%\t\n", c.Writers, c.Rows, c.Without, c.With, c.Ratio, 100*(1-c.Ratio))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(out, "checked: %d domain rows and %d outbox rows, as committed\n", res.DomainRows, res.OutboxRows)
			fmt.Fprintf(out, "stored per row: domain %.0f bytes (%.0f with indexes), outbox message %.0f bytes (%.0f with indexes)\n",
				res.DomainRowBytes, perRow(res.DomainTableBytes, res.DomainRows), res.OutboxRowBytes, perRow(res.OutboxTableBytes, res.OutboxRows))
			return writeJSON(jsonFile, res)
		},
	}
	f := cmd.Flags()
	databaseURLFlag(cmd, &opts.DatabaseURL)
	f.DurationVar(&opts.Duration, "duration", 5*time.Second, "length of each measured phase")
	f.IntVar(&opts.Runs, "runs", 5, "runs; each runs every case without and with postbox, alternating which goes first")
	f.IntSliceVar(&opts.Writers, "writers", []int{1, 8}, "writer counts of the one-row cases")
	f.IntVar(&opts.PayloadBytes, "payload", 256, "message payload bytes")
	f.IntVar(&opts.Batch, "batch", 100, "rows and messages per transaction of the batched case (0 skips it)")
	f.IntVar(&opts.BatchWriters, "batch-writers", 8, "writers of the batched case")
	f.DurationVar(&opts.Warmup, "warmup", time.Second, "uncounted warm-up before the first phase")
	f.StringVar(&opts.SynchronousCommit, "synchronous-commit", "", "the writers' synchronous_commit (off leaves the statements' CPU cost without the WAL flush); default the server's")
	f.BoolVar(&opts.NoSignals, "no-signals", false, "the writing client sends no change signals (Config.NoSignals)")
	f.BoolVar(&opts.Pipeline, "pipeline", false, "begin the postbox phase's transactions with postboxpgx.Begin: the messages go with the COMMIT, in one round trip")
	f.StringVar(&jsonFile, "json", "", "also write the results as JSON to this file")
	return cmd
}

func perRow(bytes, rows int64) float64 {
	if rows == 0 {
		return 0
	}
	return float64(bytes) / float64(rows)
}

// firstErr returns the first non-nil error.
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// atLeast checks an integer flag's value.
func atLeast(flag string, v, least int) error {
	if v < least {
		return fmt.Errorf("--%s must be at least %d, got %d", flag, least, v)
	}
	return nil
}

// atLeastDuration checks a duration flag's value.
func atLeastDuration(flag string, v, least time.Duration) error {
	if v < least {
		return fmt.Errorf("--%s must be at least %s, got %s", flag, least, v)
	}
	return nil
}

// writeJSON writes v as indented JSON to path; an empty path writes nothing.
func writeJSON(path string, v any) error {
	if path == "" {
		return nil
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil { //nolint:gosec // a results file, meant to be read
		return fmt.Errorf("--json: %w", err)
	}
	return nil
}

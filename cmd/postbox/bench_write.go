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
	var bare bool
	cmd := &cobra.Command{
		Use:   "write",
		Short: "Write overhead: domain transactions per second without and with a postbox message in each",
		Long: `Measures committed domain transactions per second (one orders row each, and a
batched case of --batch rows each) at each writer count, without postbox and
with Client.WriteTx of one 256-byte message per row in the same transaction,
and, as the database's raw insert rate for the same data, with a bare row
per message instead: the outbox's columns inserted with plain SQL into a
table with its primary key alone (--bare=false skips it). --emit adds a
phase with a transactional pg_logical_emit_message of the same bytes in
place of each row: the write of an outbox kept in the WAL (PostgreSQL with
wal_level = logical; with --pipeline it goes with the COMMIT). The phases
alternate, run by run; the table shows each run and the medians. No relay
runs: the figure is the cost of the write itself. --database-url takes
PostgreSQL's URL or mysql://... for MySQL or MariaDB.`,
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
			opts.NoBare = !bare
			out := cmd.OutOrStdout()
			res, err := bench.Write(cmd.Context(), opts, out)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
			if bare {
				fmt.Fprint(tw, "\nwriters\trows/tx\trun\twithout postbox tx/s\twith postbox tx/s\tratio\tfewer tx/s\tbare row tx/s\tratio to bare\t")
			} else {
				fmt.Fprint(tw, "\nwriters\trows/tx\trun\twithout postbox tx/s\twith postbox tx/s\tratio\tfewer tx/s\t")
			}
			if opts.Emit {
				fmt.Fprint(tw, "emitted tx/s\tratio emitted\t")
			}
			fmt.Fprintln(tw)
			line := func(c bench.WriteCase, run string, r bench.WriteRun) {
				fmt.Fprintf(tw, "%d\t%d\t%s\t%.0f\t%.0f\t%.3f\t%.1f%%\t", c.Writers, c.Rows, run, r.Without, r.With, r.Ratio, 100*(1-r.Ratio))
				if bare {
					fmt.Fprintf(tw, "%.0f\t%.3f\t", r.Bare, r.RatioToBare)
				}
				if opts.Emit {
					fmt.Fprintf(tw, "%.0f\t%.3f\t", r.Emitted, r.RatioEmitted)
				}
				fmt.Fprintln(tw)
			}
			for _, c := range res.Cases {
				for i, r := range c.Runs {
					line(c, fmt.Sprint(i+1), r)
				}
				line(c, "median", bench.WriteRun{Without: c.Without, With: c.With, Ratio: c.Ratio, Bare: c.Bare, RatioToBare: c.RatioToBare, Emitted: c.Emitted, RatioEmitted: c.RatioEmitted})
			}
			if known := cpuKnown(res); known {
				// The writers' CPU is this process's; the server's is every
				// process of the database server, other work's included.
				fmt.Fprintf(tw, "\nCPU µs per tx (median)\trows/tx\twithout: writers\t%[1]s\twith: writers\t%[1]s\tbare: writers\t%[1]s\t", res.Database)
				if opts.Emit {
					fmt.Fprintf(tw, "emitted: writers\t%s\t", res.Database)
				}
				fmt.Fprintln(tw)
				for _, c := range res.Cases {
					m := bench.Micros
					fmt.Fprintf(tw, "%d writers\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t", c.Writers, c.Rows,
						m(c.WithoutCPU.Self), m(c.WithoutCPU.Database), m(c.WithCPU.Self), m(c.WithCPU.Database), m(c.BareCPU.Self), m(c.BareCPU.Database))
					if opts.Emit {
						fmt.Fprintf(tw, "%.1f\t%.1f\t", m(c.EmittedCPU.Self), m(c.EmittedCPU.Database))
					}
					fmt.Fprintln(tw)
				}
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(out, "checked: %d domain rows, %d outbox rows and %d bare rows, as committed (%s)\n", res.DomainRows, res.OutboxRows, res.BareRows, res.Database)
			fmt.Fprintf(out, "stored per row: domain %.0f bytes (%.0f with indexes), outbox message %.0f bytes (%.0f with indexes)",
				res.DomainRowBytes, perRow(res.DomainTableBytes, res.DomainRows), res.OutboxRowBytes, perRow(res.OutboxTableBytes, res.OutboxRows))
			if bare {
				fmt.Fprintf(out, ", bare row %.0f bytes (%.0f with its index)", res.BareRowBytes, perRow(res.BareTableBytes, res.BareRows))
			}
			fmt.Fprintln(out)
			return writeJSON(jsonFile, res)
		},
	}
	f := cmd.Flags()
	anyDatabaseURLFlag(cmd, &opts.DatabaseURL)
	f.DurationVar(&opts.Duration, "duration", 5*time.Second, "length of each measured phase")
	f.IntVar(&opts.Runs, "runs", 5, "runs; each runs every case without and with postbox, alternating which goes first")
	f.IntSliceVar(&opts.Writers, "writers", []int{1, 8}, "writer counts of the one-row cases")
	f.IntVar(&opts.PayloadBytes, "payload", 256, "message payload bytes")
	f.IntVar(&opts.Batch, "batch", 100, "rows and messages per transaction of the batched case (0 skips it)")
	f.IntVar(&opts.BatchWriters, "batch-writers", 8, "writers of the batched case")
	f.DurationVar(&opts.Warmup, "warmup", time.Second, "uncounted warm-up before the first phase")
	f.StringVar(&opts.SynchronousCommit, "synchronous-commit", "", "the writers' synchronous_commit (off leaves the statements' CPU cost without the WAL flush); default the server's; PostgreSQL only")
	f.BoolVar(&opts.NoSignals, "no-signals", false, "the writing client sends no change signals (Config.NoSignals)")
	f.BoolVar(&opts.Pipeline, "pipeline", false, "begin the postbox phase's transactions with postboxpgx.Begin: the messages go with the COMMIT, in one round trip; PostgreSQL only")
	f.BoolVar(&opts.Emit, "emit", false, "also run each case with a transactional pg_logical_emit_message of the same bytes in place of each message's row (the WAL path's write); PostgreSQL with wal_level = logical only")
	f.StringVar(&opts.Storage, "storage", "table", "where the postbox phase's messages go: table (the outbox) or log (PostgreSQL: the log read by snapshot bands, design §3, as postboxpgx.WithLog)")
	f.BoolVar(&bare, "bare", true, "also run each case with a bare row (the outbox's columns, plain SQL, primary key alone) in place of each message: the database's raw insert rate")
	f.StringVar(&jsonFile, "json", "", "also write the results as JSON to this file")
	return cmd
}

// cpuKnown reports whether every run of res read the CPU times.
func cpuKnown(res bench.WriteResult) bool {
	for _, c := range res.Cases {
		for _, r := range c.Runs {
			if !r.CPUKnown {
				return false
			}
		}
	}
	return len(res.Cases) > 0
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

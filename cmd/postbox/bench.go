package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/postbox-go/postbox/cmd/postbox/internal/bench"
)

// benchCommands make the subcommands of `postbox bench`, one benchmark
// each; a benchmark's file adds its own in an init function.
var benchCommands = []func() *cobra.Command{newBenchDrain}

// databaseURLFlag adds the --database-url flag, the PostgreSQL a benchmark
// runs against, to cmd.
func databaseURLFlag(cmd *cobra.Command, p *string) {
	cmd.Flags().StringVar(p, "database-url", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL connection URL")
}

// anyDatabaseURLFlag adds the --database-url flag of a benchmark that also
// runs on MySQL or MariaDB to cmd.
func anyDatabaseURLFlag(cmd *cobra.Command, p *string) {
	databaseURLFlag(cmd, p)
	cmd.Flags().Lookup("database-url").Usage = "PostgreSQL connection URL, or mysql://user@host:3306/dbname for MySQL or MariaDB"
}

// natsURLFlag adds the --nats-url flag, the NATS server a benchmark
// publishes to, to cmd.
func natsURLFlag(cmd *cobra.Command, p *string) {
	cmd.Flags().StringVar(p, "nats-url", "nats://127.0.0.1:4222", "NATS server URL (JetStream enabled)")
}

func newBench() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmarks against real servers, each with a baseline from the same run",
	}
	for _, mk := range benchCommands {
		cmd.AddCommand(mk())
	}
	return cmd
}

func newBenchDrain() *cobra.Command {
	var opts bench.DrainOptions
	var runs int
	var jsonFile string
	drain := &cobra.Command{
		Use:   "drain",
		Short: "Backlog drain, PostgreSQL or MySQL/MariaDB to NATS JetStream, against the raw JetStream publish rate",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.SampleEvery < 0 {
				return fmt.Errorf("--sample-every must not be negative, got %s", opts.SampleEvery)
			}
			if jsonFile == "" {
				opts.SampleEvery = 0 // the timeline only goes to the JSON file
			}
			out := cmd.OutOrStdout()
			var results []bench.DrainResult
			for i := range runs {
				fmt.Fprintf(out, "run %d of %d\n", i+1, runs)
				res, err := bench.Drain(cmd.Context(), opts, out)
				if err != nil {
					return err
				}
				results = append(results, res)
			}
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "\nrun\traw msg/s, no id\traw msg/s, Nats-Msg-Id\tpostbox drain msg/s\tratio to no id\tratio to Nats-Msg-Id\tbacklog write msg/s\t")
			line := func(name string, r bench.DrainResult) {
				fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%.2f\t%.2f\t%.0f\t\n", name, r.RawPlainRate, r.RawRate, r.DrainRate, r.RatioPlain, r.Ratio, r.WriteRate)
			}
			for i, r := range results {
				line(fmt.Sprint(i+1), r)
			}
			med := bench.Median(results)
			line("median", med)
			if med.CPUKnown {
				// Both phases move the same messages into the same
				// server: the difference is the outbox's own cost.
				fmt.Fprintf(tw, "\nCPU µs per message\traw, no id: publisher\tnats-server\traw, Nats-Msg-Id: publisher\tnats-server\ttotal\tdrain: relay\t%s\tnats-server\ttotal\t\n", med.Database)
				row := func(name string, r bench.DrainResult) {
					m := bench.Micros
					fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t\n", name,
						m(r.RawPlainCPU.Self), m(r.RawPlainCPU.Broker),
						m(r.RawCPU.Self), m(r.RawCPU.Broker), m(r.RawCPU.Self+r.RawCPU.Broker),
						m(r.DrainCPU.Self), m(r.DrainCPU.Database), m(r.DrainCPU.Broker), m(r.DrainCPU.Total()))
				}
				for i, r := range results {
					row(fmt.Sprint(i+1), r)
				}
				row("median", med)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			return writeJSON(jsonFile, struct {
				Runs []bench.DrainResult
			}{results})
		},
	}
	f := drain.Flags()
	anyDatabaseURLFlag(drain, &opts.DatabaseURL)
	natsURLFlag(drain, &opts.NatsURL)
	f.IntVar(&opts.Messages, "messages", 100_000, "backlog size")
	f.IntVar(&runs, "runs", 1, "repeat the measurement; the table shows each run and the median")
	f.IntVar(&opts.PayloadBytes, "payload", 256, "payload bytes")
	f.IntVar(&opts.Keys, "keys", 1000, "distinct ordering keys (0: keyless)")
	f.IntVar(&opts.Window, "window", 256, "publish window")
	f.IntVar(&opts.Replicas, "replicas", 0, "replicas of the benchmark's streams (0: one); 3 with --nats-url listing a three-node cluster")
	f.IntVar(&opts.BatchSize, "batch", 500, "relay batch size")
	f.IntVar(&opts.Lanes, "lanes", 0, "relay lanes (default the library's)")
	f.StringVar(&opts.Storage, "storage", "table", "table (the outbox) or log (PostgreSQL: the log read by snapshot bands, design §3, as postboxpgx.WithLog; no --json timeline)")
	f.Int64Var(&opts.LogChunk, "log-chunk", 0, "with --storage log, split the log into chunks of this many seqs, which retention drops whole (0: the log whole)")
	f.StringVar(&opts.CPUProfile, "cpuprofile", "", "write a CPU profile of the drain phase to this file")
	f.StringVar(&opts.MemProfile, "memprofile", "", "write the drain phase's allocations to this file, to read against FILE.base (written at its start): go tool pprof -sample_index=alloc_space -base FILE.base postbox FILE")
	f.StringVar(&jsonFile, "json", "", "also write each run's figures, with the remaining rows over time, as JSON to this file")
	f.DurationVar(&opts.SampleEvery, "sample-every", 100*time.Millisecond, "with --json, count the remaining rows this often during the drain (0: no timeline)")
	return drain
}

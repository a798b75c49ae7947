package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/postbox-go/postbox/cmd/postbox/internal/bench"
)

func init() { benchCommands = append(benchCommands, newBenchLatency) }

func newBenchLatency() *cobra.Command {
	var opts bench.LatencyOptions
	var jsonFile string
	var noIdle bool
	cmd := &cobra.Command{
		Use:   "latency",
		Short: "Commit to JetStream ack latency at a steady rate, and the idle relay's statements per second",
		Long: `Starts a relay at default settings publishing to a JetStream stream and counts
the statements it sends while it has nothing to do (--idle). Then writers
commit one message per transaction at --rate for --duration; each message's
latency runs from its commit's return to the broker's ack as the publisher
reports it. Prints percentiles, and with --json writes them with the whole
distribution for the plot.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := firstErr(
				atLeast("rate", opts.Rate, 1),
				atLeastDuration("duration", opts.Duration, time.Second),
				atLeastDuration("warmup", opts.Warmup, 0),
				atLeast("writers", opts.Writers, 1),
				atLeast("payload", opts.PayloadBytes, 1),
				atLeast("keys", opts.Keys, 0),
				atLeastDuration("idle", opts.Idle, 0),
				atLeastDuration("poll-interval", opts.PollInterval, 0),
				atLeast("lanes", opts.Lanes, 0),
				atLeastDuration("ack-timeout", opts.AckTimeout, time.Second),
				atLeastDuration("baseline", opts.Baseline, 0),
			); err != nil {
				return err
			}
			if opts.IdleOnly && (noIdle || opts.Idle == 0) {
				return fmt.Errorf("--idle-only needs a positive --idle and no --no-idle")
			}
			if noIdle || opts.Idle == 0 {
				opts.Idle = -1
			}
			if opts.Baseline == 0 {
				opts.Baseline = -1 // --baseline 0 skips it
			}
			if opts.Warmup == 0 {
				opts.Warmup = time.Nanosecond // keep every message
			}
			if total := float64(opts.Rate) * opts.Duration.Seconds(); total < 10 {
				return fmt.Errorf("--rate × --duration makes %.0f messages; at least 10 are needed", total)
			}
			out := cmd.OutOrStdout()
			res, err := bench.Latency(cmd.Context(), opts, out)
			if err != nil {
				return err
			}
			if opts.IdleOnly {
				printIdle(out, res)
				return writeJSON(jsonFile, res)
			}
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintf(tw, "\ncommit → ack, ms\tmin\tp50\tp90\tp99\tp99.9\tmax\tmean\t\n")
			row := func(name string, p bench.Percentiles) {
				fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", name, p.Min, p.P50, p.P90, p.P99, p.P999, p.Max, p.Mean)
			}
			row("from commit return", res.Latency)
			row("from commit start", res.CommitLatency)
			if res.BaselineMeasured > 0 {
				row("baseline: direct publish", res.Baseline)
				fmt.Fprintf(tw, "postbox / baseline\t\t%.2f\t%.2f\t%.2f\t%.2f\t\t\t\n", res.Latency.P50/res.Baseline.P50, res.Latency.P90/res.Baseline.P90, res.Latency.P99/res.Baseline.P99, res.Latency.P999/res.Baseline.P999)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(out, "%d messages at %d msg/s asked, %.0f msg/s achieved (a writer started a slot at worst %.1f ms late); %d measured after the warm-up\n",
				res.Written, res.Rate, res.Achieved, res.MaxBehindMillis, res.Measured)
			fmt.Fprintf(out, "checked: %d distinct ids acknowledged, %d duplicate acks, the stream holds them all\n", res.Acked, res.Duplicates)
			for _, d := range res.DuplicateAcks {
				fmt.Fprintf(out, "  acknowledged again: message %d (%s), %.1f ms after its first ack\n", d.Message, d.ID, d.LateMillis)
			}
			if res.RelayWarnings > 0 {
				fmt.Fprintf(out, "the relay logged %d warnings: the run met a stall or a fault, and its figures are not a clean run's\n", res.RelayWarnings)
				for _, w := range res.RelayWarningLines {
					fmt.Fprintf(out, "  %s\n", w)
				}
			}
			fmt.Fprintf(out, "relay statements/s under this load: %.1f (%.2f a message", res.BusyQueriesPerSec, res.BusyPerMessage)
			if res.BusyPerMessageExceptJIT != res.BusyPerMessage {
				fmt.Fprintf(out, "; %.2f but for the log's jit settings, each in its statement's round trip", res.BusyPerMessageExceptJIT)
			}
			fmt.Fprintf(out, ")\n")
			for _, k := range res.BusyStatementKinds() {
				fmt.Fprintf(out, "  %-50s %6d  (%.1f/s)\n", k, res.BusyStatements[k], float64(res.BusyStatements[k])/res.BusySeconds)
			}
			if res.CPUKnown {
				m := bench.Micros
				fmt.Fprintf(out, "CPU µs per message: postbox: this process %.1f, postgres %.1f, nats-server %.1f, total %.1f",
					m(res.CPU.Self), m(res.CPU.Database), m(res.CPU.Broker), m(res.CPU.Total()))
				if res.BaselineCPUKnown {
					fmt.Fprintf(out, "; baseline: this process %.1f, postgres %.1f, nats-server %.1f, total %.1f",
						m(res.BaselineCPU.Self), m(res.BaselineCPU.Database), m(res.BaselineCPU.Broker), m(res.BaselineCPU.Total()))
				}
				fmt.Fprintln(out)
			}
			printIdle(out, res)
			return writeJSON(jsonFile, res)
		},
	}
	f := cmd.Flags()
	databaseURLFlag(cmd, &opts.DatabaseURL)
	natsURLFlag(cmd, &opts.NatsURL)
	f.IntVar(&opts.Rate, "rate", 1000, "messages committed per second, one per transaction")
	f.DurationVar(&opts.Duration, "duration", 30*time.Second, "length of the paced writing")
	f.DurationVar(&opts.Warmup, "warmup", 2*time.Second, "first part of the writing left out of the percentiles (at most a fifth of --duration)")
	f.IntVar(&opts.Writers, "writers", 16, "writer goroutines taking the paced slots, each with a connection")
	f.IntVar(&opts.PayloadBytes, "payload", 256, "payload bytes")
	f.IntVar(&opts.Keys, "keys", 1000, "distinct ordering keys (0: keyless)")
	f.BoolVar(&opts.SeparateWriter, "separate-writer", false, "write through a client of its own, as another process would: the relay finds rows by change signals, or with --no-signals only by polling")
	f.BoolVar(&opts.NoSignals, "no-signals", false, "no change signals between clients (Config.NoSignals) on the relay and the writers")
	f.BoolVar(&opts.Pipeline, "pipeline", false, "begin the writers' transactions with postboxpgx.Begin: the message goes with the COMMIT, and the relay in the writers' process is woken after it")
	f.DurationVar(&opts.Idle, "idle", 10*time.Second, "how long to count the idle relay's statements (0 skips)")
	f.BoolVar(&noIdle, "no-idle", false, "skip the idle count")
	f.BoolVar(&opts.IdleOnly, "idle-only", false, "only count the idle relay's statements")
	f.DurationVar(&opts.PollInterval, "poll-interval", 0, "relay poll interval (0: the library's default)")
	f.IntVar(&opts.Lanes, "lanes", 0, "relay lanes (0: the library's default)")
	f.DurationVar(&opts.AckTimeout, "ack-timeout", 30*time.Second, "longest wait for the last acks after the writing")
	f.DurationVar(&opts.Baseline, "baseline", 10*time.Second, "how long to measure the same-run floor first: commit, then publish straight to JetStream (0 skips)")
	f.StringVar(&jsonFile, "json", "", "also write the results, with the latency distribution, as JSON to this file")
	f.StringVar(&opts.Storage, "storage", "table", "where the messages go: table (the outbox) or log (PostgreSQL: the log read by snapshot bands, design §3, as postboxpgx.WithLog)")
	return cmd
}

func printIdle(out io.Writer, res bench.LatencyResult) {
	if res.IdleSeconds == 0 {
		return
	}
	fmt.Fprintf(out, "idle relay (poll interval %s, %d lanes): %.1f statements/s over %.0f s\n", res.PollInterval, res.Lanes, res.IdleQueriesPerSec, res.IdleSeconds)
	for _, k := range res.StatementKinds() {
		fmt.Fprintf(out, "  %-50s %6d  (%.2f/s)\n", k, res.IdleStatements[k], float64(res.IdleStatements[k])/res.IdleSeconds)
	}
}

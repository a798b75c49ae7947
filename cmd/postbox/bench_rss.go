package main

import (
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/postbox-go/postbox/cmd/postbox/internal/bench"
)

func init() { benchCommands = append(benchCommands, newBenchRSS) }

func newBenchRSS() *cobra.Command {
	var opts bench.RSSOptions
	var binary string
	cmd := &cobra.Command{
		Use:   "rss",
		Short: "Resident memory of the `postbox relay` daemon at default settings, idle, draining a backlog to JetStream, and idle again",
		Long: `rss runs the real relay daemon (this binary's relay command, or --binary) as a child
process with its defaults, configured through POSTBOX_* variables and routing every
topic to a JetStream stream made for the run. It samples /proc/<pid>/status VmRSS
while the daemon idles, while it drains a backlog written in chunks, and while it
idles afterwards, then reads VmHWM (the kernel's peak) before stopping it with
SIGTERM, and checks that the stream holds exactly the backlog. Target (docs/design.md §6):
64 MiB.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if binary == "" {
				exe, err := os.Executable()
				if err != nil {
					return err
				}
				binary = exe
			}
			opts.Command = []string{binary, "relay"}
			if err := opts.Validate(); err != nil {
				return usagef("%v", err)
			}
			out := cmd.OutOrStdout()
			res, err := bench.RSS(cmd.Context(), opts, out)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "\nbacklog\tidle before MiB\tmax while draining MiB\tVmHWM MiB\tpeak MiB\tsteady after MiB\tdrain msg/s\tpeak / 64 MiB\t")
			fmt.Fprintf(tw, "%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.0f\t%.2f\t\n", res.Messages, mb(res.StartRSS), mb(res.DrainMaxRSS),
				mb(res.HWM), mb(res.Peak), mb(res.SteadyRSS), res.DrainRate, mb(res.Peak)/64)
			return tw.Flush()
		},
	}
	f := cmd.Flags()
	databaseURLFlag(cmd, &opts.DatabaseURL)
	natsURLFlag(cmd, &opts.NatsURL)
	f.StringVar(&binary, "binary", "", "postbox binary to run the relay with (default this one)")
	f.IntVar(&opts.Messages, "messages", 200_000, "backlog size")
	f.IntVar(&opts.Keys, "keys", 1000, "distinct ordering keys (0: keyless)")
	f.DurationVar(&opts.Warmup, "warmup", 5e9, "idle time before the backlog")
	f.DurationVar(&opts.Idle, "idle", 30e9, "idle time sampled after the drain")
	f.DurationVar(&opts.Sample, "sample", 1e8, "VmRSS sampling interval")
	return cmd
}

func mb(b int64) float64 { return float64(b) / (1 << 20) }

package main

import (
	"github.com/spf13/cobra"

	"github.com/postbox-go/postbox/cmd/postbox/internal/demo"
)

func newDemo() *cobra.Command {
	var opts demo.Options
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run an orders service on SQLite and an embedded NATS server, and verify every guarantee",
		Long: `demo needs no setup: it creates an SQLite file and an embedded NATS server with
JetStream in a temporary directory. An orders service writes orders and their
events in transactions, rolling some back on purpose; the relay publishes; a
consumer counts. Mid-run the relay is stopped hard and started again. The run
ends with a verification summary and exits non-zero when any check fails.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sum, err := demo.Run(cmd.Context(), opts, cmd.OutOrStdout())
			if err != nil {
				return err
			}
			if !sum.OK() {
				return errChecksFailed
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&opts.Orders, "orders", 5000, "orders to place")
	f.IntVar(&opts.Writers, "writers", 4, "concurrent writers")
	f.Float64Var(&opts.RollbackRate, "rollback-rate", 0.1, "share of transactions rolled back on purpose")
	f.StringVar(&opts.Dir, "dir", "", "keep the SQLite file and JetStream data here instead of a temporary directory")
	f.DurationVar(&opts.Progress, "progress", 0, "progress line interval (default 500ms; negative disables)")
	f.DurationVar(&opts.Timeout, "timeout", 0, "limit on the whole run (default 2m)")
	return cmd
}

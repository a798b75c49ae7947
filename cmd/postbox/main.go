// Command postbox is the operator's tool for postbox: the demo, and (as
// they land) the relay daemon, migrations, status, dead letters, replay and
// benchmarks.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRoot().ExecuteContext(ctx)
	stop()
	if err != nil {
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "postbox",
		Short:         "Transactional outbox and inbox: relay, operations and demo",
		SilenceUsage:  true,
		SilenceErrors: false,
	}
	root.AddCommand(newDemo(), newBench())
	return root
}

// errChecksFailed makes the process exit non-zero after a run whose own
// output already says what failed.
var errChecksFailed = fmt.Errorf("checks failed")

// Command postbox is the operator's tool for postbox: migrations, status,
// dead messages, replay and pruning against a database, the demo on
// embedded defaults, and the benchmarks.
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
		os.Exit(exitCode(err))
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "postbox",
		Short:         "Transactional outbox and inbox: relay, operations and demo",
		SilenceUsage:  true,
		SilenceErrors: false,
	}
	var db dbFlags
	ops := []*cobra.Command{newMigrate(&db), newStatus(&db), newDead(&db), newReplay(&db), newPrune(&db)}
	for _, c := range ops {
		db.register(c)
	}
	root.AddCommand(newRelay(), newDemo(), newBench())
	root.AddCommand(ops...)
	return root
}

// errChecksFailed makes the process exit non-zero after a run whose own
// output already says what failed.
var errChecksFailed = fmt.Errorf("checks failed")

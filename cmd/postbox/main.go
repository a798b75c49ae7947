// Command postbox is the operator's tool for postbox: migrations, status,
// dead messages (the outbox's and the consumers'), replay and pruning
// against a database, the relay daemon, the demo on embedded defaults,
// and the benchmarks.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/postbox-go/postbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := execute(ctx, newRoot(), os.Stderr)
	stop()
	os.Exit(code)
}

// execute runs root and returns the process's exit status (exitCode). An
// error is written to stderr: as {"error", "field", "problems",
// "exit_code"} when the command was given --json, else as one line.
func execute(ctx context.Context, root *cobra.Command, stderr io.Writer) int {
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	code := exitCode(err)
	if cmd != nil {
		if fl := cmd.Flags().Lookup("json"); fl != nil && fl.Value.String() == "true" {
			_ = printJSON(stderr, errorJSON(err, code))
			return code
		}
	}
	fmt.Fprintln(stderr, "Error:", err)
	return code
}

// errorJSON is an error as --json prints it.
func errorJSON(err error, code int) map[string]any {
	out := map[string]any{"error": strings.TrimPrefix(err.Error(), "postbox: "), "exit_code": code}
	var (
		ve *postbox.ValidationError
		ce *postbox.ConfigError
		u  *errUsage
	)
	switch {
	case errors.As(err, &ce) && len(ce.Problems) > 0:
		ps := make([]map[string]string, 0, len(ce.Problems))
		for _, p := range ce.Problems {
			ps = append(ps, map[string]string{"field": p.Field, "value": p.Value, "reason": p.Reason})
		}
		out["field"], out["problems"] = ce.Problems[0].Field, ps
	case errors.As(err, &ve):
		out["field"] = ve.Field
	case errors.As(err, &u) && strings.HasPrefix(u.msg, "--"):
		name, _, _ := strings.Cut(strings.TrimPrefix(u.msg, "--"), " ")
		out["field"] = strings.TrimRight(name, ":")
	}
	return out
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "postbox",
		Short:         "Transactional outbox and inbox: relay, operations and demo",
		SilenceUsage:  true,
		SilenceErrors: true, // execute prints them, as text or JSON
	}
	group(root)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usagef("%v", err) })
	var db dbFlags
	ops := []*cobra.Command{newMigrate(&db), newStatus(&db), newDead(&db), newConsumerDead(&db), newReplay(&db), newPrune(&db), newStorage(&db)}
	for _, c := range ops {
		db.register(c)
	}
	root.AddCommand(newRelay(), newDemo(), newBench())
	root.AddCommand(ops...)
	for _, c := range root.Commands() {
		groupAll(c)
	}
	return root
}

// group makes cmd, a command that only holds subcommands, refuse an
// unknown subcommand with a usage error (exit 2) instead of printing its
// help and exiting 0; without arguments it prints its help.
func group(cmd *cobra.Command) {
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return cmd.Help()
		}
		return usagef("unknown command %q for %q; run '%s --help' for the list", args[0], cmd.CommandPath(), cmd.CommandPath())
	}
}

// groupAll applies group to every command under cmd (and cmd) that has
// subcommands but no action of its own, and makes every refusal of
// arguments a usage error (exit 2).
func groupAll(cmd *cobra.Command) {
	if cmd.HasSubCommands() && cmd.RunE == nil && cmd.Run == nil {
		group(cmd)
	}
	if check := cmd.Args; check != nil {
		cmd.Args = func(c *cobra.Command, args []string) error {
			if err := check(c, args); err != nil {
				return usagef("%v", err)
			}
			return nil
		}
	}
	for _, c := range cmd.Commands() {
		groupAll(c)
	}
}

// errChecksFailed makes the process exit non-zero after a run whose own
// output already says what failed.
var errChecksFailed = fmt.Errorf("checks failed")

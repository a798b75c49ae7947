package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/postbox-go/postbox"
)

// consumerFilterFlags are the selection flags of the consumer-dead
// commands.
type consumerFilterFlags struct {
	consumer string
	deadFilterFlags
}

func (c *consumerFilterFlags) register(cmd *cobra.Command, bulk bool) {
	cmd.Flags().StringVar(&c.consumer, "consumer", "", "only this consumer")
	c.deadFilterFlags.register(cmd, bulk)
}

func (c *consumerFilterFlags) filter(ids []string) (postbox.DeadFilter, error) {
	f, err := c.deadFilterFlags.filter(ids)
	f.Consumer = c.consumer
	return f, err
}

// newConsumerDead is `postbox consumer-dead`: the consumers' dead messages
// in the database named by --database, in the tables of --prefix (the
// consumer's own: its inbox lives beside its domain rows).
func newConsumerDead(f *dbFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "consumer-dead",
		Short: "Consumers' dead messages (their handlers gave up): list, show, delete",
		Long: `consumer-dead works on the dead messages of the consumers whose inbox tables are
in --database under --prefix. A dead message's handler lives in the consuming
service, so it is run again there: Inbox.RequeueDead(ctx, consumer, id, handler)
runs it through the inbox and removes the dead message in one transaction.`,
	}
	var lf consumerFilterFlags
	list := &cobra.Command{Use: "list", Short: "List consumers' dead messages, newest first", Args: cobra.NoArgs}
	lf.register(list, false)
	list.RunE = withConn(f, func(ctx context.Context, c *conn, out io.Writer) error {
		filter, err := lf.filter(nil)
		if err != nil {
			return err
		}
		ds, err := c.inbox.ListDead(ctx, filter)
		if err != nil {
			return err
		}
		if f.json {
			js := make([]map[string]any, 0, len(ds))
			for i := range ds {
				js = append(js, consumerDeadJSON(&ds[i]))
			}
			return printJSON(out, js)
		}
		var rows [][]string
		for i := range ds {
			d := &ds[i]
			rows = append(rows, []string{safe(d.Consumer), safe(oneLine(d.ID, 40)), safe(d.Topic), safe(oneLine(d.Key, 40)),
				strconv.Itoa(d.Attempts), d.DeadAt.UTC().Format(time.RFC3339), reason(d, 80)})
		}
		return table(out, "CONSUMER\tMESSAGE ID\tTOPIC\tKEY\tATTEMPTS\tDEAD AT\tERROR", rows)
	})
	show := &cobra.Command{
		Use: "show CONSUMER ID", Short: "Show one consumer's dead message with its payload and headers", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer c.close()
			d, err := c.inbox.GetDead(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if f.json {
				return printJSON(out, consumerDeadJSON(&d))
			}
			fmt.Fprintf(out, "consumer    %s\nmessage id  %s\ntopic       %s\nkey         %s\nattempts    %d\nfirst fail  %s\nlast fail   %s\ndead at     %s\nerror       %s\n",
				safe(d.Consumer), safe(d.ID), safe(d.Topic), safe(d.Key), d.Attempts,
				rfc3339(d.FirstFailureAt), rfc3339(d.LastFailureAt), rfc3339(d.DeadAt), safe(d.Error))
			writeHeaders(out, d.Headers)
			writePayload(out, d.Payload)
			return nil
		},
	}
	var df consumerFilterFlags
	del := &cobra.Command{
		Use:   "delete [ID...]",
		Short: "Delete consumers' dead messages, by --consumer and ids, or by filter (--all for every one)",
		RunE: func(cmd *cobra.Command, args []string) error {
			filter, err := df.filter(args)
			if err != nil {
				return err
			}
			if len(args) > 0 && df.consumer == "" {
				return usagef("--consumer is required with ids: a message id is unique per consumer only")
			}
			if len(args) == 0 && filter.Consumer == "" && filter.Topic == "" && filter.Key == "" && filter.Since.IsZero() && filter.Until.IsZero() && !df.all {
				return fmt.Errorf("%w (--consumer, --topic, --key, --since, --until, or --all)", postbox.ErrEmptySelection)
			}
			c, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer c.close()
			n, err := deleteConsumerDead(cmd.Context(), c.inbox, filter)
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), map[string]int{"count": n})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deleted %d consumer dead message(s)\n", n)
			return nil
		},
	}
	df.register(del, true)
	cmd.AddCommand(list, show, del)
	return cmd
}

// deleteConsumerDead deletes every consumer dead message f selects, a page
// at a time, and returns how many it deleted.
func deleteConsumerDead(ctx context.Context, in consumerDead, f postbox.DeadFilter) (int, error) {
	const page = 1000
	f.Limit = page
	n := 0
	for {
		ds, err := in.ListDead(ctx, f)
		if err != nil {
			return n, err
		}
		for i := range ds {
			ok, err := in.DeleteDead(ctx, ds[i].Consumer, ds[i].ID)
			if err != nil {
				return n, err
			}
			if ok {
				n++
			}
		}
		if len(ds) < page {
			return n, nil
		}
	}
}

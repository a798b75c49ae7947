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
		Short: "Consumers' dead messages (their handlers gave up): list, show, requeue, delete",
		Long: `consumer-dead works on the dead messages of the consumers whose inbox tables are
in --database under --prefix. A dead message's handler lives in the consuming
service, so a requeue is a request that service carries out: its started Inbox
runs the handler through the inbox and removes the dead message.`,
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
	bulk := func(use, short, done string, op func(consumerDead, context.Context, postbox.DeadSelection) (int, error)) *cobra.Command {
		var bf consumerFilterFlags
		c := &cobra.Command{Use: use + " [ID...]", Short: short}
		bf.register(c, true)
		c.RunE = func(cmd *cobra.Command, args []string) error {
			filter, err := bf.filter(args)
			if err != nil {
				return err
			}
			conn, err := f.open(cmd)
			if err != nil {
				return err
			}
			defer conn.close()
			n, err := op(conn.inbox, cmd.Context(), postbox.DeadSelection{DeadFilter: filter, All: bf.all})
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(cmd.OutOrStdout(), map[string]int{"count": n})
			}
			fmt.Fprintf(cmd.OutOrStdout(), done+"\n", n)
			return nil
		}
		return c
	}
	requeue := bulk("requeue", "Ask the consumer's service to run its handler again for dead messages (by --consumer and ids, or by filter)",
		"requeue requested for %d consumer dead message(s); the consumer's running Inbox carries it out", consumerDead.RequestRequeue)
	requeue.Long = `requeue marks consumers' dead messages for a requeue. The handler lives in the
consuming service: the Inbox of a process that has a Processor for the consumer
and was started (Inbox.Start) runs the handler through the inbox within
Config.RequeueInterval (5s by default) and removes the dead message. A handler
that fails again leaves the message dead, with the new error and one more
attempt. Select by --consumer and ids, or by filter (--consumer, --topic,
--key, --since, --until), or --all.`
	del := bulk("delete", "Delete consumers' dead messages (by --consumer and ids, or by filter; --all for every one)",
		"deleted %d consumer dead message(s)", consumerDead.DeleteDeadSelected)
	cmd.AddCommand(list, show, requeue, del)
	return cmd
}

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

var consumersDead = deadSide{
	consumer: true,
	list: func(ctx context.Context, c *conn, f postbox.DeadFilter) ([]postbox.DeadMessage, error) {
		return c.inbox.ListDead(ctx, f)
	},
	get: func(ctx context.Context, c *conn, args []string) (postbox.DeadMessage, error) {
		return c.inbox.GetDead(ctx, args[0], args[1])
	},
	json:   consumerDeadJSON,
	header: "CONSUMER\tMESSAGE ID\tTOPIC\tKEY\tATTEMPTS\tDEAD AT\tERROR",
	row: func(d *postbox.DeadMessage) []string {
		return []string{safe(d.Consumer), safe(oneLine(d.ID, 40)), safe(d.Topic), safe(oneLine(d.Key, 40)),
			strconv.Itoa(d.Attempts), d.DeadAt.UTC().Format(time.RFC3339), reason(d, 80)}
	},
	detail: func(out io.Writer, d *postbox.DeadMessage) {
		fmt.Fprintf(out, "consumer    %s\nmessage id  %s\ntopic       %s\nkey         %s\nattempts    %d\nfirst fail  %s\nlast fail   %s\ndead at     %s\nerror       %s\n",
			safe(d.Consumer), safe(d.ID), safe(d.Topic), safe(d.Key), d.Attempts,
			rfc3339(d.FirstFailureAt), rfc3339(d.LastFailureAt), rfc3339(d.DeadAt), safe(d.Error))
	},
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
	requeue := deadBulk(f, consumersDead, "requeue", "Ask the consumer's service to run its handler again for dead messages (by --consumer and ids, or by filter)",
		"requeue requested for %d consumer dead message(s); the consumer's running Inbox carries it out",
		func(ctx context.Context, c *conn, s postbox.DeadSelection) (int, error) {
			return c.inbox.RequestRequeue(ctx, s)
		})
	requeue.Long = `requeue marks consumers' dead messages for a requeue. The handler lives in the
consuming service: the Inbox of a process that has a Processor for the consumer
and was started (Inbox.Start) runs the handler through the inbox within
Config.RequeueInterval (5s by default) and removes the dead message. A handler
that fails again leaves the message dead, with the new error and one more
attempt. Select by --consumer and ids, or by filter (--consumer, --topic,
--key, --since, --until), or --all.`
	cmd.AddCommand(
		deadList(f, consumersDead, "List consumers' dead messages, newest first"),
		deadShow(f, consumersDead, "show CONSUMER ID", "Show one consumer's dead message with its payload and headers", 2),
		requeue,
		deadBulk(f, consumersDead, "delete", "Delete consumers' dead messages (by --consumer and ids, or by filter; --all for every one)",
			"deleted %d consumer dead message(s)",
			func(ctx context.Context, c *conn, s postbox.DeadSelection) (int, error) {
				return c.inbox.DeleteDeadSelected(ctx, s)
			}))
	return cmd
}

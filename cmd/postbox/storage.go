package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/postbox-go/postbox/cmd/postbox/internal/relayd"
	"github.com/postbox-go/postbox/internal/pgsql"
)

func newStorage(f *dbFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "storage [table|log]",
		Short: "Show what the database says its relays read, and each live relay's storage; switch it",
		Long: `storage shows what a PostgreSQL database says its relays read: table (the
outbox) or log (the log of design §3, with the outbox beside it),
since when, and what each live relay reads. With an argument it switches the
setting.

To the log: relays first, then writers. Restart every relay with storage log
(a relay over the log also reads the outbox), then run "postbox storage log";
it is refused while a live relay reads the table, and from then on a relay over
the table is refused at its start and at its next heartbeat.

Back to the table: writers first, then relays. Run "postbox storage table",
then restart the relays with storage table once the log is drained; a relay
over the table refuses to start while the log holds a message no relay over
it has passed.

Writers: a writer made postboxpgx.WithLog, and the outbox's rules trigger for
the rows of writers in other languages, read the setting in each write and
write the log while it says log; a switch waits up to 5s for the writes that
read it before, in tries of 50ms between which the writes that began meanwhile
go through. Writers without the option keep the outbox, which every relay
reads.`,
		Args:      cobra.MaximumNArgs(1),
		ValidArgs: []string{relayd.StorageTable, relayd.StorageLog},
		RunE: withConnArgs(f, func(ctx context.Context, c *conn, out io.Writer, args []string) error {
			if c.storage == nil {
				return usagef("--database: the storage setting is PostgreSQL's; a %s database keeps the table", relayd.URLKind(f.url))
			}
			var st pgsql.StorageState
			var err error
			if len(args) == 0 {
				st, err = c.storage.Storage(ctx)
			} else {
				if args[0] != relayd.StorageTable && args[0] != relayd.StorageLog {
					return usagef("storage %q: want %s or %s", args[0], relayd.StorageTable, relayd.StorageLog)
				}
				st, err = c.storage.SwitchStorage(ctx, args[0])
			}
			if err != nil {
				return err
			}
			if f.json {
				return printJSON(out, st)
			}
			fmt.Fprintf(out, "the database's relays read: %s (since %s)\n", st.Storage, st.ChangedAt.UTC().Format(time.RFC3339))
			if len(st.Relays) == 0 {
				fmt.Fprintln(out, "no live relay")
				return nil
			}
			rows := make([][]string, 0, len(st.Relays))
			for _, r := range st.Relays {
				rows = append(rows, []string{r.ID, r.Storage, r.ExpiresAt.UTC().Format(time.RFC3339)})
			}
			return table(out, "RELAY\tSTORAGE\tHEARTBEAT UNTIL", rows)
		}),
	}
}

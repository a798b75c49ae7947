package main

import (
	"context"
	"log/slog"
	"os"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/postbox-go/postbox/cmd/postbox/internal/relayd"
)

// daemonGCPercent is the daemon's GOGC unless the environment sets one:
// a relay's garbage is the short-lived rows and envelopes of each batch,
// and collecting half as often cut the relay's CPU per drained message by
// 17–21% (23.6 to 19.5 and 26.6 to 20.9 µs, medians of two sets of 3
// alternating drains) for a
// peak of 47–49 MiB draining 200,000 messages against 41–44 MiB
// (BENCHMARKS.md, "The relay daemon's GOGC").
const daemonGCPercent = 200

// setDaemonGC sets the collector to daemonGCPercent unless lookup finds
// GOGC in the environment, and reports whether it did.
func setDaemonGC(lookup func(string) (string, bool)) bool {
	if _, set := lookup("GOGC"); set {
		return false
	}
	debug.SetGCPercent(daemonGCPercent)
	return true
}

func newRelay() *cobra.Command {
	var path, database, prefix, natsURL, listen, level string
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Run the relay as a daemon: publish what services write into the outbox table",
		Long: `relay moves committed rows from the outbox table of one or more databases to NATS
JetStream, RabbitMQ, Kafka, Redis Streams or webhooks, chosen by topic routes,
for services in any language that write the rows themselves (the table contract
is in the README). Configuration comes from a YAML file (--config), then
POSTBOX_* environment variables, then these flags; every problem is listed at
start-up. SIGTERM or SIGINT stops it cleanly: the batch in flight finishes and
the partitions are released for the other replicas. Its garbage collector
runs at GOGC=200 unless GOGC is set.

` + relayd.EnvHelp(),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			setDaemonGC(os.LookupEnv)
			cfg, loadErr := relayd.Load(path, os.Getenv)
			if cfg == nil {
				return usagef("%v", loadErr)
			}
			if database != "" {
				cfg.Databases = []relayd.Database{{URL: database, Prefix: prefix}}
			} else if prefix != "" {
				for i := range cfg.Databases {
					cfg.Databases[i].Prefix = prefix
				}
			}
			for _, o := range []struct {
				flag string
				dst  *string
			}{{natsURL, &cfg.NATS.URL}, {listen, &cfg.Admin.Listen}, {level, &cfg.Log.Level}} {
				if o.flag != "" {
					*o.dst = o.flag
				}
			}
			// The file's, the environment's and the settings' problems,
			// all at once.
			if err := relayd.Check(cfg, loadErr); err != nil {
				return err
			}
			log := relayd.Logger(cfg, cmd.ErrOrStderr())
			d, err := relayd.Start(cmd.Context(), cfg, log)
			if err != nil {
				return err
			}
			<-cmd.Context().Done()
			log.Info("postbox relay daemon stopping")
			stop, cancel := context.WithTimeout(context.Background(), cfg.StopTimeout())
			defer cancel()
			if err := d.Stop(stop); err != nil {
				log.Error("postbox relay daemon: unclean stop", slog.Any("error", err))
				return err
			}
			log.Info("postbox relay daemon stopped")
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&path, "config", os.Getenv("POSTBOX_CONFIG"), "YAML configuration file (env POSTBOX_CONFIG)")
	f.StringVar(&database, "database", "", "one database to relay from, overriding the file: postgres://..., mysql://... or sqlite:PATH")
	f.StringVar(&prefix, "prefix", "", "table prefix")
	f.StringVar(&natsURL, "nats-url", "", "NATS server (default "+relayd.DefaultNATSURL+")")
	f.StringVar(&listen, "admin-listen", "", "health, readiness and metrics listener (default "+relayd.DefaultAdminListen+"; off disables)")
	f.StringVar(&level, "log-level", "", "debug, info, warn or error")
	return cmd
}

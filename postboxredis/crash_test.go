package postboxredis_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/internal/sqlitetest"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxredis"
)

func openSQLite(t testing.TB, path string) postboxdriver.Driver[*sql.Tx] { return sqlitetest.DriverAt(t, path) }

// TestInboxCrashLoopIsBounded: a consumer process exits (os.Exit, with the
// handler's transaction open) whenever it runs one poison message. The
// test runs the consumer as a child process of its own binary and starts
// it again after every exit, as a supervisor would. The next child claims
// the dead one's pending entries after MinIdle, and the claim counts the
// delivery; after MaxCrashes counted crashes the inbox writes the poison
// as a consumer dead message, and the key's next message and every other
// key's run. On PostgreSQL and on SQLite.
func TestInboxCrashLoopIsBounded(t *testing.T) {
	if c, ok := pubtest.CrashChild(t); ok {
		redisCrashChild(t, c)
		return
	}
	rc := client(t, nil)
	for _, db := range []string{"postgres", "sqlite"} {
		t.Run(db, func(t *testing.T) {
			name := stream(t, rc, pubtest.CrashConsumer)
			c := pubtest.CrashCase{DB: db, Vars: map[string]string{"stream": name}}
			ci := pubtest.OpenCrashInbox(t, &c, openSQLite)
			pub := publisher(t, rc, &postboxredis.Config{Stream: name})
			send := func(msgs []postbox.Message) []string {
				ids := make([]string, len(msgs))
				for i, m := range msgs {
					env := envelope(m.Topic, m.Key, string(m.Payload))
					if err := publish(t, pub, context.Background(), env); err != nil {
						t.Fatal(err)
					}
					ids[i] = env.ID
				}
				return ids
			}
			// A live subscriber keeps the entries it holds from being
			// claimed, however short MinIdle: there is no wait to set.
			pubtest.CheckCrashLoop(t, ci, c, send, nil)
		})
	}
}

// redisCrashChild is the consuming process of TestInboxCrashLoopIsBounded.
func redisCrashChild(t *testing.T, c pubtest.CrashCase) {
	ci := pubtest.OpenCrashInbox(t, &c, openSQLite)
	sub := subscriber(t, client(t, nil), postboxredis.SubscriberConfig{
		Stream: c.Vars["stream"], Group: pubtest.CrashConsumer, PerKey: true, Block: 50 * time.Millisecond,
		MinIdle: 300 * time.Millisecond, ClaimInterval: 50 * time.Millisecond, IdleConsumerTTL: time.Second,
	})
	pubtest.RunCrashChild(t, ci, c, sub)
}

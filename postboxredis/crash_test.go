package postboxredis_test

import (
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/internal/sqlitetest"
	"github.com/postbox-go/postbox/postboxredis"
)

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
			ci := pubtest.OpenCrashInbox(t, &c, sqlitetest.DriverAt)
			pub := publisher(t, rc, &postboxredis.Config{Stream: name})
			// A live subscriber keeps the entries it holds from being
			// claimed, however short MinIdle: there is no wait to set.
			pubtest.CheckCrashLoop(t, ci, c, pub, func(m postbox.Message) *postbox.Envelope { return envelope(m.Topic, m.Key, string(m.Payload)) }, nil)
		})
	}
}

// redisCrashChild is the consuming process of TestInboxCrashLoopIsBounded.
func redisCrashChild(t *testing.T, c pubtest.CrashCase) {
	ci := pubtest.OpenCrashInbox(t, &c, sqlitetest.DriverAt)
	sub := subscriber(t, client(t, nil), postboxredis.SubscriberConfig{
		Stream: c.Vars["stream"], Group: pubtest.CrashConsumer, PerKey: true, Block: 50 * time.Millisecond,
		MinIdle: 300 * time.Millisecond, ClaimInterval: 50 * time.Millisecond, IdleConsumerTTL: time.Second,
	})
	pubtest.RunCrashChild(t, ci, c, sub)
}

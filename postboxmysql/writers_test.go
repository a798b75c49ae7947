package postboxmysql_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/mysqltest"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/postboxtest"
)

// TestSixteenWritersAndTheRelay: 16 writers commit a domain row and a
// message each transaction, at InnoDB's default REPEATABLE READ, over a
// few hot keys, while the relay reads, publishes and records beside them.
// No writer ever gets an error (a deadlock or a lock wait timeout), the
// relay logs none, and every message is published once, in its key's
// commit order.
func TestSixteenWritersAndTheRelay(t *testing.T) {
	ctx := context.Background()
	d, prefix := mysqltest.Migrated(t)
	db := d.DB()
	db.SetMaxOpenConns(32)
	const writers, keys = 16, 8
	for _, ddl := range []string{
		"CREATE TABLE " + prefix + "customers (id VARCHAR(64) PRIMARY KEY, orders INT NOT NULL) ENGINE = InnoDB",
		"CREATE TABLE " + prefix + "orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, customer VARCHAR(64) NOT NULL, amount INT NOT NULL) ENGINE = InnoDB",
	} {
		if _, err := db.ExecContext(ctx, ddl); err != nil {
			t.Fatal(err)
		}
	}
	for k := range keys {
		if _, err := db.ExecContext(ctx, "INSERT INTO "+prefix+"customers VALUES (?, 0)", fmt.Sprintf("customer-%d", k)); err != nil {
			t.Fatal(err)
		}
	}
	broker := postboxtest.NewBroker(nil)
	logs := &pubtest.Logs{}
	c, err := postbox.NewClient(d, &postbox.Config{
		Prefix: prefix, Publisher: broker, PollInterval: 5 * time.Millisecond, BatchSize: 50,
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	stop := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	var written atomic.Int64
	errs := make(chan error, writers)
	// order[key] is the sequence each key's writes committed in. A writer
	// updates its customer's row first, as an application changing that
	// entity does, and holds the row's lock until its commit: the writes
	// of a key are serialized, so the order they commit in is the order
	// they are published in.
	var mu sync.Mutex
	order := map[string][]string{}
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(stop); i++ {
				key := fmt.Sprintf("customer-%d", (w+i)%keys)
				id := postbox.NewID()
				err := func() error {
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					defer func() { _ = tx.Rollback() }()
					if _, err := tx.ExecContext(ctx, "UPDATE "+prefix+"customers SET orders = orders + 1 WHERE id = ?", key); err != nil {
						return err
					}
					if _, err := tx.ExecContext(ctx, "INSERT INTO "+prefix+"orders (customer, amount) VALUES (?, ?)", key, i); err != nil {
						return err
					}
					if err := c.WriteTx(ctx, tx, postbox.Message{ID: id, Topic: "orders.created", Key: key, Payload: []byte("p")}); err != nil {
						return err
					}
					mu.Lock()
					defer mu.Unlock()
					if err := tx.Commit(); err != nil {
						return err
					}
					order[key] = append(order[key], id)
					return nil
				}()
				if err != nil {
					errs <- fmt.Errorf("writer %d: %w", w, err)
					return
				}
				written.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for int64(len(broker.Messages())) < written.Load() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	got := broker.Messages()
	if int64(len(got)) != written.Load() {
		t.Fatalf("published %d of %d messages", len(got), written.Load())
	}
	seen := map[string]bool{}
	at := map[string]int{}
	for _, env := range got {
		if seen[env.ID] {
			t.Fatalf("message %s published twice", env.ID)
		}
		seen[env.ID] = true
		want := order[env.Key]
		if at[env.Key] >= len(want) || want[at[env.Key]] != env.ID {
			t.Fatalf("key %s: message %s published out of its commit order", env.Key, env.ID)
		}
		at[env.Key]++
	}
	for _, bad := range []string{"Deadlock", "Lock wait timeout", "level=ERROR", "paused"} {
		if strings.Contains(logs.String(), bad) {
			t.Errorf("the relay logged %q:\n%s", bad, logs.String())
		}
	}
	t.Logf("%d messages from %d writers over %d keys", written.Load(), writers, keys)
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+prefix+"orders").Scan(&n); err != nil || int64(n) != written.Load() {
		t.Fatalf("orders hold %d rows (%v), want %d", n, err, written.Load())
	}
}

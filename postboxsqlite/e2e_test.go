package postboxsqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxsqlite"
)

// A client writes 1,000 messages over 20 keys, in its own transactions and
// in the application's, and its relay publishes every one, in order per key.
func TestEndToEnd(t *testing.T) {
	ctx := context.Background()
	db, _ := openDB(t)
	d, err := postboxsqlite.New(db)
	if err != nil {
		t.Fatal(err)
	}
	const p = "e2e_"
	m, err := postboxmigrate.New(d, &postboxmigrate.Config{Prefix: p})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var published []*postbox.Envelope
	pub := postbox.PublisherFunc(func(_ context.Context, env *postbox.Envelope) error {
		mu.Lock()
		published = append(published, env)
		mu.Unlock()
		return nil
	})
	c, err := postbox.NewClient(d, &postbox.Config{Prefix: p, Publisher: pub})
	if err != nil {
		t.Fatal(err)
	}

	const total, nkeys = 1000, 20
	ids := map[string]bool{}
	next := map[string]int{}
	var batch []postbox.Message
	flush := func(i int) {
		if i%2 == 0 {
			if err := c.Write(ctx, batch...); err != nil {
				t.Fatal(err)
			}
		} else {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.WriteTx(ctx, tx, batch...); err != nil {
				_ = tx.Rollback()
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		}
		batch = batch[:0]
	}
	for i := range total {
		key := fmt.Sprintf("key-%02d", i%nkeys)
		id := postbox.NewID()
		ids[id] = true
		batch = append(batch, postbox.Message{ID: id, Topic: "orders.created", Key: key, Payload: []byte(strconv.Itoa(next[key]))})
		next[key]++
		if len(batch) == 25 {
			flush(i / 25)
		}
	}
	if st, err := c.Stats(ctx); err != nil || st.Pending != total {
		t.Fatalf("before start: %+v, %v", st, err)
	}

	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := c.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not drained in time: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}

	st, err := c.Stats(ctx)
	if err != nil || st.Published != total || st.Dead != 0 {
		t.Fatalf("after stop: %+v, %v", st, err)
	}
	mu.Lock()
	defer mu.Unlock()
	seen := map[string]bool{}
	want := map[string]int{}
	for _, env := range published {
		if !ids[env.ID] {
			t.Fatalf("published unknown id %s", env.ID)
		}
		if seen[env.ID] {
			continue // a redelivery is allowed; order counts first deliveries
		}
		seen[env.ID] = true
		n, err := strconv.Atoi(string(env.Payload))
		if err != nil {
			t.Fatal(err)
		}
		if n != want[env.Key] {
			t.Fatalf("key %s: message %d published when %d was due", env.Key, n, want[env.Key])
		}
		want[env.Key]++
		if env.Headers[postbox.HeaderID] != env.ID || env.Headers[postbox.HeaderPartitionKey] != env.Key || env.Attempt != 1 {
			t.Fatalf("envelope %+v", env)
		}
	}
	if len(seen) != total {
		t.Fatalf("%d distinct ids published, want %d", len(seen), total)
	}
	for k, n := range next {
		if want[k] != n {
			t.Fatalf("key %s: %d published, want %d", k, want[k], n)
		}
	}
}

func TestDurabilityWarnings(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "weak.db")
	for _, c := range []struct {
		dsn  string
		warn bool
	}{
		{postboxsqlite.DSN(path), false},
		{"file:" + path + "?_pragma=synchronous(OFF)", true},
	} {
		db, err := sql.Open("sqlite", c.dsn)
		if err != nil {
			t.Fatal(err)
		}
		d, err := postboxsqlite.New(db)
		if err != nil {
			t.Fatal(err)
		}
		st, err := d.Open("postbox_")
		if err != nil {
			t.Fatal(err)
		}
		w, err := st.DurabilityWarnings(ctx)
		_ = db.Close()
		if err != nil || (len(w) > 0) != c.warn {
			t.Fatalf("%s: warnings %v, %v; want warning=%v", c.dsn, w, err, c.warn)
		}
	}
}

func TestStatusHasNoHeldSnapshotOnSQLite(t *testing.T) {
	f := migrated(t)
	ctx := context.Background()
	client, err := postbox.NewClient(f.d, &postbox.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	admin := client.Admin()
	st, err := admin.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.HeldSnapshot != nil {
		t.Fatalf("HeldSnapshot = %+v on SQLite", st.HeldSnapshot)
	}
}

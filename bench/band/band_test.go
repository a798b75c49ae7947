package band_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox/bench/band"
)

const (
	parts = 4
	keys  = 24
)

func databaseURL() string {
	if u := os.Getenv("POSTBOX_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// TestBandsUnderConcurrentWriters runs writers against a log and one
// reader by snapshot bands, and checks what design §3 claims: every
// committed row is read exactly once, however late its transaction
// commits, none of a rolled-back one is, and each key's rows are read in
// the order their transactions committed.
//
// The writers make the hard cases on purpose:
//   - a key's writers take the key's advisory lock (which assigns no
//     transaction id) and write the key's next number, so a key's commit
//     order is known;
//   - half of them write a domain row first, so their transaction id is
//     older than another writer's that drew its seq earlier;
//   - the others make the log row their transaction's first write, the
//     case the xid-before-seq rule is for;
//   - some hold their transaction open after the insert (late commits
//     with a lower seq), and some roll back;
//   - one transaction stays open for the whole run, and its row must come
//     through the xip arm once it commits.
//
// The reader reads five rows at a time, so that bands are read on over
// several reads.
func TestBandsUnderConcurrentWriters(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		t.Skipf("PostgreSQL at %s is unreachable: %v", databaseURL(), err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	prefix := "band_" + hex.EncodeToString(b) + "_"
	if _, err := pool.Exec(ctx, band.Schema(prefix)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), fmt.Sprintf("DROP TABLE %slog, %sdomain", prefix, prefix))
	})

	// The long transaction: its row is written first of all, and
	// committed last.
	long, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = long.Rollback(context.Background()) }()
	if _, err := long.Exec(ctx, "INSERT INTO "+prefix+"log (partition, key, n) VALUES (0, 'long', 1)"); err != nil {
		t.Fatal(err)
	}

	var committed, rolledBack atomic.Int64
	write := func(rng *mrand.Rand) error {
		k := rng.IntN(keys)
		key := fmt.Sprintf("k%02d", k)
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		if rng.IntN(2) == 0 {
			if _, err := tx.Exec(ctx, "INSERT INTO "+prefix+"domain DEFAULT VALUES"); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", prefix+key); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+prefix+"log (partition, key, n) SELECT $1, $2, coalesce(max(n), 0) + 1 FROM "+prefix+"log WHERE key = $2",
			k%parts, key); err != nil {
			return err
		}
		switch rng.IntN(10) {
		case 0:
			rolledBack.Add(1)
			return tx.Rollback(ctx)
		case 1, 2:
			time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		committed.Add(1)
		return nil
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 6 {
		wg.Go(func() {
			rng := mrand.New(mrand.NewPCG(uint64(w), 7))
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := write(rng); err != nil {
					errs <- err
					return
				}
			}
		})
	}

	r := band.NewReader(pool, prefix, parts, 5)
	seen := map[int64]bool{}
	last := map[string]int{}
	var read, late, viaXip, longRead int
	maxSeq := int64(0)
	consume := func(rows []band.Row) {
		for _, row := range rows {
			if seen[row.Seq] {
				t.Errorf("seq %d read twice", row.Seq)
			}
			seen[row.Seq] = true
			if row.N != last[row.Key]+1 {
				t.Errorf("key %s: number %d read after %d", row.Key, row.N, last[row.Key])
			}
			last[row.Key] = row.N
			if row.Seq < maxSeq {
				late++ // a reader that kept the last seq read would have skipped it
			}
			maxSeq = max(maxSeq, row.Seq)
			if row.Xip {
				viaXip++
			}
			if row.Key == "long" {
				longRead++
			}
			read++
		}
	}
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		rows, err := r.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		consume(rows)
		if len(rows) == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	if err := long.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// Everything is committed now: read until a read finds nothing twice
	// (the second after a band closed).
	for empty := 0; empty < 2; {
		rows, err := r.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		consume(rows)
		if len(rows) == 0 {
			empty++
		} else {
			empty = 0
		}
	}

	var total int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+prefix+"log").Scan(&total); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d transactions committed, %d rolled back; %d rows read, %d after a higher seq, %d through the xip arm",
		committed.Load(), rolledBack.Load(), read, late, viaXip)
	if read != total || int64(total) != committed.Load()+1 {
		t.Fatalf("read %d rows; the log holds %d visible, and %d transactions committed a row", read, total, committed.Load()+1)
	}
	if longRead != 1 {
		t.Fatalf("the long transaction's row was read %d times", longRead)
	}
	if late == 0 || viaXip == 0 {
		t.Fatalf("the run made %d late commits and read %d rows through the xip arm: it did not exercise the case", late, viaXip)
	}
}

package pgbouncer_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-go/postbox/internal/pgbouncer"
)

// TestTransactionPooling: two client connections through the pooler share
// server connections between transactions, which is what makes a
// transaction pooler different from a direct connection.
func TestTransactionPooling(t *testing.T) {
	if _, err := pgbouncer.Binary(); errors.Is(err, pgbouncer.ErrNotInstalled) {
		t.Skip(err)
	}
	ctx := context.Background()
	s, err := pgbouncer.Start(ctx, pgbouncer.Config{Upstream: "127.0.0.1:5432", Databases: []string{"test"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	u, err := s.URL("postgres://postgres@127.0.0.1:5432/test?sslmode=disable&default_query_exec_mode=simple_protocol")
	if err != nil {
		t.Fatal(err)
	}
	a, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(ctx)
	b, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(ctx)
	pid := func(c *pgx.Conn) int {
		var p int
		if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pa := pid(a)
	tx, err := b.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var pb int
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pb); err != nil {
		t.Fatal(err)
	}
	pa2 := pid(a)
	_ = tx.Commit(ctx)
	t.Logf("a %d, b in a transaction %d, a again %d", pa, pb, pa2)
	if pa == pa2 && pb != pa {
		t.Fatal("no server connection moved between clients")
	}
}

// A pooler that ends before Stop says how it ended, with its log, which
// Stop then removes; one running says nothing.
func TestExitedSaysHow(t *testing.T) {
	if _, err := pgbouncer.Binary(); errors.Is(err, pgbouncer.ErrNotInstalled) {
		t.Skip(err)
	}
	s, err := pgbouncer.Start(context.Background(), pgbouncer.Config{Upstream: "127.0.0.1:5432", Databases: []string{"test"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if why, ended := s.Exited(); ended {
		t.Fatalf("running, Exited says %q", why)
	}
	pid, err := os.ReadFile(filepath.Join(filepath.Dir(s.Log), "pgbouncer.pid"))
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if _, err := fmt.Sscan(string(pid), &n); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(n, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		why, ended := s.Exited()
		if ended {
			if !strings.Contains(why, "pgbouncer.log, last lines:") || !strings.Contains(why, "exit status") {
				t.Fatalf("Exited says %q", why)
			}
			t.Log(why)
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("pgbouncer did not end on SIGTERM")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

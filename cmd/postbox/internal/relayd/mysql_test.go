package relayd_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/postbox-go/postbox/cmd/postbox/internal/relayd"
	"github.com/postbox-go/postbox/internal/mysqltest"
)

// TestDaemonOnMySQL: the daemon relays from MariaDB (or MySQL) given a
// mysql:// URL, rows inserted with plain SQL by another writer (the table
// contract), to JetStream, and reports them published.
func TestDaemonOnMySQL(t *testing.T) {
	ctx := context.Background()
	d, prefix := mysqltest.Migrated(t)
	_, url := embeddedNATS(t)
	cfg, err := relayd.Load(writeFile(t, `
nats:
  subject_prefix: "svc."
  streams: [{name: SVCMY, subjects: ["svc.>"]}]
relay: {lease: 3s, poll_interval: 20ms}
admin: {listen: "127.0.0.1:0"}
`), env(map[string]string{"POSTBOX_DATABASE_URL": mysqltest.DSN(), "POSTBOX_PREFIX": prefix, "POSTBOX_NATS_URL": url}))
	if err != nil {
		t.Fatal(err)
	}
	dm, err := relayd.Start(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		stop, cancel := context.WithTimeout(ctx, cfg.StopTimeout())
		defer cancel()
		if err := dm.Stop(stop); err != nil {
			t.Error(err)
		}
	}()
	var values []string
	var args []any
	for i := range 200 {
		values = append(values, "(UUID(), 'orders.created', ?, ?, '{\"content-type\":\"application/json\"}')")
		args = append(args, fmt.Sprintf("order-%d", i%5), fmt.Sprintf(`{"n":%d}`, i))
	}
	if _, err := d.DB().ExecContext(ctx, "INSERT INTO "+prefix+"outbox (id, topic, `key`, payload, headers) VALUES "+strings.Join(values, ","), args...); err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + dm.Addr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		code, body := get("/v1/status")
		if code == 200 && strings.Contains(body, `"published_kept": 200`) && strings.Contains(body, `"pending": 0`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status %d\n%s", code, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, body := get("/readyz"); code != 200 {
		t.Fatalf("readyz %d %s", code, body)
	}
}

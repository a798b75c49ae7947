package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/cmd/postbox/internal/relayd"
	"github.com/postbox-go/postbox/internal/mysqltest"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxpgx"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// run executes the CLI in-process and returns its output and exit code.
func run(t *testing.T, args ...string) (string, int) {
	t.Helper()
	var out bytes.Buffer
	root := newRoot()
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	code := execute(context.Background(), root, &out)
	return out.String(), code
}

// runSplit is run with stdout and stderr apart.
func runSplit(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errw bytes.Buffer
	root := newRoot()
	root.SetOut(&out)
	root.SetErr(&errw)
	root.SetArgs(args)
	code = execute(context.Background(), root, &errw)
	return out.String(), errw.String(), code
}

func must(t *testing.T, args ...string) string {
	t.Helper()
	out, code := run(t, args...)
	if code != 0 {
		t.Fatalf("postbox %s: exit %d\n%s", strings.Join(args, " "), code, out)
	}
	return out
}

// databases returns a PostgreSQL, a MySQL and an SQLite target with fresh
// prefixes.
func databases(t *testing.T) map[string][]string {
	pool := testdb.Pool(t)
	prefix := testdb.Prefix(t)
	testdb.DropPrefix(t, pool, prefix)
	myPrefix := mysqltest.Prefix()
	mysqltest.DropPrefix(t, mysqltest.Open(t), myPrefix)
	return map[string][]string{
		"postgres": {"--database", testdb.PostgresURL(), "--prefix", prefix},
		"mysql":    {"--database", mysqltest.DSN(), "--prefix", myPrefix},
		"sqlite":   {"--database", "sqlite:" + filepath.Join(t.TempDir(), "ops.db"), "--prefix", "ops_"},
	}
}

func TestOperatorCommands(t *testing.T) {
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			cmd := func(args ...string) []string { return append(args, db...) }
			if out, code := run(t, cmd("status")...); code != 1 || !strings.Contains(out, "not migrated") {
				t.Fatalf("status before migrate: exit %d\n%s", code, out)
			}
			if out := must(t, cmd("migrate", "up")...); !strings.Contains(out, "applied 001") {
				t.Fatalf("migrate up: %s", out)
			}
			if out := must(t, cmd("migrate", "up")...); !strings.Contains(out, "schema is current") {
				t.Fatalf("second migrate up: %s", out)
			}
			if out := must(t, cmd("migrate", "status")...); strings.Contains(out, "pending") {
				t.Fatalf("migrate status: %s", out)
			}

			// Messages through the library: two published, two dead, one pending.
			client := clientFor(t, db)
			ctx := context.Background()
			if err := client.Write(ctx,
				postbox.Message{Topic: "orders.created", Key: "o1"},
				postbox.Message{Topic: "orders.paid", Key: "o2"},
				postbox.Message{Topic: "orders.created", Key: "o3", Payload: []byte("poison")},
				postbox.Message{Topic: "orders.refunded", Payload: []byte("poison")},
			); err != nil {
				t.Fatal(err)
			}
			if _, err := client.Drain(ctx); err != nil {
				t.Fatal(err)
			}
			if err := client.Write(ctx, postbox.Message{Topic: "orders.paid"}); err != nil {
				t.Fatal(err)
			}

			var st map[string]any
			if err := json.Unmarshal([]byte(must(t, cmd("status", "--json")...)), &st); err != nil {
				t.Fatal(err)
			}
			if st["pending"] != 1.0 || st["dead"] != 2.0 || st["published_kept"] != 2.0 || len(st["topics"].([]any)) != 3 {
				t.Fatalf("status --json: %v", st)
			}
			if out := must(t, cmd("status")...); !strings.Contains(out, "orders.refunded") {
				t.Fatalf("status: %s", out)
			}

			var dead []map[string]any
			if err := json.Unmarshal([]byte(must(t, cmd("dead", "list", "--json")...)), &dead); err != nil || len(dead) != 2 {
				t.Fatalf("dead list: %v %v", dead, err)
			}
			id := dead[0]["id"].(string)
			if out := must(t, cmd("dead", "show", id)...); !strings.Contains(out, "payload     poison") || !strings.Contains(out, "rejected") {
				t.Fatalf("dead show: %s", out)
			}
			if dead[0]["payload"] != base64.StdEncoding.EncodeToString([]byte("poison")) || dead[0]["payload_text"] != "poison" {
				t.Fatalf("dead list --json: payload as base64 and payload_text: %v", dead[0])
			}
			if out := must(t, cmd("dead", "list", "--topic", "orders.refunded")...); strings.Count(out, "\n") != 2 {
				t.Fatalf("dead list --topic: %s", out)
			}
			for _, bad := range [][]string{
				{"dead", "show", "x';--"}, {"dead", "requeue"}, {"dead", "delete"}, {"dead", "list", "--topic", "bad topic"},
				{"dead", "list", "--since", "yesterday"}, {"replay", "--since", "30d"}, {"replay", "--since", "1h", "--until", "2h"},
				{"migrate", "sql", "--dialect", "oracle"}, {"status", "--retention", "forever"},
				{"dead", "list", "--since", "106752d"}, {"dead", "list", "--key", "\xff"},
			} {
				if out, code := run(t, cmd(bad...)...); code != 2 {
					t.Errorf("postbox %s: exit %d, want 2\n%s", strings.Join(bad, " "), code, out)
				}
			}
			if _, code := run(t, cmd("dead", "show", postbox.NewID())...); code != 3 {
				t.Errorf("dead show of a missing id: exit %d, want 3", code)
			}
			if out := must(t, cmd("dead", "requeue", id)...); !strings.Contains(out, "requeued 1") {
				t.Fatalf("dead requeue: %s", out)
			}
			if out := must(t, cmd("dead", "delete", "--all")...); !strings.Contains(out, "deleted 1") {
				t.Fatalf("dead delete --all: %s", out)
			}

			if out := must(t, cmd("replay", "--since", "1h", "--dry-run", "--actor", "ci")...); !strings.Contains(out, "would re-stage 2") {
				t.Fatalf("replay --dry-run: %s", out)
			}
			if out := must(t, cmd("replay", "--since", "1h", "--topic", "orders.paid", "--actor", "ci")...); !strings.Contains(out, "re-staged 1") {
				t.Fatalf("replay: %s", out)
			}
			var log []map[string]any
			if err := json.Unmarshal([]byte(must(t, cmd("replay", "log", "--json")...)), &log); err != nil || len(log) != 2 || log[0]["actor"] != "ci" {
				t.Fatalf("replay log: %v %v", log, err)
			}
			if out := must(t, cmd("prune")...); !strings.Contains(out, "deleted 0 published message(s) older than 168h0m0s") {
				t.Fatalf("prune: %s", out)
			}
			for _, dialect := range []string{"postgres", "mysql", "sqlite"} {
				if out := must(t, cmd("migrate", "sql", "--dialect", dialect)...); !strings.Contains(out, "CREATE TABLE") {
					t.Fatalf("migrate sql --dialect %s: %s", dialect, out)
				}
			}
		})
	}
}

// clientFor opens a Client on the CLI's database, with a publisher that
// rejects payload "poison" for good.
func clientFor(t *testing.T, db []string) interface {
	Write(context.Context, ...postbox.Message) error
	Drain(context.Context) (postbox.DrainResult, error)
} {
	t.Helper()
	pub := postbox.PublisherFunc(func(_ context.Context, env *postbox.Envelope) error {
		if string(env.Payload) == "poison" {
			return postbox.NewMessageError(errors.New("rejected"))
		}
		return nil
	})
	cfg := &postbox.Config{Prefix: db[3], Publisher: pub, MaxAttempts: 1}
	if relayd.URLKind(db[1]) != relayd.KindPostgres {
		d, sdb, err := relayd.OpenSQL(db[1])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sdb.Close() })
		c, err := postbox.NewClient(d, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c, err := postbox.NewClient(pgxDriver(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func pgxDriver(t *testing.T) *postboxpgx.Driver { return postboxpgx.New(testdb.Pool(t)) }

// An admin listener on an open address without tokens is bad input: exit
// 2, before any database or broker is touched.
func TestRelayRefusedListenerExits2(t *testing.T) {
	db := "sqlite:" + filepath.Join(t.TempDir(), "never-opened.db")
	for _, addr := range []string{"0.0.0.0:0", ":0"} {
		out, code := run(t, "relay", "--database", db, "--admin-listen", addr)
		if code != 2 || !strings.Contains(out, "no token") {
			t.Errorf("relay --admin-listen %s: exit %d, want 2\n%s", addr, code, out)
		}
	}
}

// status marks a count that is the database's estimate, in text and in
// JSON, and leaves an exact one as it was.
func TestStatusMarksEstimates(t *testing.T) {
	st := postbox.Status{}
	st.Pending, st.Published, st.PublishedEstimated = 12, 1_234_567, true
	var out bytes.Buffer
	if err := printStatus(&out, st); err != nil {
		t.Fatal(err)
	}
	if line := strings.SplitN(out.String(), "\n", 2)[0]; !strings.Contains(line, "pending 12 (") || !strings.Contains(line, "published kept ≈1234567") {
		t.Fatalf("status says %q", line)
	}
	js := statusJSON(st)
	if js["pending_estimated"] != false || js["published_kept_estimated"] != true || js["published_kept"] != int64(1_234_567) {
		t.Fatalf("status --json: %v", js)
	}
}

package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pglog"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxpgx"
)

// pgTarget is a migrated PostgreSQL prefix for the CLI, and a Client over
// it whose publisher rejects every message for good.
func pgTarget(t *testing.T) ([]string, *postbox.Client[pgx.Tx]) {
	t.Helper()
	pool, prefix := testdb.Migrated(t)
	pub := postbox.PublisherFunc(func(_ context.Context, env *postbox.Envelope) error {
		return postbox.NewMessageError(errors.New("postboxtest: publish " + env.ID + ": rejected: no such queue"))
	})
	c, err := postbox.NewClient(postboxpgx.New(pool), &postbox.Config{Prefix: prefix, Publisher: pub, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	return []string{"--database", testdb.PostgresURL(), "--prefix", prefix}, c
}

// A binary payload survives --json byte for byte, and `dead show` prints
// it as a hex dump, never raw; `dead list` shows the error's reason
// without the message's id.
func TestCLIBinaryPayloadAndReason(t *testing.T) {
	db, client := pgTarget(t)
	ctx := context.Background()
	payload := []byte{0x1b, '[', '2', 'J', 0xff, 0x00, 'x'}
	if err := client.Write(ctx, postbox.Message{Topic: "bin.data", Payload: payload, Headers: map[string]string{"x-note": "a\u0085b"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	var dead []map[string]any
	if err := json.Unmarshal([]byte(must(t, append([]string{"dead", "list", "--json"}, db...)...)), &dead); err != nil || len(dead) != 1 {
		t.Fatalf("dead list --json: %v %v", dead, err)
	}
	got, err := base64.StdEncoding.DecodeString(dead[0]["payload"].(string))
	if err != nil || string(got) != string(payload) {
		t.Fatalf("payload %q (%v), want %q", got, err, payload)
	}
	if _, ok := dead[0]["payload_text"]; ok {
		t.Fatalf("payload_text for a payload that is not UTF-8: %v", dead[0])
	}
	id := dead[0]["id"].(string)
	out := must(t, append([]string{"dead", "show", id}, db...)...)
	if strings.Contains(out, "\x1b") || strings.Contains(out, "\x00") || strings.Contains(out, "\xff") || !strings.Contains(out, "7 bytes, not text") || !strings.Contains(out, "1b 5b 32 4a ff 00 78") {
		t.Fatalf("dead show of a binary payload:\n%q", out)
	}
	if strings.Contains(out, "\u0085") || !strings.Contains(out, `x-note: "a\u0085b"`) {
		t.Fatalf("dead show of a header with a control character:\n%q", out)
	}
	out = must(t, append([]string{"dead", "list"}, db...)...)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || strings.Count(lines[1], id) != 1 || !strings.Contains(lines[1], "postboxtest: publish: rejected: no such queue") {
		t.Fatalf("dead list: the id should be in its column only, the reason in full:\n%s", out)
	}
}

// With --json, an error is a JSON object on stderr naming the field, and
// stdout stays empty.
func TestCLIErrorsAsJSON(t *testing.T) {
	db, _ := pgTarget(t)
	stdout, stderr, code := runSplit(t, append([]string{"dead", "list", "--since", "yesterday", "--json"}, db...)...)
	var e map[string]any
	if err := json.Unmarshal([]byte(stderr), &e); err != nil || code != 2 || stdout != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q (%v)", code, stdout, stderr, err)
	}
	if e["field"] != "since" || e["exit_code"] != 2.0 || !strings.Contains(e["error"].(string), "yesterday") {
		t.Fatalf("error JSON %v", e)
	}
	_, stderr, code = runSplit(t, append([]string{"dead", "show", postbox.NewID(), "--json"}, db...)...)
	if err := json.Unmarshal([]byte(stderr), &e); err != nil || code != 3 || e["exit_code"] != 3.0 {
		t.Fatalf("missing message: exit %d, stderr %q", code, stderr)
	}
	_, stderr, code = runSplit(t, "dead", "list", "--bogus", "--json")
	if code != 2 || !strings.Contains(stderr, "bogus") {
		t.Fatalf("unknown flag: exit %d, stderr %q", code, stderr)
	}
	_, stderr, code = runSplit(t, "dead", "list", "--json", "--retention", "forever")
	if err := json.Unmarshal([]byte(stderr), &e); err != nil || code != 2 || e["field"] != "retention" {
		t.Fatalf("bad --retention: exit %d, stderr %q, %v", code, stderr, e)
	}
}

// An unknown command, at the top or under a group, exits 2; so do extra
// arguments.
func TestCLIUnknownCommandExits2(t *testing.T) {
	for _, args := range [][]string{{"bogus"}, {"dead", "bogus"}, {"consumer-dead", "bogus"}, {"migrate", "sideways"},
		{"replay", "log", "extra"}, {"status", "extra"}, {"dead", "show"}, {"consumer-dead", "show", "only-one"}} {
		if out, code := run(t, args...); code != 2 || !strings.Contains(out, "Error:") {
			t.Errorf("postbox %s: exit %d, want 2\n%s", strings.Join(args, " "), code, out)
		}
	}
	if out, code := run(t, "dead"); code != 0 || !strings.Contains(out, "Available Commands") {
		t.Errorf("postbox dead: exit %d\n%s", code, out)
	}
}

// --retention 0 says which retention it uses; a negative one keeps
// everything and says so.
func TestCLIRetentionSaysWhatItUses(t *testing.T) {
	db, _ := pgTarget(t)
	stdout, stderr, code := runSplit(t, append([]string{"prune", "--retention", "0"}, db...)...)
	if code != 0 || !strings.Contains(stderr, "--retention 0 means the default, 168h0m0s") || !strings.Contains(stdout, "older than 168h0m0s") {
		t.Fatalf("exit %d\nstdout %s\nstderr %s", code, stdout, stderr)
	}
	stdout, _, code = runSplit(t, append([]string{"prune", "--retention", "-1s", "--json"}, db...)...)
	var r map[string]any
	if err := json.Unmarshal([]byte(stdout), &r); err != nil || code != 0 || r["deleted"] != 0.0 || r["retention_seconds"] != -1.0 {
		t.Fatalf("exit %d: %s", code, stdout)
	}
}

// consumer-dead lists, shows and deletes the consumers' dead messages, by
// id or by filter.
func TestCLIConsumerDead(t *testing.T) {
	db, client := pgTarget(t)
	ctx := context.Background()
	in := client.Inbox()
	fail := func(context.Context, pgx.Tx, *postbox.Delivery) error { return errors.New("handler: bad order") }
	for _, d := range []struct{ consumer, id, topic string }{
		{"billing", "m-1", "orders.paid"}, {"billing", "m-2", "orders.created"}, {"shipping", "m-1", "orders.paid"},
	} {
		v := in.Handle(ctx, d.consumer, &postbox.Delivery{ID: d.id, Topic: d.topic, Payload: []byte{0xfe, 0x01}}, fail)
		if v.Action != postbox.DeadLettered {
			t.Fatalf("%s/%s: %v", d.consumer, d.id, v)
		}
	}
	var list []map[string]any
	if err := json.Unmarshal([]byte(must(t, append([]string{"consumer-dead", "list", "--json"}, db...)...)), &list); err != nil || len(list) != 3 {
		t.Fatalf("consumer-dead list --json: %v %v", list, err)
	}
	if out := must(t, append([]string{"consumer-dead", "list", "--consumer", "billing"}, db...)...); strings.Count(out, "\n") != 3 || !strings.Contains(out, "handler: bad order") {
		t.Fatalf("consumer-dead list --consumer billing:\n%s", out)
	}
	if out := must(t, append([]string{"consumer-dead", "show", "billing", "m-2"}, db...)...); !strings.Contains(out, "orders.created") || !strings.Contains(out, "fe 01") {
		t.Fatalf("consumer-dead show:\n%s", out)
	}
	for _, bad := range [][]string{{"consumer-dead", "delete"}, {"consumer-dead", "delete", "m-1"}, {"consumer-dead", "list", "--consumer", "a\x01b"}} {
		if out, code := run(t, append(bad, db...)...); code != 2 {
			t.Errorf("postbox %q: exit %d, want 2\n%s", bad, code, out)
		}
	}
	if _, code := run(t, append([]string{"consumer-dead", "show", "billing", "m-9"}, db...)...); code != 3 {
		t.Errorf("consumer-dead show of a missing message: exit %d, want 3", code)
	}
	if out := must(t, append([]string{"consumer-dead", "delete", "--consumer", "shipping", "m-1"}, db...)...); !strings.Contains(out, "deleted 1") {
		t.Fatalf("delete by id: %s", out)
	}
	if out := must(t, append([]string{"consumer-dead", "delete", "--topic", "orders.paid"}, db...)...); !strings.Contains(out, "deleted 1") {
		t.Fatalf("delete by topic: %s", out)
	}
	if out := must(t, append([]string{"consumer-dead", "delete", "--all"}, db...)...); !strings.Contains(out, "deleted 1") {
		t.Fatalf("delete --all: %s", out)
	}
}

// `consumer-dead requeue` marks; the consumer's running Inbox, which has
// the handler, runs it through the inbox and removes the dead message.
func TestCLIConsumerRequeueEndToEnd(t *testing.T) {
	db, _ := pgTarget(t)
	ctx := context.Background()
	// The consumer's service, on the same tables.
	pool := testdb.Pool(t)
	service, err := postbox.NewClient(postboxpgx.New(pool), &postbox.Config{Prefix: db[3], MaxAttempts: 1, RequeueInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	in := service.Inbox()
	fail := func(context.Context, pgx.Tx, *postbox.Delivery) error { return errors.New("handler: bad order") }
	for _, id := range []string{"m-1", "m-2"} {
		if v := in.Handle(ctx, "billing", &postbox.Delivery{ID: id, Topic: "orders.paid", Payload: []byte("{}")}, fail); v.Action != postbox.DeadLettered {
			t.Fatal(v)
		}
	}
	applied := make(chan string, 2)
	in.Processor("billing", func(_ context.Context, _ pgx.Tx, d *postbox.Delivery) error {
		applied <- d.ID
		return nil
	})
	if err := in.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = in.Stop(ctx) }()

	if out, code := run(t, append([]string{"consumer-dead", "requeue", "m-1"}, db...)...); code != 2 || !strings.Contains(out, "consumer") {
		t.Fatalf("requeue of an id without --consumer: exit %d\n%s", code, out)
	}
	if out := must(t, append([]string{"consumer-dead", "requeue", "--consumer", "billing", "m-1"}, db...)...); !strings.Contains(out, "requeue requested for 1") {
		t.Fatalf("requeue: %s", out)
	}
	select {
	case id := <-applied:
		if id != "m-1" {
			t.Fatalf("handler ran for %s", id)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the service's Inbox never ran the requested requeue")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var left []map[string]any
		if err := json.Unmarshal([]byte(must(t, append([]string{"consumer-dead", "list", "--json"}, db...)...)), &left); err != nil {
			t.Fatal(err)
		}
		if len(left) == 1 && left[0]["message_id"] == "m-2" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dead messages after the requeue: %v", left)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(applied) != 0 {
		t.Fatalf("the handler ran for a message nobody asked to requeue")
	}
}

// replay says what the broker will do: with --dedupe-window it counts
// the copies the broker would drop and refuses a real run while any
// would be; --as-new sends copies with fresh ids; the audit records it.
func TestCLIReplaySaysWhatHappens(t *testing.T) {
	db, _ := pgTarget(t)
	ctx := context.Background()
	pool := testdb.Pool(t)
	ok := postbox.PublisherFunc(func(context.Context, *postbox.Envelope) error { return nil })
	c, err := postbox.NewClient(postboxpgx.New(pool), &postbox.Config{Prefix: db[3], Publisher: ok})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Write(ctx, postbox.Message{Topic: "orders.paid", Key: "o1"}, postbox.Message{Topic: "orders.paid", Key: "o2"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	replay := func(args ...string) []string {
		return append(append([]string{"replay", "--since", "1h", "--actor", "ci"}, args...), db...)
	}
	if out := must(t, replay("--dry-run", "--dedupe-window", "2m")...); !strings.Contains(out, "would re-stage 2") ||
		!strings.Contains(out, "orders.paid: 2 of 2 published within the last 2m0s: the broker drops them as copies") {
		t.Fatalf("dry run with a duplicate window:\n%s", out)
	}
	if out, code := run(t, replay("--dedupe-window", "2m")...); code != 2 || !strings.Contains(out, "not replayed: 2 of the 2") || !strings.Contains(out, "--as-new") {
		t.Fatalf("a replay the broker would drop ran: exit %d\n%s", code, out)
	}
	if st, err := c.Admin().Status(ctx); err != nil || st.Pending != 0 {
		t.Fatalf("a refused replay staged %d (%v)", st.Pending, err)
	}
	if out := must(t, replay("--as-new")...); !strings.Contains(out, "sent 2 message(s)") || !strings.Contains(out, "as new messages") {
		t.Fatalf("replay --as-new:\n%s", out)
	}
	if st, err := c.Admin().Status(ctx); err != nil || st.Pending != 2 || st.Published != 2 {
		t.Fatalf("after --as-new: %+v %v", st, err)
	}
	if out := must(t, replay()...); !strings.Contains(out, "re-staged 2") || !strings.Contains(out, "--dedupe-window checks, --as-new avoids") {
		t.Fatalf("replay without a window:\n%s", out)
	}
	var log []map[string]any
	if err := json.Unmarshal([]byte(must(t, append([]string{"replay", "log", "--json"}, db...)...)), &log); err != nil || len(log) != 3 || log[1]["as_new"] != true {
		t.Fatalf("replay log: %v %v", log, err)
	}
}

// postbox relay with a bad file lists the file's and the settings'
// problems in one error, and exits 2 before starting anything.
func TestCLIRelayListsEveryConfigProblem(t *testing.T) {
	p := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(p, []byte("databases: [{url: \"oracle://x\"}]\nrelay: {leese: 30s}\nadmin: {tokens: [{name: ops, value: \"${NOT_SET_ANYWHERE}\", scope: admin}]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, code := run(t, "relay", "--config", p)
	if code != 2 {
		t.Fatalf("exit %d\n%s", code, out)
	}
	for _, want := range []string{"relay.leese", "admin.tokens[0].value", "NOT_SET_ANYWHERE", "databases[0].url"} {
		if !strings.Contains(out, want) {
			t.Errorf("the error does not name %s:\n%s", want, out)
		}
	}
}

// status --config reports each database of a relay's configuration on its
// own: one that does not exist is reported down with why, the other as
// usual, and the command exits 1.
func TestCLIStatusPerShard(t *testing.T) {
	_, prefix := testdb.Migrated(t)
	missing := strings.Replace(testdb.PostgresURL(), "/test?", "/postbox_no_such_database?", 1)
	path := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(path, []byte(`databases:
  - {url: "`+testdb.PostgresURL()+`", prefix: `+prefix+`}
  - {url: "`+missing+`"}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := runSplit(t, "status", "--config", path, "--json")
	var got struct {
		Shards []struct {
			Shard  string         `json:"shard"`
			Up     bool           `json:"up"`
			Error  string         `json:"error"`
			Status map[string]any `json:"status"`
		} `json:"shards"`
	}
	if err := json.Unmarshal([]byte(stdout), &got); err != nil || code != 1 || len(got.Shards) != 2 {
		t.Fatalf("status --config: exit %d, %v\n%s\n%s", code, err, stdout, stderr)
	}
	if s := got.Shards[0]; !s.Up || s.Status["pending"] != 0.0 {
		t.Fatalf("shard 0: %+v", s)
	}
	if s := got.Shards[1]; s.Up || !strings.Contains(s.Error, "does not exist") {
		t.Fatalf("shard 1: %+v", s)
	}
	if !strings.Contains(stderr, "1 of 2 shard(s) down") {
		t.Fatalf("stderr %q", stderr)
	}
	text, _, code := runSplit(t, "status", "--config", path)
	if code != 1 || !strings.Contains(text, "shard 0 (") || !strings.Contains(text, "): up") || !strings.Contains(text, "shard 1 (") || !strings.Contains(text, "DOWN") {
		t.Fatalf("text: exit %d\n%s", code, text)
	}
}

// --storage log opens the log's Store, as a relay with storage: log
// reads: status counts the log's pending rows, which the table's does not
// see; a storage that is neither, or the log on another database, is a
// usage error naming the flag.
func TestCLIStorage(t *testing.T) {
	ctx := context.Background()
	pool, prefix := testdb.Migrated(t)
	if err := pglog.UseLog(ctx, pool, prefix); err != nil {
		t.Fatal(err)
	}
	w, err := postbox.NewClient(postboxpgx.New(pool, postboxpgx.WithLog()), &postbox.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := w.Write(ctx, postbox.Message{Topic: "orders.logged"}); err != nil {
			t.Fatal(err)
		}
	}
	db := []string{"--database", testdb.PostgresURL(), "--prefix", prefix, "--json"}
	for storage, want := range map[string]float64{"table": 0, "log": 3} {
		var st map[string]any
		out := must(t, append([]string{"status", "--storage", storage}, db...)...)
		if err := json.Unmarshal([]byte(out), &st); err != nil || st["pending"] != want {
			t.Fatalf("status --storage %s: %s (%v), want pending %v", storage, out, err, want)
		}
	}
	// status --config takes each database's storage from the relay's file.
	path := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(path, []byte(`databases:
  - {url: "`+testdb.PostgresURL()+`", prefix: `+prefix+`, storage: log}
  - {url: "`+testdb.PostgresURL()+`", prefix: `+prefix+`}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	var shards struct {
		Shards []struct {
			Status map[string]any `json:"status"`
		} `json:"shards"`
	}
	out := must(t, "status", "--config", path, "--json")
	if err := json.Unmarshal([]byte(out), &shards); err != nil || len(shards.Shards) != 2 ||
		shards.Shards[0].Status["pending"] != 3.0 || shards.Shards[1].Status["pending"] != 0.0 {
		t.Fatalf("status --config: %s (%v), want 3 pending over the log and 0 over the table", out, err)
	}
	for _, c := range []struct{ args []string }{
		{append([]string{"status", "--storage", "sideways"}, db...)},
		{[]string{"status", "--storage", "log", "--database", "sqlite:" + filepath.Join(t.TempDir(), "x.db"), "--json"}},
	} {
		_, stderr, code := runSplit(t, c.args...)
		var e map[string]any
		if err := json.Unmarshal([]byte(stderr), &e); err != nil || code != 2 || !strings.Contains(e["error"].(string), "--storage") {
			t.Errorf("%v: exit %d, stderr %q", c.args, code, stderr)
		}
	}
}

// postbox storage shows what the database says its relays read and what
// each live relay reads; "postbox storage log" is refused, naming the
// relay, while a relay over the table runs, and goes through once it has
// stopped; a relay over the table is then refused at its start.
func TestCLIStorageSwitch(t *testing.T) {
	ctx := context.Background()
	db, c := pgTarget(t)
	db = append(db, "--json")
	type state struct {
		Storage string `json:"storage"`
		Relays  []struct {
			ID, Storage string
		} `json:"relays"`
	}
	read := func(args ...string) state {
		t.Helper()
		var st state
		if out := must(t, append(args, db...)...); json.Unmarshal([]byte(out), &st) != nil {
			t.Fatalf("postbox %v: %s", args, out)
		}
		return st
	}
	if st := read("storage"); st.Storage != "table" || len(st.Relays) != 0 {
		t.Fatalf("a new database: %+v", st)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var st state
	for deadline := time.Now().Add(10 * time.Second); len(st.Relays) == 0; time.Sleep(20 * time.Millisecond) {
		if st = read("storage"); time.Now().After(deadline) {
			t.Fatal("the relay never registered")
		}
	}
	if st.Relays[0].Storage != "table" {
		t.Fatalf("the relay registered %+v", st.Relays)
	}
	_, stderr, code := runSplit(t, append([]string{"storage", "log"}, db...)...)
	if code != 1 || !strings.Contains(stderr, st.Relays[0].ID) || !strings.Contains(stderr, "refused by the database's storage setting") {
		t.Fatalf("storage log beside a relay over the table: exit %d, %s", code, stderr)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if st := read("storage", "log"); st.Storage != "log" {
		t.Fatalf("storage log with no relay: %+v", st)
	}
	if err := c.Start(ctx); err == nil {
		_ = c.Stop(ctx)
		t.Fatal("a relay over the table started on a database that says log")
	}
	if st := read("storage", "table"); st.Storage != "table" {
		t.Fatalf("storage table: %+v", st)
	}
	for _, args := range [][]string{
		append([]string{"storage", "sideways"}, db...),
		{"storage", "--database", "sqlite:" + filepath.Join(t.TempDir(), "x.db"), "--json"},
	} {
		if _, stderr, code := runSplit(t, args...); code != 2 {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr)
		}
	}
}

package relayd_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/cmd/postbox/internal/relayd"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxpgx"
)

// chromium is Debian's headless-capable Chromium, which .ci/run installs.
const chromium = "/usr/bin/chromium"

// docsScreenshots is where the pictures of each view the docs show
// (docs/dashboard.md) live: the browser test saves there when
// POSTBOX_SCREENSHOTS=docs, and into its temporary directory otherwise, so
// that an ordinary run leaves the repository as it was.
var docsScreenshots = filepath.Join("..", "..", "..", "..", "docs", "dashboard")

const (
	browserAdminToken = "browser-admin-token-0123456789"
	browserReadToken  = "browser-read-token-0123456789"
)

// TestDashboardInChromium drives the dashboard of a running `postbox
// relay` daemon, with tokens, through a real browser: sign-in, a dead
// message requeued and another deleted after their confirmations, a
// consumer's dead message requeued, a replay after its dry run, and a
// read token refused an action. It checks the database after each, and
// saves each view (to docs/dashboard/*.png with POSTBOX_SCREENSHOTS=docs).
func TestDashboardInChromium(t *testing.T) {
	if _, err := os.Stat(chromium); err != nil {
		t.Skipf("the browser tests need Chromium at %s (apt-get install -y chromium): %v", chromium, err)
	}
	ctx := context.Background()
	pool, prefix := testdb.Migrated(t)
	_, consumerPrefix := testdb.Migrated(t)
	_, natsURL := embeddedNATS(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	// Before the daemon starts: three dead messages, one published
	// message to replay, one consumer's dead message.
	reject := postbox.PublisherFunc(func(_ context.Context, env *postbox.Envelope) error {
		if bytes.HasPrefix(env.Payload, []byte("poison")) {
			return postbox.NewMessageError(errors.New("rejected by the broker: schema mismatch"))
		}
		return nil
	})
	drv := postboxpgx.New(pool)
	seed, err := postbox.NewClient(drv, &postbox.Config{Prefix: prefix, Publisher: reject, MaxAttempts: 1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []postbox.Message{
		{ID: postbox.NewID(), Topic: "orders.created", Key: "order-1", Payload: []byte(`poison {"order": 1}`), Headers: map[string]string{"trace-id": "4bf92f3577b34da6"}},
		{ID: postbox.NewID(), Topic: "orders.created", Key: "order-2", Payload: []byte("poison\xff\xfe binary")},
		{ID: postbox.NewID(), Topic: "orders.refunded", Key: "order-3", Payload: []byte(`poison {"order": 3}`)},
		{ID: postbox.NewID(), Topic: "orders.paid", Key: "order-4", Payload: []byte(`{"order": 4}`)},
	}
	if err := seed.Write(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	if _, err := seed.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	service, err := postbox.NewClient(drv, &postbox.Config{Prefix: consumerPrefix, MaxAttempts: 1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if v := service.Inbox().Handle(ctx, "billing", &postbox.Delivery{ID: "m-1", Topic: "orders.paid", Key: "order-4", Payload: []byte(`{"order": 4}`)},
		func(context.Context, pgx.Tx, *postbox.Delivery) error {
			return errors.New("billing: card declined for order 4")
		}); v.Action != postbox.DeadLettered {
		t.Fatal(v)
	}

	cfg, err := relayd.Parse([]byte(`
databases: [{url: "`+testdb.PostgresURL()+`", prefix: `+prefix+`, consumer_prefix: `+consumerPrefix+`}]
nats:
  subject_prefix: "svc."
  streams: [{name: SVC, subjects: ["svc.>"]}]
relay: {lease: 3s, poll_interval: 50ms}
admin:
  listen: "127.0.0.1:0"
  tokens:
    - {name: ops-oncall, value: `+browserAdminToken+`, scope: admin}
    - {name: grafana, value: `+browserReadToken+`, scope: read}
`), env(map[string]string{"POSTBOX_NATS_URL": natsURL}))
	if err != nil {
		t.Fatal(err)
	}
	d, err := relayd.Start(ctx, cfg, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = d.Stop(ctx) }()
	base := "http://" + d.Addr()
	admin := seed.Admin()

	screenshots := t.TempDir()
	if os.Getenv("POSTBOX_SCREENSHOTS") == "docs" {
		screenshots = docsScreenshots
	}
	if err := os.MkdirAll(screenshots, 0o750); err != nil {
		t.Fatal(err)
	}
	browser := newChromium(t)
	shot := func(t *testing.T, name string) {
		t.Helper()
		png, err := chromedp.Run(browser, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(screenshots, name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := func(t *testing.T, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		c, cancel := context.WithTimeout(browser, 60*time.Second)
		defer cancel()
		if err := chromedp.Do(c, actions...); err != nil {
			t.Fatal(err)
		}
	}
	read := func(t *testing.T, sel string) string {
		t.Helper()
		c, cancel := context.WithTimeout(browser, 60*time.Second)
		defer cancel()
		s, err := chromedp.Run(c, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	isDead := func(t *testing.T, id string) bool {
		t.Helper()
		_, err := admin.GetDead(ctx, id)
		if err != nil && !errors.Is(err, postboxdriver.ErrNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}
	var text string

	t.Run("SignIn", func(t *testing.T) {
		run(t, chromedp.Navigate(base+"/dead"), chromedp.WaitVisible(chromedp.CSS("#token")))
		shot(t, "signin")
		run(t, chromedp.SendKeys(chromedp.CSS("#token"), browserAdminToken), chromedp.Submit(chromedp.CSS("#token")),
			chromedp.WaitVisible(chromedp.CSS(`input[name="ids"]`)), chromedp.Navigate(base+"/"),
			chromedp.WaitVisible(chromedp.CSS("#overview")))
		text = read(t, ".who")
		if !strings.Contains(text, "ops-oncall") {
			t.Fatalf("signed in as %q", text)
		}
	})

	t.Run("RequeueDead", func(t *testing.T) {
		id := msgs[0].ID
		run(t, chromedp.Navigate(base+"/dead"), chromedp.WaitVisible(chromedp.CSS(`input[name="ids"]`)))
		shot(t, "dead")
		run(t, chromedp.Click(chromedp.CSS(`a[href="/dead/show?id=`+id+`"]`)), chromedp.WaitVisible(chromedp.CSS("pre.payload")))
		shot(t, "dead-message")
		run(t, chromedp.Click(chromedp.CSS(`button[value="requeue"]`)), chromedp.WaitVisible(chromedp.CSS("button.act")))
		text = read(t, "p.confirm")
		if !strings.Contains(text, "Requeue 1 dead message?") {
			t.Fatalf("confirmation says %q", text)
		}
		shot(t, "dead-confirm")
		if !isDead(t, id) {
			t.Fatal("requeued before the confirmation")
		}
		run(t, chromedp.Click(chromedp.CSS("button.act")), chromedp.WaitVisible(chromedp.CSS("p.done")))
		text = read(t, "p.done")
		if !strings.Contains(text, "1 dead message requeued") || isDead(t, id) {
			t.Fatalf("after the requeue: %q, still dead %v", text, isDead(t, id))
		}
	})

	t.Run("DeleteDead", func(t *testing.T) {
		id := msgs[1].ID
		run(t, chromedp.Navigate(base+"/dead"), chromedp.WaitVisible(chromedp.CSS(`input[name="ids"]`)),
			chromedp.Click(chromedp.CSS(`input[value="`+id+`"]`)), chromedp.Click(chromedp.CSS(`button[name="action"][value="delete"]`)),
			chromedp.WaitVisible(chromedp.CSS("button.act")))
		text = read(t, "p.confirm")
		if !strings.Contains(text, "Delete 1 dead message?") {
			t.Fatalf("confirmation says %q", text)
		}
		run(t, chromedp.Click(chromedp.CSS("button.act")), chromedp.WaitVisible(chromedp.CSS("p.done")))
		text = read(t, "p.done")
		if !strings.Contains(text, "1 dead message deleted") || isDead(t, id) {
			t.Fatalf("after the delete: %q", text)
		}
		var pending int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+prefix+`outbox WHERE id = $1`, id).Scan(&pending); err != nil || pending != 0 {
			t.Fatalf("deleted message pending again: %d %v", pending, err)
		}
		if !isDead(t, msgs[2].ID) {
			t.Fatal("the delete took another message")
		}
	})

	t.Run("RequeueConsumerDeadLetter", func(t *testing.T) {
		run(t, chromedp.Navigate(base+"/consumers"), chromedp.WaitVisible(chromedp.CSS(`a[href*="/consumers/confirm?action=requeue"]`)))
		shot(t, "consumers")
		run(t, chromedp.Click(chromedp.CSS(`a[href*="/consumers/confirm?action=requeue"]`)), chromedp.WaitVisible(chromedp.CSS("button.act")),
			chromedp.Click(chromedp.CSS("button.act")), chromedp.WaitVisible(chromedp.CSS("p.done")))
		text = read(t, "p.done")
		if !strings.Contains(text, "Requeue asked for 1 dead message") {
			t.Fatalf("after the requeue: %q", text)
		}
		var requested bool
		if err := pool.QueryRow(ctx, `SELECT requeue_requested_at IS NOT NULL FROM `+consumerPrefix+`consumer_dead WHERE consumer = 'billing' AND message_id = 'm-1'`).
			Scan(&requested); err != nil || !requested {
			t.Fatalf("requeue request recorded: %v %v", requested, err)
		}
	})

	t.Run("ReplayAfterDryRun", func(t *testing.T) {
		run(t, chromedp.Navigate(base+"/replay"), chromedp.WaitVisible(chromedp.CSS("#r-since")),
			chromedp.SendKeys(chromedp.CSS("#r-since"), "1h"), chromedp.SendKeys(chromedp.CSS("#r-topic"), "orders.paid"),
			chromedp.Submit(chromedp.CSS("#r-since")), chromedp.WaitVisible(chromedp.CSS("p.confirm")))
		text = read(t, "p.confirm")
		if !strings.Contains(text, "A dry run selects 1 published message") {
			t.Fatalf("dry run says %q", text)
		}
		shot(t, "replay-dry-run")
		audit, err := admin.Replays(ctx, 10)
		if err != nil || len(audit) != 1 || !audit[0].DryRun || audit[0].Count != 1 || audit[0].Actor != "ops-oncall" {
			t.Fatalf("audit after the dry run: %+v %v", audit, err)
		}
		run(t, chromedp.Click(chromedp.CSS("#mode-new")), chromedp.Click(chromedp.CSS("button.act")),
			chromedp.WaitVisible(chromedp.CSS("p.done")))
		text = read(t, "p.done")
		if !strings.Contains(text, "Replayed 1 message as new messages") {
			t.Fatalf("replay says %q", text)
		}
		audit, err = admin.Replays(ctx, 10)
		if err != nil || len(audit) != 2 || audit[0].DryRun || !audit[0].AsNew || audit[0].Count != 1 || audit[0].Actor != "ops-oncall" {
			t.Fatalf("audit after the replay: %+v %v", audit, err)
		}
		var copies int
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+prefix+`outbox WHERE headers->>'postbox-replay-of' = $1) +
  (SELECT count(*) FROM `+prefix+`published WHERE headers->>'postbox-replay-of' = $1)`, msgs[3].ID).Scan(&copies); err != nil || copies != 1 {
			t.Fatalf("copies of the replayed message: %d %v", copies, err)
		}
		run(t, chromedp.Navigate(base+"/replays"), chromedp.WaitVisible(chromedp.CSS("table")))
		shot(t, "replays")
		// The overview again, its charts a few samples longer; its script
		// reads the status on its own and redraws.
		run(t, chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS("#overview")))
		before := read(t, "#sum-pending")
		if kept := read(t, "#fig-published"); strings.HasPrefix(kept, "≈") {
			t.Fatalf("a history of a few rows shown as an estimate: %q", kept)
		}
		// The history grown past the exact count and analyzed, autovacuum
		// off so that its statistics are those taken here: the script's
		// next read shows its size as PostgreSQL's estimate.
		for _, q := range []string{
			`ALTER TABLE {p}published SET (autovacuum_enabled = false)`,
			`INSERT INTO {p}published (seq, id, topic, key, payload, headers, partition, created_at, attempts, published_at)
SELECT -g, gen_random_uuid(), 'orders.archived', 'k', '\x00', '{}', 0, now() - interval '1 day', 1, now() - interval '1 day' FROM generate_series(1, 10000) g`,
			`ANALYZE {p}published`,
			`INSERT INTO {p}published (seq, id, topic, key, payload, headers, partition, created_at, attempts, published_at)
SELECT -g, gen_random_uuid(), 'orders.archived', 'k', '\x00', '{}', 0, now() - interval '1 day', 1, now() - interval '1 day' FROM generate_series(10001, 30000) g`,
		} {
			if _, err := pool.Exec(ctx, strings.ReplaceAll(q, "{p}", prefix)); err != nil {
				t.Fatal(err)
			}
		}
		run(t, chromedp.Poll[chromedp.Void](`document.getElementById("sum-pending").textContent !== `+strconv.Quote(before), chromedp.WithPollingMutation()),
			chromedp.Poll[chromedp.Void](`document.getElementById("fig-published").textContent.startsWith("≈ ")`, chromedp.WithPollingMutation()))
		if relays := read(t, "#relays-body"); !strings.Contains(relays, "0-63") {
			t.Fatalf("relays after the refresh: %q", relays)
		}
		shot(t, "overview")
	})

	t.Run("ReadScopeCannotAct", func(t *testing.T) {
		run(t, chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS("#overview")),
			chromedp.Click(chromedp.CSS(`form[action="/signout"] button`)), chromedp.WaitVisible(chromedp.CSS("#token")),
			chromedp.SendKeys(chromedp.CSS("#token"), browserReadToken), chromedp.Submit(chromedp.CSS("#token")),
			chromedp.WaitVisible(chromedp.CSS("#overview")),
			chromedp.Navigate(base+"/dead/confirm?action=delete&ids="+msgs[2].ID), chromedp.WaitVisible(chromedp.CSS(".problem")))
		text = read(t, ".problem")
		if !strings.Contains(text, "grafana has the read scope, which can see but not act") || !isDead(t, msgs[2].ID) {
			t.Fatalf("read scope: %q", text)
		}
		shot(t, "read-scope-refused")
	})
}

// newChromium starts a headless Chromium with a fresh profile and no
// network of its own, and returns a tab's context; the test's end closes
// the browser.
func newChromium(t *testing.T) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.WindowSize(1280, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		_ = chromedp.Cancel(ctx)
		cancel()
		cancelAlloc()
	})
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s: %v", chromium, err)
	}
	return ctx
}

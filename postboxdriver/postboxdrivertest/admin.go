package postboxdrivertest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxdriver"
)

func (s *suite[TTx]) runAdmin(t *testing.T) {
	t.Run("StatusByTopic", s.adminStatus)
	t.Run("DeadMessages", s.adminDead)
	t.Run("PruneKeepsPendingAndDead", s.adminPrune)
	t.Run("Replay", s.adminReplay)
	t.Run("ReplayAsNewAndPreview", s.adminReplayAsNew)
}

type adminEnv[TTx any] struct {
	*env[TTx]
	admin *postbox.Admin
	rec   *recorder
	c     *postbox.Client[TTx]
}

// adminSetup returns tables holding published, pending and dead messages:
// the publisher rejects payload "poison" (one attempt each), and the
// client has drained what it could.
func (s *suite[TTx]) adminSetup(t *testing.T, msgs ...postbox.Message) *adminEnv[TTx] {
	t.Helper()
	e := s.setup(t)
	rec := &recorder{fail: func(env *postbox.Envelope) error {
		if string(env.Payload) == "poison" {
			return postbox.NewMessageError(errors.New("rejected"))
		}
		return nil
	}}
	c := e.client(t, rec, postbox.Config{MaxAttempts: 1})
	if len(msgs) > 0 {
		if err := c.Write(context.Background(), msgs...); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	a := e.client(t, nil, postbox.Config{PruneBatch: 3}).Admin()
	return &adminEnv[TTx]{env: e, admin: a, rec: rec, c: c}
}

func (s *suite[TTx]) adminStatus(t *testing.T) {
	ae := s.adminSetup(t,
		postbox.Message{Topic: "orders.created", Payload: []byte("1")},
		postbox.Message{Topic: "orders.created", Payload: []byte("poison")},
		postbox.Message{Topic: "orders.paid", Payload: []byte("2")},
	)
	ctx := context.Background()
	if err := ae.c.Write(ctx, postbox.Message{Topic: "orders.paid"}, postbox.Message{Topic: "orders.shipped"}); err != nil {
		t.Fatal(err)
	}
	st, err := ae.admin.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pending != 2 || st.Dead != 1 || st.Published != 2 {
		t.Fatalf("status %+v", st.Stats)
	}
	// No relay runs (Drain holds no heartbeat): every partition is
	// unowned, or held by Drain's leases until they end.
	if p := st.Partitions; p.Total != 64 || p.Unowned < 0 || p.Unowned > p.Total || p.Relays != 0 || len(p.Leases) != 64 || p.Now.IsZero() {
		t.Fatalf("partitions %+v", p)
	}
	for i, l := range st.Partitions.Leases {
		if l.Partition != i || l.Owner == "" && !l.Expired {
			t.Fatalf("lease %d: %+v", i, l)
		}
	}
	got := map[string]string{}
	for _, ts := range st.Topics {
		got[ts.Topic] = fmt.Sprintf("pending=%d dead=%d recent=%d", ts.Pending, ts.Dead, ts.PublishedLastMinute)
		if ts.OldestPendingAge < 0 || ts.OldestPendingAge > time.Minute || ts.Pending == 0 && ts.OldestPendingAge != 0 {
			t.Errorf("topic %s: oldest pending age %s", ts.Topic, ts.OldestPendingAge)
		}
		if ts.PublishLagLastMinute < 0 || ts.PublishLagLastMinute > time.Minute || ts.PublishedLastMinute == 0 && ts.PublishLagLastMinute != 0 {
			t.Errorf("topic %s: publish lag %s", ts.Topic, ts.PublishLagLastMinute)
		}
	}
	want := map[string]string{
		"orders.created": "pending=0 dead=1 recent=1",
		"orders.paid":    "pending=1 dead=0 recent=1",
		"orders.shipped": "pending=1 dead=0 recent=0",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("topics\n got %v\nwant %v", got, want)
	}
}

func (s *suite[TTx]) adminDead(t *testing.T) {
	var msgs []postbox.Message
	for i := range 6 {
		topic := "t.a"
		if i%2 == 1 {
			topic = "t.b"
		}
		msgs = append(msgs, postbox.Message{Topic: topic, Key: fmt.Sprintf("k%d", i%3), Payload: []byte("poison")})
	}
	ae := s.adminSetup(t, msgs...)
	ctx := context.Background()
	list := func(f postbox.DeadFilter) []postbox.DeadMessage {
		t.Helper()
		out, err := ae.admin.ListDead(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	all := list(postbox.DeadFilter{})
	if len(all) != 6 {
		t.Fatalf("dead = %d, want 6", len(all))
	}
	if n := len(list(postbox.DeadFilter{Topic: "t.b"})); n != 3 {
		t.Fatalf("t.b = %d", n)
	}
	if n := len(list(postbox.DeadFilter{Key: "k0"})); n != 2 {
		t.Fatalf("k0 = %d", n)
	}
	if n := len(list(postbox.DeadFilter{IDs: []string{all[0].ID, all[1].ID}})); n != 2 {
		t.Fatalf("by ids = %d", n)
	}
	if n := len(list(postbox.DeadFilter{Until: time.Now().Add(-time.Hour)})); n != 0 {
		t.Fatalf("until an hour ago = %d", n)
	}
	d, err := ae.admin.GetDead(ctx, all[0].ID)
	if err != nil || d.Attempts != 1 || d.Error != "rejected" || string(d.Payload) != "poison" || d.DeadAt.IsZero() {
		t.Fatalf("show = %+v, %v", d, err)
	}
	if _, err := ae.admin.GetDead(ctx, postbox.NewID()); !errors.Is(err, postboxdriver.ErrNotFound) {
		t.Fatalf("show missing: %v", err)
	}
	var ve *postbox.ValidationError
	if _, err := ae.admin.ListDead(ctx, postbox.DeadFilter{IDs: []string{"x'; DROP TABLE y; --"}}); !errors.As(err, &ve) {
		t.Fatalf("bad id: %v", err)
	}
	for _, f := range []postbox.DeadFilter{
		{Key: "\xff"}, {Key: "a\x00b"}, {Since: time.Date(-5000, 1, 1, 0, 0, 0, 0, time.UTC)}, {Until: time.Date(12000, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		if _, err := ae.admin.ListDead(ctx, f); !errors.As(err, &ve) {
			t.Fatalf("filter %+v: %v, want *ValidationError", f, err)
		}
		if _, err := ae.admin.DeleteDead(ctx, postbox.DeadSelection{DeadFilter: f}); !errors.As(err, &ve) {
			t.Fatalf("delete %+v: %v, want *ValidationError", f, err)
		}
	}
	if _, err := ae.admin.Replay(ctx, postbox.ReplayRequest{Since: time.Now().Add(-time.Hour), Until: time.Now(), Key: "\xff", Actor: "ops"}); !errors.As(err, &ve) {
		t.Fatalf("replay with a bad key: %v", err)
	}
	if _, err := ae.admin.DeleteDead(ctx, postbox.DeadSelection{}); !errors.Is(err, postbox.ErrEmptySelection) {
		t.Fatalf("empty delete: %v", err)
	}
	if _, err := ae.admin.RequeueDead(ctx, postbox.DeadSelection{}); !errors.Is(err, postbox.ErrEmptySelection) {
		t.Fatalf("empty requeue: %v", err)
	}

	// Requeue one by id: it goes back with its seq and no attempts, and
	// is published (the publisher takes it now).
	n, err := ae.admin.RequeueDead(ctx, postbox.DeadSelection{DeadFilter: postbox.DeadFilter{IDs: []string{all[0].ID}}})
	if err != nil || n != 1 {
		t.Fatalf("requeue = %d, %v", n, err)
	}
	recs := fetchAll(t, ae.store, "inspector")
	if len(recs) != 1 || recs[0].ID != all[0].ID || recs[0].Seq != all[0].Seq || recs[0].Attempts != 0 {
		t.Fatalf("requeued row = %+v", recs)
	}
	ae.rec.fail = nil
	if res, err := ae.c.Drain(ctx); err != nil || res.Published != 1 {
		t.Fatalf("drain after requeue = %+v, %v", res, err)
	}
	// Delete by topic (the other t.b messages: the newest, requeued above,
	// was t.b), then requeue the rest with All.
	if n, err := ae.admin.DeleteDead(ctx, postbox.DeadSelection{DeadFilter: postbox.DeadFilter{Topic: all[0].Topic}}); err != nil || n != 2 {
		t.Fatalf("delete %s = %d, %v", all[0].Topic, n, err)
	}
	if n, err := ae.admin.RequeueDead(ctx, postbox.DeadSelection{All: true}); err != nil || n != 3 {
		t.Fatalf("requeue all = %d, %v", n, err)
	}
	if st := ae.stats(t); st.Dead != 0 || st.Pending != 3 {
		t.Fatalf("after: %+v", st)
	}
}

func (s *suite[TTx]) adminPrune(t *testing.T) {
	var msgs []postbox.Message
	for i := range 10 {
		msgs = append(msgs, postbox.Message{Topic: "t.p", Payload: []byte(fmt.Sprint(i))})
	}
	msgs = append(msgs, postbox.Message{Topic: "t.p", Payload: []byte("poison")})
	ae := s.adminSetup(t, msgs...)
	ctx := context.Background()
	if err := ae.c.Write(ctx, postbox.Message{Topic: "t.pending"}); err != nil {
		t.Fatal(err)
	}
	if n, err := ae.admin.Prune(ctx, nil); err != nil || n != 0 {
		t.Fatalf("prune of fresh history = %d, %v", n, err)
	}
	s.h.Backdate(t, ae.d, ae.prefix, "published", "published_at", 8*24*time.Hour)
	s.h.Backdate(t, ae.d, ae.prefix, "dead", "dead_at", 80*24*time.Hour)
	s.h.Backdate(t, ae.d, ae.prefix, "outbox", "created_at", 80*24*time.Hour)
	n, err := ae.admin.Prune(ctx, nil)
	if err != nil || n != 10 {
		t.Fatalf("prune = %d, %v; want the 10 published, in batches of 3", n, err)
	}
	if st := ae.stats(t); st.Published != 0 || st.Pending != 1 || st.Dead != 1 {
		t.Fatalf("after prune: %+v; pending and dead must stay", st)
	}
}

func (s *suite[TTx]) adminReplay(t *testing.T) {
	var msgs []postbox.Message
	for i := range 6 {
		topic := "t.x"
		if i >= 4 {
			topic = "t.y"
		}
		msgs = append(msgs, postbox.Message{Topic: topic, Key: "k", Payload: []byte(fmt.Sprint(i))})
	}
	ae := s.adminSetup(t, msgs...)
	ctx := context.Background()
	first := ae.rec.snapshot()
	since, until := time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	var ve *postbox.ValidationError
	if _, err := ae.admin.Replay(ctx, postbox.ReplayRequest{Since: since, Until: until}); !errors.As(err, &ve) || ve.Field != "actor" {
		t.Fatalf("replay without actor: %v", err)
	}
	if _, err := ae.admin.Replay(ctx, postbox.ReplayRequest{Since: until, Until: since, Actor: "ops"}); !errors.As(err, &ve) {
		t.Fatalf("reversed window: %v", err)
	}
	if _, err := ae.admin.Replay(ctx, postbox.ReplayRequest{Since: time.Now().Add(-8 * 24 * time.Hour), Until: until, Actor: "ops"}); !errors.Is(err, postboxdriver.ErrBeyondHorizon) {
		t.Fatalf("replay past the horizon: %v", err)
	}
	n, err := ae.admin.Replay(ctx, postbox.ReplayRequest{Since: since, Until: until, Topic: "t.x", DryRun: true, Actor: "ops"})
	if err != nil || n != 4 {
		t.Fatalf("dry run = %d, %v", n, err)
	}
	if st := ae.stats(t); st.Pending != 0 {
		t.Fatalf("a dry run staged %d rows", st.Pending)
	}
	n, err = ae.admin.Replay(ctx, postbox.ReplayRequest{Since: since, Until: until, Topic: "t.x", Actor: "ops"})
	if err != nil || n != 4 {
		t.Fatalf("replay = %d, %v", n, err)
	}
	// Staged again, the same rows are not staged twice.
	if n, err := ae.admin.Replay(ctx, postbox.ReplayRequest{Since: since, Until: until, Actor: "ops"}); err != nil || n != 2 {
		t.Fatalf("second replay = %d, %v; want only the 2 t.y rows", n, err)
	}
	if res, err := ae.c.Drain(ctx); err != nil || res.Published != 6 {
		t.Fatalf("drain = %+v, %v", res, err)
	}
	again := ae.rec.snapshot()[len(first):]
	var order []string
	for i, env := range again {
		order = append(order, string(env.Payload))
		if i < 4 && env.ID != first[i].ID {
			t.Fatalf("replayed %s under id %s, first sent as %s", env.Payload, env.ID, first[i].ID)
		}
	}
	if fmt.Sprint(order) != "[0 1 2 3 4 5]" {
		t.Fatalf("replayed in order %v", order)
	}
	audit, err := ae.admin.Replays(ctx, 10)
	if err != nil || len(audit) != 3 {
		t.Fatalf("audit = %+v, %v", audit, err)
	}
	if a := audit[2]; a.Actor != "ops" || !a.DryRun || a.Count != 4 || a.Topic != "t.x" || a.Since.Sub(since).Abs() >= time.Millisecond {
		t.Fatalf("oldest audit entry = %+v", a)
	}
	if audit[0].Count != 2 || audit[0].DryRun {
		t.Fatalf("newest audit entry = %+v", audit[0])
	}
}

// A preview counts per topic what a replay would select and how many of
// those were published within a broker's duplicate window; a replay as
// new messages sends copies with fresh ids, the original id and the
// audit entry in headers, in order, and keeps the history.
func (s *suite[TTx]) adminReplayAsNew(t *testing.T) {
	msgs := []postbox.Message{
		{Topic: "t.x", Key: "k", Payload: []byte("0"), Headers: map[string]string{"x-h": "v"}},
		{Topic: "t.x", Key: "k", Payload: []byte("1")},
		{Topic: "t.y", Payload: []byte("2")},
	}
	ae := s.adminSetup(t, msgs...)
	ctx := context.Background()
	first := ae.rec.snapshot()
	since, until := time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	window := func(_ context.Context, topic string) (time.Duration, string, error) {
		if topic == "t.x" {
			return time.Hour, "stream X", nil
		}
		return 0, "", nil
	}
	p, err := ae.admin.ReplayPreview(ctx, postbox.ReplayRequest{Since: since, Until: until}, window)
	if err != nil || p.Count != 3 || p.Dropped() != 2 || len(p.Topics) != 2 ||
		p.Topics[0] != (postbox.ReplayTopic{Topic: "t.x", Count: 2, Window: time.Hour, Where: "stream X", Dropped: 2}) ||
		p.Topics[1] != (postbox.ReplayTopic{Topic: "t.y", Count: 1}) {
		t.Fatalf("preview = %+v, %v", p, err)
	}
	short := func(context.Context, string) (time.Duration, string, error) { return time.Nanosecond, "gone", nil }
	if p, err := ae.admin.ReplayPreview(ctx, postbox.ReplayRequest{Since: since, Until: until, Topic: "t.x"}, short); err != nil || p.Count != 2 || p.Dropped() != 0 {
		t.Fatalf("preview with a window that has passed = %+v, %v", p, err)
	}
	// Published longer ago than a window lasts, none would be dropped.
	time.Sleep(300 * time.Millisecond)
	past := func(context.Context, string) (time.Duration, string, error) {
		return 100 * time.Millisecond, "short", nil
	}
	if p, err := ae.admin.ReplayPreview(ctx, postbox.ReplayRequest{Since: since, Until: until, Topic: "t.x"}, past); err != nil || p.Count != 2 || p.Dropped() != 0 {
		t.Fatalf("preview with a window shorter than the time since the publish = %+v, %v", p, err)
	}
	if audit, err := ae.admin.Replays(ctx, 10); err != nil || len(audit) != 0 {
		t.Fatalf("a preview was audited: %+v, %v", audit, err)
	}
	if n, err := ae.admin.Replay(ctx, postbox.ReplayRequest{Since: since, Until: until, AsNew: true, DryRun: true, Actor: "ops"}); err != nil || n != 3 {
		t.Fatalf("dry run as new = %d, %v", n, err)
	}
	// As new, also past the retention horizon: the copies are new messages.
	n, err := ae.admin.Replay(ctx, postbox.ReplayRequest{Since: time.Now().Add(-30 * 24 * time.Hour), Until: until, AsNew: true, Actor: "ops"})
	if err != nil || n != 3 {
		t.Fatalf("replay as new = %d, %v", n, err)
	}
	if st := ae.stats(t); st.Pending != 3 || st.Published != 3 {
		t.Fatalf("after the replay as new: %+v (the history keeps the originals)", st)
	}
	if res, err := ae.c.Drain(ctx); err != nil || res.Published != 3 {
		t.Fatalf("drain = %+v, %v", res, err)
	}
	audit, err := ae.admin.Replays(ctx, 10)
	if err != nil || len(audit) != 2 || !audit[0].AsNew || audit[0].DryRun || audit[0].Count != 3 || !audit[1].AsNew || !audit[1].DryRun {
		t.Fatalf("audit = %+v, %v", audit, err)
	}
	byID := map[string]*postbox.Envelope{}
	for _, env := range first {
		byID[env.ID] = env
	}
	var keyed []string
	for i, env := range ae.rec.snapshot()[len(first):] {
		orig := byID[env.Headers[postbox.HeaderReplayOf]]
		if orig == nil || env.ID == orig.ID || env.Topic != orig.Topic || env.Key != orig.Key || string(env.Payload) != string(orig.Payload) {
			t.Fatalf("copy %d: %+v of %+v", i, env, orig)
		}
		if env.Headers[postbox.HeaderReplay] != fmt.Sprint(audit[0].ID) {
			t.Fatalf("copy %d headers %v; audit %d", i, env.Headers, audit[0].ID)
		}
		if string(env.Payload) == "0" && env.Headers["x-h"] != "v" {
			t.Fatalf("copy lost the original's headers: %v", env.Headers)
		}
		if env.Key == "k" {
			keyed = append(keyed, string(env.Payload))
		}
	}
	if fmt.Sprint(keyed) != "[0 1]" {
		t.Fatalf("copies of key k sent in order %v", keyed)
	}
}

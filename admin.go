package postbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/postbox-go/postbox/internal/printable"
	"github.com/postbox-go/postbox/postboxdriver"
)

// Types shared with the driver seam.
type (
	// DeadMessage is a message postbox gave up on: on the outbox side
	// (Admin), one the relay could not publish within its attempt budget;
	// on the consumer side (Inbox), one a consumer's handler could not
	// apply, with Consumer set.
	DeadMessage = postboxdriver.DeadMessage
	// DeadFilter selects dead messages, on either side.
	DeadFilter = postboxdriver.DeadFilter
	// TopicStats is the state of one topic.
	TopicStats = postboxdriver.TopicStats
	// ReplayAudit is one recorded replay.
	ReplayAudit = postboxdriver.ReplayAudit
	// PartitionStats is the state of the partitions' leases.
	PartitionStats = postboxdriver.PartitionStats
	// ConsumerDeadStat counts one consumer's dead messages of one topic.
	ConsumerDeadStat = postboxdriver.ConsumerDeadStat
)

// ErrEmptySelection is returned when a bulk change (requeue, delete) has
// no filter at all and All was not set.
var ErrEmptySelection = errors.New("postbox: no messages selected: give ids or a filter, or set All")

// Admin holds the operator's operations on the outbox: status, dead
// messages, retention and replay. The CLI and the admin HTTP API are built
// on it; Client.Admin returns one.
type Admin struct {
	ex  postboxdriver.Executor
	cfg *Config
}

// Status is the state of the outbox, overall and per topic.
type Status struct {
	postboxdriver.Stats
	Topics []TopicStats
	// HeldSnapshot is the oldest transaction of another session that has
	// held a snapshot for at least HeldSnapshotMinAge, and so keeps vacuum
	// from removing the outbox's dead rows: nil when there is none (the
	// relays' own statements are far shorter), and on SQLite. On
	// PostgreSQL, without pg_read_all_stats only the same role's sessions
	// are seen.
	HeldSnapshot *HeldSnapshot
	// Partitions is the state of the partitions' leases: how many no
	// relay holds (all of them while no relay runs), and the live relays.
	Partitions PartitionStats
}

// HeldSnapshotMinAge is how long a snapshot must have been held for
// Admin.Status to report it.
const HeldSnapshotMinAge = time.Second

// HeldSnapshot is a transaction that holds the database's xmin horizon
// back (PostgreSQL): its age on the database clock, its backend (for
// pg_stat_activity or pg_terminate_backend) and its state ("active",
// "idle in transaction", ...). While it lasts, the rows the relay moved
// out of the outbox stay behind as dead tuples, and every read walks past
// them.
type HeldSnapshot = postboxdriver.Snapshot

// Status reports the outbox's state.
func (a *Admin) Status(ctx context.Context) (Status, error) {
	st, err := a.ex.Stats(ctx)
	if err != nil {
		return Status{}, err
	}
	topics, err := a.ex.TopicStats(ctx)
	if err != nil {
		return Status{}, err
	}
	out := Status{Stats: st, Topics: topics}
	if out.Partitions, err = a.ex.PartitionStats(ctx); err != nil {
		return Status{}, err
	}
	s, found, err := a.ex.OldestSnapshot(ctx)
	if err != nil {
		return Status{}, err
	}
	if found && s.Age >= HeldSnapshotMinAge {
		out.HeldSnapshot = &s
	}
	return out, nil
}

// validateKey checks a message's key, or a key given as a filter.
func validateKey(field, key string) error {
	if len(key) > MaxKeyBytes {
		return invalid(field, key, "is %d bytes, over the limit of %d", len(key), MaxKeyBytes)
	}
	if !utf8.ValidString(key) || strings.IndexByte(key, 0) >= 0 {
		return invalid(field, key, "is not valid UTF-8 text")
	}
	return nil
}

// validateTime checks a time given as a filter: databases keep years 0001
// to 9999 at most.
func validateTime(field string, t time.Time) error {
	if !t.IsZero() && (t.Year() < 1 || t.Year() > 9999) {
		return invalid(field, t.Format(time.RFC3339), "is outside the years 0001-9999")
	}
	return nil
}

// validateDeadFilter checks a filter of the outbox's dead messages, or,
// with consumers, of consumers' dead messages: their ids are whatever the
// broker delivered, not always UUIDs.
func validateDeadFilter(f *DeadFilter, consumers bool) error {
	switch {
	case !consumers && f.Consumer != "":
		return invalid("consumer", f.Consumer, "selects consumers' dead messages, not the outbox's")
	case f.Consumer != "":
		if err := validateConsumer(f.Consumer, "-"); err != nil {
			return err
		}
	}
	for i, id := range f.IDs {
		field := fmt.Sprintf("ids[%d]", i)
		if consumers {
			if validateConsumer("-", id) != nil {
				return invalid(field, id, "must be printable text of 1 to %d bytes", MaxDeliveryIDBytes)
			}
		} else if u, err := uuid.Parse(id); err != nil || u.String() != id {
			return invalid(field, id, "is not a UUID in canonical lower-case form")
		}
	}
	if f.Topic != "" {
		if err := ValidateTopic(f.Topic); err != nil {
			return err
		}
	}
	if err := validateKey("key", f.Key); err != nil {
		return err
	}
	if err := errors.Join(validateTime("since", f.Since), validateTime("until", f.Until)); err != nil {
		return firstValidation(err)
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return invalid("since", f.Since.Format(time.RFC3339), "must be before until (%s)", f.Until.Format(time.RFC3339))
	}
	if f.Limit < 0 || f.Limit > 10_000 {
		return invalid("limit", f.Limit, "must be between 0 and 10000")
	}
	return nil
}

func emptyFilter(f *DeadFilter) bool {
	return len(f.IDs) == 0 && f.Topic == "" && f.Key == "" && f.Since.IsZero() && f.Until.IsZero()
}

// ListDead lists the outbox's dead messages, newest first.
func (a *Admin) ListDead(ctx context.Context, f DeadFilter) ([]DeadMessage, error) {
	if err := validateDeadFilter(&f, false); err != nil {
		return nil, err
	}
	return a.ex.ListDeadMessages(ctx, f)
}

// GetDead returns one dead message of the outbox, or an error wrapping
// postboxdriver.ErrNotFound.
func (a *Admin) GetDead(ctx context.Context, id string) (DeadMessage, error) {
	if u, err := uuid.Parse(id); err != nil || u.String() != id {
		return DeadMessage{}, invalid("id", id, "is not a UUID in canonical lower-case form")
	}
	return a.ex.GetDeadMessage(ctx, id)
}

// DeadSelection picks dead messages for a bulk change.
type DeadSelection struct {
	DeadFilter
	// All must be set to select every dead message with an empty filter.
	All bool
}

func (s *DeadSelection) check() error {
	if err := validateDeadFilter(&s.DeadFilter, false); err != nil {
		return err
	}
	if emptyFilter(&s.DeadFilter) && !s.All {
		return ErrEmptySelection
	}
	return nil
}

// RequeueDead moves the selected dead messages back to the outbox with
// their attempts reset; they are published next, in their place among
// their key's pending messages.
func (a *Admin) RequeueDead(ctx context.Context, s DeadSelection) (int, error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	return a.ex.RequeueDeadMessages(ctx, s.DeadFilter)
}

// DeleteDead deletes the selected dead messages.
func (a *Admin) DeleteDead(ctx context.Context, s DeadSelection) (int, error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	return a.ex.DeleteDeadMessages(ctx, s.DeadFilter)
}

// Prune deletes published messages older than the retention, in batches,
// until none is left or ctx ends, calling progress (when not nil) with the
// running total after each batch. Pending and dead messages are never
// touched: they live in other tables.
func (a *Admin) Prune(ctx context.Context, progress func(deleted int)) (int, error) {
	if a.cfg.Retention < 0 {
		return 0, nil
	}
	total := 0
	return prune(ctx, 0, a.cfg.PruneBatch, func(ctx context.Context) (int, error) {
		n, err := a.ex.PrunePublished(ctx, a.cfg.Retention, a.cfg.PruneBatch)
		total += n
		if progress != nil && n > 0 {
			progress(total)
		}
		return n, err
	})
}

// ReplayRequest selects published messages to send again.
type ReplayRequest struct {
	// Since and Until bound the messages' creation time: [Since, Until).
	Since, Until time.Time
	// Topic and Key narrow the selection when set.
	Topic, Key string
	// DryRun counts without changing anything (and is audited too).
	DryRun bool
	// AsNew sends copies as new messages, for consumers that must run
	// again: fresh ids (so neither a broker's duplicate window nor an
	// inbox drops them), every header kept, plus HeaderReplayOf (the
	// original id) and HeaderReplay (the audit entry's id). The history
	// keeps the originals. Without it the messages go back under their
	// own ids: consumers whose inbox holds an id run nothing, and a
	// broker drops a copy of a message it saw within its duplicate window
	// (ReplayPreview tells how many).
	AsNew bool
	// Actor names who asked, for the audit. Required.
	Actor string
}

// Headers a replay as new messages adds to each copy.
const (
	HeaderReplayOf = postboxdriver.HeaderReplayOf // "postbox-replay-of": the original message's id
	HeaderReplay   = postboxdriver.HeaderReplay   // "postbox-replay": the replay audit entry's id
)

// ReplayPreview is what a replay under the messages' own ids would do,
// per topic.
type ReplayPreview struct {
	Count  int // messages selected
	Topics []ReplayTopic
}

// Dropped is how many of the selected messages the brokers would drop as
// copies.
func (p *ReplayPreview) Dropped() int {
	n := 0
	for _, t := range p.Topics {
		n += t.Dropped
	}
	return n
}

// ReplayTopic is what a replay would send of one topic.
type ReplayTopic struct {
	Topic string
	Count int // messages selected
	// Window is the duplicate window of the broker the topic goes to
	// (zero when it has none), and Where names it ("JetStream stream
	// ORDERS").
	Window time.Duration
	Where  string
	// Dropped counts the selected messages published within Window: sent
	// again under their own ids, the broker drops them as copies.
	Dropped int
}

// DedupeWindow tells the duplicate window of the broker a topic goes to,
// and names it; zero for a broker without one.
type DedupeWindow func(ctx context.Context, topic string) (window time.Duration, where string, err error)

// ReplayPreview counts, per topic, what r would select (r.DryRun and
// r.AsNew are ignored: the preview is of a replay under the messages' own
// ids) and how many of those the broker would drop as copies because it
// saw them within its duplicate window, which window tells. It changes
// and records nothing. Like Replay, it refuses a window past the
// retention horizon (ErrBeyondHorizon; here on this host's clock, where
// Replay uses the database's).
func (a *Admin) ReplayPreview(ctx context.Context, r ReplayRequest, window DedupeWindow) (ReplayPreview, error) {
	p := r
	p.Actor, p.DryRun, p.AsNew = "preview", true, false
	if err := p.check(); err != nil {
		return ReplayPreview{}, err
	}
	if a.cfg.Retention > 0 && r.Since.Before(time.Now().Add(-a.cfg.Retention)) {
		return ReplayPreview{}, fmt.Errorf("%w: %s is more than the retention (%s) ago", postboxdriver.ErrBeyondHorizon, r.Since.Format(time.RFC3339), a.cfg.Retention)
	}
	params := postboxdriver.ReplayParams{Since: r.Since, Until: r.Until, Topic: r.Topic, Key: r.Key}
	counts, err := a.ex.ReplayCounts(ctx, params, 0)
	if err != nil {
		return ReplayPreview{}, err
	}
	var out ReplayPreview
	for _, c := range counts {
		t := ReplayTopic{Topic: c.Topic, Count: c.Count}
		out.Count += c.Count
		if window != nil {
			if t.Window, t.Where, err = window(ctx, c.Topic); err != nil {
				return ReplayPreview{}, fmt.Errorf("postbox: the duplicate window of %s: %w", c.Topic, err)
			}
		}
		if t.Window > 0 {
			params.Topic = c.Topic
			recent, err := a.ex.ReplayCounts(ctx, params, t.Window)
			if err != nil {
				return ReplayPreview{}, err
			}
			for _, rc := range recent {
				t.Dropped += rc.Recent
			}
		}
		out.Topics = append(out.Topics, t)
	}
	return out, nil
}

// Replay sends published messages again: they go back to the outbox under
// their own ids, in their original order, so consumers whose inbox holds
// them run nothing and the others (a new consumer, one that lost its
// state) process them. A window that starts before the retention horizon
// is refused with an error wrapping postboxdriver.ErrBeyondHorizon: past
// it, inboxes may have forgotten the ids and handlers would run twice.
// With a negative Retention (the history is kept forever) there is no
// horizon. A broker with a duplicate window (JetStream, the Redis
// publisher's dedupe key) drops the copy of a message it saw within it:
// ReplayPreview tells how many, before. With AsNew the messages are sent
// as new ones instead (fresh ids, the original's in HeaderReplayOf), which
// every consumer runs again, and no horizon applies.
// Every request, dry runs included, is recorded (ListReplays).
func (a *Admin) Replay(ctx context.Context, r ReplayRequest) (int, error) {
	if err := r.check(); err != nil {
		return 0, err
	}
	horizon := a.cfg.Retention
	if r.AsNew {
		// The copies are new messages: consumers are meant to run them,
		// so no inbox's memory limits how far back they may go.
		horizon = 0
	}
	n, err := a.ex.Replay(ctx, postboxdriver.ReplayParams{
		Since: r.Since, Until: r.Until, Topic: r.Topic, Key: r.Key, DryRun: r.DryRun, AsNew: r.AsNew, Actor: r.Actor, Horizon: horizon,
	})
	if errors.Is(err, postboxdriver.ErrBeyondHorizon) {
		return 0, fmt.Errorf("%w: %s is more than the retention (%s) ago", err, r.Since.Format(time.RFC3339), a.cfg.Retention)
	}
	return n, err
}

// check validates a replay request.
func (r *ReplayRequest) check() error {
	switch {
	case r.Since.IsZero():
		return invalid("since", "", "is required")
	case r.Until.IsZero():
		return invalid("until", "", "is required")
	case !r.Since.Before(r.Until):
		return invalid("since", r.Since.Format(time.RFC3339), "must be before until (%s)", r.Until.Format(time.RFC3339))
	case r.Actor == "" || len(r.Actor) > 200 || !printable.Text(r.Actor):
		return invalid("actor", r.Actor, "must be printable text of 1 to 200 bytes")
	}
	if err := errors.Join(validateKey("key", r.Key), validateTime("since", r.Since), validateTime("until", r.Until)); err != nil {
		return firstValidation(err)
	}
	if r.Topic != "" {
		if err := ValidateTopic(r.Topic); err != nil {
			return err
		}
	}
	return nil
}

// Replays returns the replay audit, newest first.
func (a *Admin) Replays(ctx context.Context, limit int) ([]ReplayAudit, error) {
	if limit < 0 || limit > 10_000 {
		return nil, invalid("limit", limit, "must be between 0 and 10000")
	}
	return a.ex.ListReplays(ctx, limit)
}

// firstValidation returns the first *ValidationError joined in err.
func firstValidation(err error) error {
	var ve *ValidationError
	if errors.As(err, &ve) {
		return ve
	}
	return err
}

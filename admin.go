package postbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/postbox-go/postbox/postboxdriver"
)

// Operator types, shared with the driver seam.
type (
	// DeadMessage is an outbox message past its attempt budget.
	DeadMessage = postboxdriver.DeadMessage
	// DeadMessageFilter selects dead messages.
	DeadMessageFilter = postboxdriver.DeadMessageFilter
	// TopicStats is the state of one topic.
	TopicStats = postboxdriver.TopicStats
	// ReplayAudit is one recorded replay.
	ReplayAudit = postboxdriver.ReplayAudit
)

// ErrEmptySelection is returned when a bulk change (requeue, delete) has
// no filter at all and All was not set.
var ErrEmptySelection = errors.New("postbox: no messages selected: give ids or a filter, or set All")

// AdminConfig configures an Admin. Zero fields take the defaults.
type AdminConfig struct {
	// Prefix names the tables; default "postbox_".
	Prefix string
	// Retention is how long published messages are kept for replay; the
	// replay horizon. Default 7 days.
	Retention time.Duration
	// PruneBatch bounds each retention delete. Default 1000.
	PruneBatch int
}

// Admin holds the operator's operations: status, dead messages, retention
// and replay. The CLI and the admin HTTP API are built on it.
type Admin struct {
	ex  postboxdriver.Executor
	ad  postboxdriver.Admin
	cfg AdminConfig
}

// NewAdmin returns an Admin over driver.
func NewAdmin[TTx any](driver postboxdriver.Driver[TTx], cfg *AdminConfig) (*Admin, error) {
	var c AdminConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.Retention == 0 {
		c.Retention = DefaultOutboxRetention
	}
	if c.PruneBatch == 0 {
		c.PruneBatch = DefaultPruneBatch
	}
	var ps []*ValidationError
	if err := ValidatePrefix(c.Prefix); err != nil {
		ps = append(ps, err.(*ValidationError)) //nolint:errorlint // always this type
	}
	if c.Retention < time.Hour {
		ps = append(ps, invalid("Retention", c.Retention, "must be at least 1h"))
	}
	if c.PruneBatch < 1 || c.PruneBatch > 100_000 {
		ps = append(ps, invalid("PruneBatch", c.PruneBatch, "must be between 1 and 100000"))
	}
	if len(ps) > 0 {
		return nil, &ConfigError{Problems: ps}
	}
	store, err := driver.Open(c.Prefix)
	if err != nil {
		return nil, err
	}
	ad, ok := store.(postboxdriver.Admin)
	if !ok {
		return nil, fmt.Errorf("postbox: the %s driver (%T) has no operator operations", store.Dialect(), store)
	}
	return &Admin{ex: store, ad: ad, cfg: c}, nil
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
}

// HeldSnapshotMinAge is how long a snapshot must have been held for
// Admin.Status to report it.
const HeldSnapshotMinAge = time.Second

// HeldSnapshot is a transaction that holds the database's xmin horizon
// back (PostgreSQL). While it lasts, the rows the relay moved out of the
// outbox stay behind as dead tuples, and every read walks past them.
type HeldSnapshot struct {
	Age   time.Duration // since the transaction began, on the database clock
	PID   int           // its backend, for pg_stat_activity or pg_terminate_backend
	State string        // pg_stat_activity.state: "active", "idle in transaction", ...
}

// Status reports the outbox's state.
func (a *Admin) Status(ctx context.Context) (Status, error) {
	st, err := a.ex.Stats(ctx)
	if err != nil {
		return Status{}, err
	}
	topics, err := a.ad.TopicStats(ctx)
	if err != nil {
		return Status{}, err
	}
	out := Status{Stats: st, Topics: topics}
	if sc, ok := a.ex.(snapshotChecker); ok {
		age, pid, state, found, err := sc.OldestSnapshot(ctx)
		if err != nil {
			return Status{}, err
		}
		if found && age >= HeldSnapshotMinAge {
			out.HeldSnapshot = &HeldSnapshot{Age: age, PID: pid, State: state}
		}
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

func validateDeadFilter(f *DeadMessageFilter) error {
	for i, id := range f.IDs {
		if u, err := uuid.Parse(id); err != nil || u.String() != id {
			return invalid(fmt.Sprintf("ids[%d]", i), id, "is not a UUID in canonical lower-case form")
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

func emptyFilter(f *DeadMessageFilter) bool {
	return len(f.IDs) == 0 && f.Topic == "" && f.Key == "" && f.Since.IsZero() && f.Until.IsZero()
}

// DeadMessages lists dead messages, newest first.
func (a *Admin) DeadMessages(ctx context.Context, f DeadMessageFilter) ([]DeadMessage, error) {
	if err := validateDeadFilter(&f); err != nil {
		return nil, err
	}
	return a.ad.ListDeadMessages(ctx, f)
}

// DeadMessage returns one dead message, or an error wrapping
// postboxdriver.ErrNotFound.
func (a *Admin) DeadMessage(ctx context.Context, id string) (DeadMessage, error) {
	if u, err := uuid.Parse(id); err != nil || u.String() != id {
		return DeadMessage{}, invalid("id", id, "is not a UUID in canonical lower-case form")
	}
	return a.ad.GetDeadMessage(ctx, id)
}

// DeadSelection picks dead messages for a bulk change.
type DeadSelection struct {
	DeadMessageFilter
	// All must be set to select every dead message with an empty filter.
	All bool
}

func (s *DeadSelection) check() error {
	if err := validateDeadFilter(&s.DeadMessageFilter); err != nil {
		return err
	}
	if emptyFilter(&s.DeadMessageFilter) && !s.All {
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
	return a.ad.RequeueDeadMessages(ctx, s.DeadMessageFilter)
}

// DeleteDead deletes the selected dead messages.
func (a *Admin) DeleteDead(ctx context.Context, s DeadSelection) (int, error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	return a.ad.DeleteDeadMessages(ctx, s.DeadMessageFilter)
}

// Prune deletes published messages older than the retention, in batches,
// until none is left or ctx ends, calling progress (when not nil) with the
// running total after each batch. Pending and dead messages are never
// touched: they live in other tables.
func (a *Admin) Prune(ctx context.Context, progress func(deleted int)) (int, error) {
	total := 0
	for {
		n, err := a.ad.PrunePublished(ctx, a.cfg.Retention, a.cfg.PruneBatch)
		total += n
		if progress != nil && n > 0 {
			progress(total)
		}
		if err != nil || n < a.cfg.PruneBatch {
			return total, err
		}
	}
}

// ReplayRequest selects published messages to send again.
type ReplayRequest struct {
	// Since and Until bound the messages' creation time: [Since, Until).
	Since, Until time.Time
	// Topic and Key narrow the selection when set.
	Topic, Key string
	// DryRun counts without changing anything (and is audited too).
	DryRun bool
	// Actor names who asked, for the audit. Required.
	Actor string
}

// Replay sends published messages again: they go back to the outbox under
// their own ids, in their original order, so consumers whose inbox holds
// them run nothing and the others (a new consumer, one that lost its
// state) process them. A window that starts before the retention horizon
// is refused with an error wrapping postboxdriver.ErrBeyondHorizon: past
// it, inboxes may have forgotten the ids and handlers would run twice.
// Every request, dry runs included, is recorded (ListReplays).
func (a *Admin) Replay(ctx context.Context, r ReplayRequest) (int, error) {
	switch {
	case r.Since.IsZero():
		return 0, invalid("since", "", "is required")
	case r.Until.IsZero():
		return 0, invalid("until", "", "is required")
	case !r.Since.Before(r.Until):
		return 0, invalid("since", r.Since.Format(time.RFC3339), "must be before until (%s)", r.Until.Format(time.RFC3339))
	case r.Actor == "" || len(r.Actor) > 200 || !printable(r.Actor):
		return 0, invalid("actor", r.Actor, "must be printable text of 1 to 200 bytes")
	}
	if err := errors.Join(validateKey("key", r.Key), validateTime("since", r.Since), validateTime("until", r.Until)); err != nil {
		return 0, firstValidation(err)
	}
	if r.Topic != "" {
		if err := ValidateTopic(r.Topic); err != nil {
			return 0, err
		}
	}
	n, err := a.ad.Replay(ctx, postboxdriver.ReplayRequest{
		Since: r.Since, Until: r.Until, Topic: r.Topic, Key: r.Key, DryRun: r.DryRun, Actor: r.Actor, Horizon: a.cfg.Retention,
	})
	if errors.Is(err, postboxdriver.ErrBeyondHorizon) {
		return 0, fmt.Errorf("%w: %s is more than the retention (%s) ago", err, r.Since.Format(time.RFC3339), a.cfg.Retention)
	}
	return n, err
}

// Replays returns the replay audit, newest first.
func (a *Admin) Replays(ctx context.Context, limit int) ([]ReplayAudit, error) {
	if limit < 0 || limit > 10_000 {
		return nil, invalid("limit", limit, "must be between 0 and 10000")
	}
	return a.ad.ListReplays(ctx, limit)
}

// firstValidation returns the first *ValidationError joined in err.
func firstValidation(err error) error {
	var ve *ValidationError
	if errors.As(err, &ve) {
		return ve
	}
	return err
}

package postboxdriver

import (
	"context"
	"errors"
	"time"
)

// ErrBeyondHorizon is returned by Replay for a window that starts before
// the horizon: re-sending messages that old could reach consumers whose
// inbox has already forgotten them, and run their handlers twice.
var ErrBeyondHorizon = errors.New("postbox: replay window starts before the retention horizon")

// Admin holds the operator's operations on the outbox side.
type Admin interface {
	// TopicStats reports, per topic, what is pending, dead and recently
	// published. Topics with nothing pending, dead or published in the last
	// minute are left out.
	TopicStats(ctx context.Context) ([]TopicStats, error)

	// ListDeadMessages lists dead messages matching f, newest first.
	ListDeadMessages(ctx context.Context, f DeadMessageFilter) ([]DeadMessage, error)
	// GetDeadMessage returns one dead message by id, or ErrNotFound.
	GetDeadMessage(ctx context.Context, id string) (DeadMessage, error)
	// RequeueDeadMessages moves the dead messages matching f back to the
	// outbox with their attempts reset and their original seq, so they are
	// published next, in their place among their key's messages.
	RequeueDeadMessages(ctx context.Context, f DeadMessageFilter) (int, error)
	// DeleteDeadMessages deletes the dead messages matching f.
	DeleteDeadMessages(ctx context.Context, f DeadMessageFilter) (int, error)

	// PrunePublished deletes at most limit published rows older than age
	// (by publish time, database clock). Pending and dead rows live in
	// other tables and are never touched.
	PrunePublished(ctx context.Context, age time.Duration, limit int) (int, error)

	// Replay moves published messages created in [Since, Until), narrowed
	// by topic and key, back to the outbox under their own ids, in their
	// original order, and records the request in the replay audit. With
	// DryRun it only counts (and audits the count).
	Replay(ctx context.Context, r ReplayRequest) (int, error)
	// ListReplays returns the replay audit, newest first.
	ListReplays(ctx context.Context, limit int) ([]ReplayAudit, error)
}

// TopicStats is the state of one topic.
type TopicStats struct {
	Topic               string
	Pending             int64
	Dead                int64
	OldestPendingAge    time.Duration // database clock
	PublishedLastMinute int64
}

// DeadMessage is an outbox message past its attempt budget.
type DeadMessage struct {
	Seq       int64
	ID        string
	Topic     string
	Key       string
	Payload   []byte
	Headers   []byte
	Attempts  int
	LastError string
	CreatedAt time.Time
	DeadAt    time.Time
}

// DeadMessageFilter selects dead messages. Fields left zero match
// everything; callers that change rows must not pass an empty filter by
// accident (postbox.Admin refuses one unless told All).
type DeadMessageFilter struct {
	IDs   []string
	Topic string
	Key   string
	Since time.Time // dead at or after
	Until time.Time // dead before
	Limit int       // for listing; default 100
}

// ReplayRequest selects published messages to send again.
type ReplayRequest struct {
	Since, Until time.Time // created_at window, required
	Topic, Key   string
	DryRun       bool
	Actor        string        // who asked, for the audit
	Horizon      time.Duration // Since must be within now()-Horizon
}

// ReplayAudit is one recorded replay request.
type ReplayAudit struct {
	ID     int64     `json:"id"`
	At     time.Time `json:"at"`
	Actor  string    `json:"actor"`
	Since  time.Time `json:"since"`
	Until  time.Time `json:"until"`
	Topic  string    `json:"topic"`
	Key    string    `json:"key"`
	Count  int       `json:"count"`
	DryRun bool      `json:"dry_run"`
}

package postboxdriver

import "time"

// TopicStats is the state of one topic.
type TopicStats struct {
	Topic               string
	Pending             int64
	Dead                int64
	OldestPendingAge    time.Duration // database clock
	PublishedLastMinute int64
	// PublishLagLastMinute is the longest commit-to-ack time of the
	// messages published in the last minute: from the row's creation to
	// the relay's record of the broker's acknowledgement.
	PublishLagLastMinute time.Duration
}

// DeadMessage is a message postbox gave up on: on the outbox side, one the
// relay could not publish within its attempt budget (Consumer empty); on
// the consumer side, one a consumer's handler could not apply (Consumer
// set).
type DeadMessage struct {
	// Consumer names the consumer that gave up; empty for the outbox.
	Consumer string
	// Seq is the message's place in the outbox (outbox only): a requeued
	// message goes back to it.
	Seq       int64
	ID        string
	Topic     string
	Key       string
	Payload   []byte
	Headers   []byte // JSON object of strings
	Attempts  int
	Error     string    // the last failure
	CreatedAt time.Time // when it was written (outbox only)
	// FirstFailureAt and LastFailureAt bound the failed runs (consumer
	// only; the outbox keeps the last error's time as DeadAt).
	FirstFailureAt time.Time
	LastFailureAt  time.Time
	DeadAt         time.Time
}

// Stored returns d's payload and headers as the tables hold them: an empty
// payload rather than NULL, and "{}" for no headers.
func (d DeadMessage) Stored() (payload []byte, headers string) {
	payload, headers = d.Payload, string(d.Headers)
	if payload == nil {
		payload = []byte{}
	}
	if headers == "" {
		headers = "{}"
	}
	return payload, headers
}

// DeadFilter selects dead messages. Fields left zero match everything;
// callers that change rows must not pass an empty filter by accident
// (postbox.Admin refuses one unless told All).
type DeadFilter struct {
	Consumer string // consumer side only
	IDs      []string
	Topic    string
	Key      string
	Since    time.Time // dead at or after
	Until    time.Time // dead before
	Limit    int       // for listing; default 100
}

// ReplayParams selects published messages to send again.
type ReplayParams struct {
	Since, Until time.Time // created_at window, required
	Topic, Key   string
	DryRun       bool
	// AsNew copies the messages into the outbox as new messages: fresh
	// ids, every header kept, plus HeaderReplayOf (the original id) and
	// HeaderReplay (the audit entry's id); the history keeps the
	// originals. Without it, the messages go back under their own ids.
	AsNew bool
	Actor string // who asked, for the audit
	// Horizon, when positive, refuses a window with Since before
	// now()-Horizon (ErrBeyondHorizon).
	Horizon time.Duration
}

// Headers a replay as new messages adds to each copy.
const (
	HeaderReplayOf = "postbox-replay-of" // the original message's id
	HeaderReplay   = "postbox-replay"    // the replay audit entry's id
)

// ReplayCount is what a replay would select of one topic.
type ReplayCount struct {
	Topic string
	Count int // messages the replay selects
	// Recent counts those published within the duration asked for.
	Recent int
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
	AsNew  bool      `json:"as_new"`
}

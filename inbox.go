package postbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

// Delivery is a message as a broker delivered it to a consumer.
type Delivery struct {
	ID      string
	Topic   string
	Key     string
	Payload []byte
	Headers map[string]string
	// Delivered counts the broker's deliveries of this message, this one
	// included, where the broker keeps such a count (JetStream does); else 0.
	Delivered int
}

// Handler applies a delivery inside the consumer's transaction tx, together
// with the inbox record. Returning an error rolls both back.
type Handler[TTx any] func(ctx context.Context, tx TTx, d *Delivery) error

// Action is what a broker subscriber does with a delivery once processed.
type Action int

// The actions a Verdict can carry.
const (
	// Ack: the handler's transaction committed, or the message was a copy.
	Ack Action = iota
	// Retry: redeliver after Verdict.Delay.
	Retry
	// DeadLettered: the budget is spent and a dead letter was written;
	// acknowledge the delivery so the broker stops redelivering it.
	DeadLettered
)

func (a Action) String() string {
	switch a {
	case Ack:
		return "ack"
	case Retry:
		return "retry"
	case DeadLettered:
		return "dead-lettered"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Verdict is the outcome of processing one delivery.
type Verdict struct {
	Action    Action
	Delay     time.Duration // for Retry
	Duplicate bool          // Ack of a copy: no handler ran
	Attempts  int           // failed runs so far, for Retry and DeadLettered
	Err       error         // the handler's or the store's error, for Retry and DeadLettered
}

// Processor is the seam between broker subscribers and the inbox: a
// subscriber hands each delivery to Process and settles it with the broker
// as the Verdict says (ack, redeliver after a delay, ack a dead letter).
// Inbox.Processor makes one.
type Processor interface {
	Process(ctx context.Context, d *Delivery) Verdict
}

// InboxConfig configures an Inbox. Zero fields take the documented defaults.
type InboxConfig struct {
	// Prefix names the tables; default "postbox_".
	Prefix string
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Metrics, when set, receives every delivery's verdict.
	Metrics Metrics
	// Tracer, when set, runs each handler in a span that continues the
	// writer's trace (postboxotel).
	Tracer Tracer
	// MaxAttempts is a message's budget of failed handler runs per consumer;
	// the run that reaches it writes a dead letter. Default 25.
	MaxAttempts int
	// BackoffBase and BackoffMax bound redelivery delays: base·2^(attempts-1)
	// capped at max, with equal jitter. Defaults 1s and 5m.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// Retention keeps inbox records this long. A copy that arrives later
	// runs its handler again, so it must outlast every way a copy can be
	// sent: at least OutboxRetention plus a day. Default 8 days.
	Retention time.Duration
	// OutboxRetention is how long the producers keep published messages
	// (and so can replay or re-send them). Default 7 days.
	OutboxRetention time.Duration
	// DeadRetention keeps consumer dead letters this long. Default 30 days.
	DeadRetention time.Duration
	// PruneBatch bounds each retention delete. Default 1000.
	PruneBatch int
	// PruneInterval is the pause between retention passes once Start runs
	// them. Default 1 minute.
	PruneInterval time.Duration
}

// Inbox defaults.
const (
	DefaultInboxRetention   = 8 * 24 * time.Hour
	DefaultOutboxRetention  = 7 * 24 * time.Hour
	DefaultDeadRetention    = 30 * 24 * time.Hour
	DefaultPruneBatch       = 1000
	DefaultPruneInterval    = time.Minute
	MaxConsumerNameBytes    = 200
	MaxDeliveryIDBytes      = 255
	inboxInfraRetryDelay    = time.Second
	redeliveryHorizonMargin = 24 * time.Hour
)

func (c *InboxConfig) withDefaults() *InboxConfig {
	var out InboxConfig
	if c != nil {
		out = *c
	}
	if out.Prefix == "" {
		out.Prefix = DefaultPrefix
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	if out.MaxAttempts == 0 {
		out.MaxAttempts = DefaultMaxAttempts
	}
	if out.BackoffBase == 0 {
		out.BackoffBase = DefaultBackoffBase
	}
	if out.BackoffMax == 0 {
		out.BackoffMax = DefaultBackoffMax
	}
	if out.Retention == 0 {
		out.Retention = DefaultInboxRetention
	}
	if out.OutboxRetention == 0 {
		out.OutboxRetention = DefaultOutboxRetention
	}
	if out.DeadRetention == 0 {
		out.DeadRetention = DefaultDeadRetention
	}
	if out.PruneBatch == 0 {
		out.PruneBatch = DefaultPruneBatch
	}
	if out.PruneInterval == 0 {
		out.PruneInterval = DefaultPruneInterval
	}
	return &out
}

func (c *InboxConfig) validate() error {
	var ps []*ValidationError
	bad := func(field string, value any, format string, args ...any) {
		ps = append(ps, invalid(field, value, format, args...))
	}
	if err := ValidatePrefix(c.Prefix); err != nil {
		ps = append(ps, err.(*ValidationError)) //nolint:errorlint // always this type
	}
	if c.MaxAttempts < 1 {
		bad("MaxAttempts", c.MaxAttempts, "must be at least 1")
	}
	if c.BackoffBase < time.Millisecond {
		bad("BackoffBase", c.BackoffBase, "must be at least 1ms")
	}
	if c.BackoffMax < c.BackoffBase {
		bad("BackoffMax", c.BackoffMax, "must not be shorter than BackoffBase (%s)", c.BackoffBase)
	}
	if c.OutboxRetention < 0 {
		bad("OutboxRetention", c.OutboxRetention, "must not be negative")
	}
	if c.Retention < c.OutboxRetention+redeliveryHorizonMargin {
		bad("Retention", c.Retention, "must be at least OutboxRetention (%s) plus one day: an inbox record deleted while a copy can still arrive lets the handler run twice", c.OutboxRetention)
	}
	if c.DeadRetention < time.Hour {
		bad("DeadRetention", c.DeadRetention, "must be at least 1h")
	}
	if c.PruneBatch < 1 || c.PruneBatch > 100_000 {
		bad("PruneBatch", c.PruneBatch, "must be between 1 and 100000")
	}
	if c.PruneInterval < time.Second {
		bad("PruneInterval", c.PruneInterval, "must be at least 1s")
	}
	if len(ps) > 0 {
		return &ConfigError{Problems: ps}
	}
	return nil
}

// Inbox gives consumers exactly-once effect: each (consumer, message id)
// runs its handler in a transaction that also records it, so a copy finds
// the record and runs nothing.
type Inbox[TTx any] struct {
	cfg   *InboxConfig
	store postboxdriver.Store[TTx]
	in    postboxdriver.Inboxer[TTx]
	log   *slog.Logger

	mu      sync.Mutex
	running *maintenance
}

// NewInbox makes an Inbox over driver. cfg may be nil for all defaults.
func NewInbox[TTx any](driver postboxdriver.Driver[TTx], cfg *InboxConfig) (*Inbox[TTx], error) {
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	store, err := driver.Open(c.Prefix)
	if err != nil {
		return nil, err
	}
	in, ok := store.(postboxdriver.Inboxer[TTx])
	if !ok {
		return nil, fmt.Errorf("postbox: the %s driver (%T) keeps no inbox", store.Dialect(), store)
	}
	return &Inbox[TTx]{cfg: c, store: store, in: in, log: c.Logger}, nil
}

func validateConsumer(consumer, messageID string) error {
	if consumer == "" || len(consumer) > MaxConsumerNameBytes || !printable(consumer) {
		return invalid("consumer", consumer, "must be printable text of 1 to %d bytes", MaxConsumerNameBytes)
	}
	if messageID == "" || len(messageID) > MaxDeliveryIDBytes || !printable(messageID) {
		return invalid("message_id", messageID, "must be printable text of 1 to %d bytes", MaxDeliveryIDBytes)
	}
	return nil
}

// Process records (consumer, messageID) in the caller's transaction tx and
// runs fn with tx only if this is the first copy. It reports whether fn ran.
// An error from fn is returned as is; the caller rolls tx back.
func (in *Inbox[TTx]) Process(ctx context.Context, tx TTx, consumer, messageID string, fn func(ctx context.Context, tx TTx) error) (bool, error) {
	if err := validateConsumer(consumer, messageID); err != nil {
		return false, err
	}
	first, err := in.in.InboxInsertTx(ctx, tx, consumer, messageID)
	if err != nil {
		return false, fmt.Errorf("postbox: inbox: %w", err)
	}
	if !first {
		return false, nil
	}
	return true, fn(ctx, tx)
}

// handlerError marks an error that came from the user's handler, as
// opposed to the store, inside the transaction closure.
type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }

// run runs h once for d in a transaction with the inbox record; a panic in
// h is turned into an error so the transaction rolls back.
func (in *Inbox[TTx]) run(ctx context.Context, consumer string, d *Delivery, h Handler[TTx], before func(tx TTx) error) (dup bool, err error) {
	err = in.store.InTx(ctx, func(tx TTx) error {
		if before != nil {
			if err := before(tx); err != nil {
				return err
			}
		}
		ran, err := in.Process(ctx, tx, consumer, d.ID, func(ctx context.Context, tx TTx) error {
			return callHandler(ctx, h, tx, d)
		})
		dup = !ran && err == nil
		var ve *ValidationError
		if err != nil && ran || errors.As(err, &ve) {
			return &handlerError{err}
		}
		return err
	})
	return dup, err
}

// Handle processes one delivery for consumer: begin, inbox, handler,
// commit. On a handler error it counts the attempt outside the rolled-back
// transaction and asks for a redelivery with backoff, or, once the budget
// is spent, writes a dead letter and asks for an ack. A store failure
// counts nothing and asks for a redelivery.
func (in *Inbox[TTx]) Handle(ctx context.Context, consumer string, d *Delivery, h Handler[TTx]) Verdict {
	var end func(Verdict)
	if in.cfg.Tracer != nil {
		ctx, end = in.cfg.Tracer.StartHandle(ctx, consumer, d)
	}
	start := time.Now()
	v := in.handle(ctx, consumer, d, h)
	if in.cfg.Metrics != nil {
		in.cfg.Metrics.InboxHandled(consumer, v, time.Since(start))
	}
	if end != nil {
		end(v)
	}
	return v
}

func (in *Inbox[TTx]) handle(ctx context.Context, consumer string, d *Delivery, h Handler[TTx]) Verdict {
	dup, err := in.run(ctx, consumer, d, h, nil)
	if err == nil {
		return Verdict{Action: Ack, Duplicate: dup}
	}
	var he *handlerError
	if !errors.As(err, &he) {
		in.log.Warn("postbox inbox: store failure; redelivering", slog.String("consumer", consumer), slog.String("id", d.ID), slog.Any("error", err))
		return Verdict{Action: Retry, Delay: inboxInfraRetryDelay, Err: err}
	}
	return in.failed(ctx, consumer, d, he)
}

// failed settles a delivery whose handler run (or whose recording) failed
// and was rolled back: it counts the attempt and asks for a redelivery
// with backoff, or buries the message once its budget is spent.
func (in *Inbox[TTx]) failed(ctx context.Context, consumer string, d *Delivery, he *handlerError) Verdict {
	var ve *ValidationError
	if errors.As(he.err, &ve) {
		// A delivery postbox cannot even record (an empty or oversized id)
		// will never succeed: bury it at once.
		return in.bury(ctx, consumer, d, he.err, postboxdriver.Attempts{Attempts: 1, FirstFailureAt: time.Now(), LastFailureAt: time.Now()})
	}
	msg := truncate(he.err.Error(), 2000)
	a, rerr := in.in.RecordFailure(ctx, consumer, d.ID, msg)
	if rerr != nil {
		in.log.Warn("postbox inbox: could not count a failed attempt; redelivering", slog.String("consumer", consumer), slog.String("id", d.ID), slog.Any("error", rerr))
		return Verdict{Action: Retry, Delay: inboxInfraRetryDelay, Err: he.err}
	}
	if a.Attempts >= in.cfg.MaxAttempts {
		return in.bury(ctx, consumer, d, he.err, a)
	}
	return Verdict{Action: Retry, Delay: backoff(a.Attempts-1, in.cfg.BackoffBase, in.cfg.BackoffMax), Attempts: a.Attempts, Err: he.err}
}

func (in *Inbox[TTx]) bury(ctx context.Context, consumer string, d *Delivery, herr error, a postboxdriver.Attempts) Verdict {
	headers, err := json.Marshal(d.Headers)
	if err != nil || d.Headers == nil {
		headers = []byte("{}")
	}
	dl := postboxdriver.DeadLetter{
		Consumer: truncate(consumer, MaxConsumerNameBytes), MessageID: d.ID,
		Topic: d.Topic, Key: d.Key, Payload: d.Payload, Headers: headers,
		Error: truncate(herr.Error(), 2000), Attempts: a.Attempts, FirstFailureAt: a.FirstFailureAt, LastFailureAt: a.LastFailureAt,
	}
	if validateConsumer("-", d.ID) != nil {
		// An id the inbox cannot record (empty, too long, not text) gets a
		// name of its own, so that two such letters never overwrite each
		// other; the error keeps what the id was.
		dl.MessageID = "invalid-id:" + NewID()
		dl.Error = truncate(fmt.Sprintf("%s (delivered with id %q)", dl.Error, truncate(d.ID, 64)), 2000)
	}
	if err := in.in.Bury(ctx, dl); err != nil {
		in.log.Warn("postbox inbox: could not write a dead letter; redelivering", slog.String("consumer", consumer), slog.String("id", d.ID), slog.Any("error", err))
		return Verdict{Action: Retry, Delay: inboxInfraRetryDelay, Attempts: a.Attempts, Err: herr}
	}
	in.log.Warn("postbox inbox: message dead-lettered after its budget", slog.String("consumer", consumer), slog.String("id", d.ID), slog.Int("attempts", a.Attempts), slog.Any("error", herr))
	return Verdict{Action: DeadLettered, Attempts: a.Attempts, Err: herr}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// Processor returns the Processor a broker subscriber uses to run h for
// consumer: one transaction, and one commit, per delivery. Under load,
// BatchProcessor commits many deliveries at once.
func (in *Inbox[TTx]) Processor(consumer string, h Handler[TTx]) Processor {
	return processor[TTx]{in: in, consumer: consumer, h: h}
}

type processor[TTx any] struct {
	in       *Inbox[TTx]
	consumer string
	h        Handler[TTx]
}

func (p processor[TTx]) Process(ctx context.Context, d *Delivery) Verdict {
	return p.in.Handle(ctx, p.consumer, d, p.h)
}

// DeadLetter is a message a consumer gave up on.
type DeadLetter = postboxdriver.DeadLetter

// DeadFilter selects dead letters.
type DeadFilter = postboxdriver.DeadFilter

// ListDead lists consumer dead letters, newest first.
func (in *Inbox[TTx]) ListDead(ctx context.Context, f DeadFilter) ([]DeadLetter, error) {
	if f.Limit < 0 || f.Limit > 10_000 {
		return nil, invalid("limit", f.Limit, "must be between 0 and 10000")
	}
	if f.Consumer != "" {
		if err := validateConsumer(f.Consumer, "-"); err != nil {
			return nil, err
		}
	}
	if f.Topic != "" {
		if err := ValidateTopic(f.Topic); err != nil {
			return nil, err
		}
	}
	if err := errors.Join(validateTime("since", f.Since), validateTime("until", f.Until)); err != nil {
		return nil, firstValidation(err)
	}
	return in.in.ListDead(ctx, f)
}

// GetDead returns one dead letter, or an error wrapping
// postboxdriver.ErrNotFound.
func (in *Inbox[TTx]) GetDead(ctx context.Context, consumer, messageID string) (DeadLetter, error) {
	if err := validateConsumer(consumer, messageID); err != nil {
		return DeadLetter{}, err
	}
	return in.in.GetDead(ctx, consumer, messageID)
}

// DeleteDead deletes a dead letter and reports whether it existed.
func (in *Inbox[TTx]) DeleteDead(ctx context.Context, consumer, messageID string) (bool, error) {
	if err := validateConsumer(consumer, messageID); err != nil {
		return false, err
	}
	return in.in.DeleteDead(ctx, consumer, messageID)
}

// Requeue runs h again for a dead letter, through the inbox, in one
// transaction that also removes the dead letter. If h fails, the dead
// letter stays as it was and the error is returned. A dead letter whose
// message the inbox already recorded (it succeeded since) is just removed.
func (in *Inbox[TTx]) Requeue(ctx context.Context, consumer, messageID string, h Handler[TTx]) error {
	if err := validateConsumer(consumer, messageID); err != nil {
		return err
	}
	var d *Delivery
	take := func(tx TTx) error {
		dl, err := in.in.TakeDeadTx(ctx, tx, consumer, messageID)
		if err != nil {
			return err
		}
		headers, err := DecodeHeaders(dl.Headers)
		if err != nil {
			return err
		}
		*d = Delivery{ID: dl.MessageID, Topic: dl.Topic, Key: dl.Key, Payload: dl.Payload, Headers: headers}
		return nil
	}
	d = &Delivery{ID: messageID}
	_, err := in.run(ctx, consumer, d, h, take)
	var he *handlerError
	if errors.As(err, &he) {
		return fmt.Errorf("postbox: requeue %s/%s: handler: %w", consumer, messageID, he.err)
	}
	if err != nil {
		return fmt.Errorf("postbox: requeue %s/%s: %w", consumer, messageID, err)
	}
	return nil
}

// PruneResult counts what a retention pass deleted.
type PruneResult struct {
	Inbox       int
	DeadLetters int
}

// Prune deletes inbox records older than Retention and dead letters older
// than DeadRetention, in batches of PruneBatch, until none are left or ctx
// ends.
func (in *Inbox[TTx]) Prune(ctx context.Context) (PruneResult, error) {
	var res PruneResult
	for {
		n, err := in.in.PruneInbox(ctx, in.cfg.Retention, in.cfg.PruneBatch)
		res.Inbox += n
		if err != nil {
			return res, fmt.Errorf("postbox: prune inbox: %w", err)
		}
		if n < in.cfg.PruneBatch {
			break
		}
	}
	for {
		n, err := in.in.PruneConsumerDead(ctx, in.cfg.DeadRetention, in.cfg.PruneBatch)
		res.DeadLetters += n
		if err != nil {
			return res, fmt.Errorf("postbox: prune consumer dead letters: %w", err)
		}
		if n < in.cfg.PruneBatch {
			break
		}
	}
	return res, nil
}

type maintenance struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// Start runs retention passes every PruneInterval until Stop.
func (in *Inbox[TTx]) Start(ctx context.Context) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.running != nil {
		return ErrStarted
	}
	ctx, cancel := context.WithCancel(ctx)
	m := &maintenance{cancel: cancel, done: make(chan struct{})}
	in.running = m
	go func() {
		defer close(m.done)
		t := time.NewTicker(in.cfg.PruneInterval)
		defer t.Stop()
		for {
			if res, err := in.Prune(ctx); err != nil && ctx.Err() == nil {
				in.log.Warn("postbox inbox: retention pass failed", slog.Any("error", err))
			} else if res.Inbox+res.DeadLetters > 0 {
				in.log.Info("postbox inbox: retention pass", slog.Int("inbox", res.Inbox), slog.Int("dead_letters", res.DeadLetters))
			}
			select {
			case <-t.C:
			case <-ctx.Done():
				return
			}
		}
	}()
	return nil
}

// Stop ends the retention passes, waiting for one in progress until ctx
// ends.
func (in *Inbox[TTx]) Stop(ctx context.Context) error {
	in.mu.Lock()
	m := in.running
	in.running = nil
	in.mu.Unlock()
	if m == nil {
		return ErrNotStarted
	}
	m.cancel()
	select {
	case <-m.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

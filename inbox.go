package postbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/postbox-go/postbox/internal/printable"
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
	// Redelivered, with Delivered 0, says the broker may have delivered
	// this message before although it keeps no count (a RabbitMQ classic
	// queue's redelivered flag). The inbox bounds crashes (MaxCrashes)
	// only on deliveries it can tell are redeliveries.
	Redelivered bool
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
	// DeadLettered: the budget is spent and a dead message was written;
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
// as the Verdict says (ack, redeliver after a delay, ack a dead message).
// Inbox.Processor makes one.
type Processor interface {
	Process(ctx context.Context, d *Delivery) Verdict
}

// Inbox limits.
const (
	MaxConsumerNameBytes = 200
	MaxDeliveryIDBytes   = 255
	inboxInfraRetryDelay = time.Second
)

// Inbox gives consumers exactly-once effect: each (consumer, message id)
// runs its handler in a transaction that also records it, so a copy finds
// the record and runs nothing. Client.Inbox returns it; its settings
// (attempts, backoff, retention, metrics, tracer) are the Client's Config.
type Inbox[TTx any] struct {
	cfg   *Config
	store postboxdriver.Store[TTx]
	log   *slog.Logger

	mu      sync.Mutex
	running *retentionLoop
	// handlers are the handlers of this process's Processors, by
	// consumer: what a requested requeue runs.
	handlers map[string]Handler[TTx]
}

// register records h as consumer's handler for requested requeues.
func (in *Inbox[TTx]) register(consumer string, h Handler[TTx]) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.handlers == nil {
		in.handlers = map[string]Handler[TTx]{}
	}
	in.handlers[consumer] = h
}

func validateConsumer(consumer, messageID string) error {
	if consumer == "" || len(consumer) > MaxConsumerNameBytes || !printable.Text(consumer) {
		return invalid("consumer", consumer, "must be printable text of 1 to %d bytes", MaxConsumerNameBytes)
	}
	if messageID == "" || len(messageID) > MaxDeliveryIDBytes || !printable.Text(messageID) {
		return invalid("message_id", messageID, "must be printable text of 1 to %d bytes", MaxDeliveryIDBytes)
	}
	return nil
}

// ProcessTx records (consumer, messageID) in the caller's transaction tx
// and runs fn with tx only if this is the first copy. It reports whether fn
// ran. An error from fn is returned as is; the caller rolls tx back.
//
// A message that has a dead message for consumer counts as a copy: a late
// copy of it runs nothing, and the dead message keeps its attempts and
// failures until RequeueDead runs it again or DeleteDead removes it.
func (in *Inbox[TTx]) ProcessTx(ctx context.Context, tx TTx, consumer, messageID string, fn func(ctx context.Context, tx TTx) error) (bool, error) {
	return in.processTx(ctx, tx, consumer, messageID, func(ctx context.Context, tx TTx) error {
		alone.RLock()
		defer alone.RUnlock()
		return fn(ctx, tx)
	})
}

// processTx is ProcessTx for the inbox's own runs, which hold alone
// already.
func (in *Inbox[TTx]) processTx(ctx context.Context, tx TTx, consumer, messageID string, fn func(ctx context.Context, tx TTx) error) (bool, error) {
	if err := validateConsumer(consumer, messageID); err != nil {
		return false, err
	}
	if isNil(tx) {
		return false, invalid("tx", "", "is nil: ProcessTx runs in the caller's open transaction")
	}
	first, err := in.store.UnwrapExecutor(tx).InboxInsert(ctx, consumer, messageID)
	if err != nil {
		return false, fmt.Errorf("postbox: inbox: %w", err)
	}
	if !first {
		return false, nil
	}
	return true, fn(ctx, tx)
}

// keepFor says how long from now d's inbox record must be kept for the
// producer's replay horizon d carries (HeaderReplayHorizon; negative:
// forever), and whether that needs writing. The record of a first copy is
// kept InboxRetention anyway, so its hold is written only when the
// horizon plus RedeliveryMargin reaches past that: when every service
// keeps its history alike, a first copy costs no extra statement. A copy
// always writes it: it may be a replay, after which the producer's
// history keeps the message for another horizon. Nothing is written while
// the inbox keeps every record forever, or for a delivery without the
// header (a consumer of messages not sent by a postbox relay), whose
// record InboxRetention alone governs.
func (in *Inbox[TTx]) keepFor(d *Delivery, copied bool) (time.Duration, bool) {
	if in.cfg.InboxRetention < 0 {
		return 0, false
	}
	v, ok := d.Headers[HeaderReplayHorizon]
	if !ok {
		return 0, false
	}
	horizon, forever, ok := parseReplayHorizon(v)
	switch {
	case !ok:
		return 0, false
	case forever:
		return -1, true
	}
	keep := horizon + RedeliveryMargin
	return keep, copied || keep > in.cfg.InboxRetention
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
		ran, err := in.processTx(ctx, tx, consumer, d.ID, func(ctx context.Context, tx TTx) error {
			return callHandler(ctx, h, tx, d)
		})
		var ve *ValidationError
		switch {
		case err != nil && ran && in.connLost(ctx, tx):
			// The handler's statements failed because the transaction
			// lost its connection: the database failed, not the handler.
			return err
		case err != nil && ran || errors.As(err, &ve):
			return &handlerError{err}
		case err != nil:
			return err
		}
		if keep, ok := in.keepFor(d, !ran); ok {
			if err := in.store.UnwrapExecutor(tx).InboxKeep(ctx, consumer, []string{d.ID}, keep); err != nil {
				return err
			}
		}
		dup = !ran
		return nil
	})
	return dup, err
}

// connCheckBudget bounds the question whether a failed handler's
// transaction lost its connection (Inbox.connLost).
const connCheckBudget = time.Second

// connLost reports whether tx lost its connection to the database, where
// the store can tell (postboxdriver.ConnChecker). It asks within
// connCheckBudget, even when ctx has ended.
func (in *Inbox[TTx]) connLost(ctx context.Context, tx TTx) bool {
	c, ok := in.store.(postboxdriver.ConnChecker[TTx])
	if !ok {
		return false
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), connCheckBudget)
	defer cancel()
	return c.ConnLost(cctx, tx)
}

// Handle processes one delivery for consumer: begin, inbox, handler,
// commit. On a handler error it counts the attempt outside the rolled-back
// transaction and asks for a redelivery with backoff, or, once the budget
// is spent, writes a dead message and asks for an ack. A handler error
// wrapped with Permanent writes the dead message at once; one wrapped with
// RetryAfter asks for a redelivery after its delay, counted or not as it
// says. A store failure counts nothing and asks for a redelivery; a
// handler error is one when the store says the handler's transaction lost
// its connection (postboxdriver.ConnChecker).
//
// A redelivery (d.Delivered above 1, or 0 with d.Redelivered) is
// counted before its handler runs: one statement reads its count, another
// adds the run. A run that ends with an uncounted retry or a store failure
// takes itself out of the count again (a third), and a
// recorded failure clears it; a message whose redeliveries ended
// MaxCrashes times with no outcome since its last recorded failure, that
// is with the process gone before the handler returned, is written as a
// dead message (a *CrashLoopError) instead of running again. A first
// delivery writes nothing for it.
func (in *Inbox[TTx]) Handle(ctx context.Context, consumer string, d *Delivery, h Handler[TTx]) Verdict {
	var end func(Verdict)
	if in.cfg.Tracer != nil {
		ctx, end = in.cfg.Tracer.StartHandle(ctx, consumer, d)
	}
	start := time.Now()
	v := in.handle(ctx, consumer, d, h)
	inboxHandled(in.cfg.Metrics, consumer, d.Topic, v, time.Since(start))
	if end != nil {
		end(v)
	}
	return v
}

func (in *Inbox[TTx]) handle(ctx context.Context, consumer string, d *Delivery, h Handler[TTx]) Verdict {
	started, suspect := false, false
	lock, unlock := alone.RLock, alone.RUnlock
	if in.countsCrashes(consumer, d) {
		// A suspect is known before its run is counted, so that it counts
		// nothing while it waits to run alone: a crash of the suspect
		// running meanwhile is not its own.
		n, err := in.store.InboxCrashes(ctx, consumer, d.ID)
		if err != nil {
			in.log.Warn("postbox inbox: store failure; redelivering", slog.String("consumer", consumer), slog.String("id", d.ID), slog.Any("error", err))
			return Verdict{Action: Retry, Delay: inboxInfraRetryDelay, Err: err}
		}
		if suspect = n > 0; suspect {
			lock, unlock = alone.Lock, alone.Unlock
		}
		lock()
		a, err := in.store.InboxStart(ctx, consumer, d.ID)
		if err != nil {
			unlock()
			in.log.Warn("postbox inbox: store failure; redelivering", slog.String("consumer", consumer), slog.String("id", d.ID), slog.Any("error", err))
			return Verdict{Action: Retry, Delay: inboxInfraRetryDelay, Err: err}
		}
		if a.Crashes >= in.cfg.MaxCrashes {
			unlock()
			return in.buryCrashed(ctx, consumer, d, a)
		}
		if a.Crashes > 0 && !suspect {
			// A crash between the read and the count (another process
			// running the same consumer): run alone all the same.
			unlock()
			lock, unlock = alone.Lock, alone.Unlock
			lock()
		}
		started = true
	} else {
		lock()
	}
	dup, err := in.run(ctx, consumer, d, h, nil)
	unlock()
	if err == nil {
		return Verdict{Action: Ack, Duplicate: dup}
	}
	var he *handlerError
	if !errors.As(err, &he) {
		in.log.Warn("postbox inbox: store failure; redelivering", slog.String("consumer", consumer), slog.String("id", d.ID), slog.Any("error", err))
		in.settle(ctx, consumer, d, started)
		return Verdict{Action: Retry, Delay: inboxInfraRetryDelay, Err: err}
	}
	return in.failed(ctx, consumer, d, he, started)
}

// alone makes a suspect, a redelivery whose earlier run ended with the
// process gone, the only handler running in the process: had it run beside
// others, each crash it caused would count against every redelivery in
// flight with it, and an innocent message would become a crash loop's dead
// message beside the guilty one. Every other handler run (Handle, the
// batches, ProcessTx, RunRequeues) holds it shared. A suspect waits for
// the runs in progress and holds new ones back while it runs. It is
// process-wide, as a crash is. So a message that kills every run dies
// once with others, then alone, and is dead-lettered after MaxCrashes+1
// exits as before, while a message in flight beside it counts at most
// that first crash and then runs alone and settles.
var alone sync.RWMutex

// countsCrashes reports whether a delivery's handler run is counted
// (InboxStart) before it begins, so that a message whose runs keep ending
// with the process gone is bounded by MaxCrashes: only a redelivery, as
// the broker's delivery count says, so that a first delivery writes
// nothing more than its inbox record. A delivery with neither a count
// nor the Redelivered sign is taken for a first one: a broker that gives
// neither gives no bound.
func (in *Inbox[TTx]) countsCrashes(consumer string, d *Delivery) bool {
	redelivery := d.Delivered > 1 || d.Delivered == 0 && d.Redelivered
	return redelivery && validateConsumer(consumer, d.ID) == nil
}

// settle records that a run counted by InboxStart ended with an outcome
// that records nothing else (an uncounted retry, a store failure), so that
// it is not taken for a crash; the crashes counted before it stay. It runs even when ctx has ended (a
// shutdown is no crash either), within releaseBudget; if the store fails
// it too, the run stays counted.
func (in *Inbox[TTx]) settle(ctx context.Context, consumer string, d *Delivery, started bool) {
	if !started {
		return
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseBudget)
	defer cancel()
	if err := in.store.InboxSettle(sctx, consumer, d.ID); err != nil {
		in.log.Warn("postbox inbox: could not settle a counted run; it counts towards MaxCrashes", slog.String("consumer", consumer), slog.String("id", d.ID), slog.Any("error", err))
	}
}

// buryCrashed writes the dead message of a delivery whose earlier runs
// ended MaxCrashes times with the process gone, without running its
// handler. It does so in a transaction that first takes the message's
// inbox record: a run still in progress (a handler slower than the
// broker's redelivery wait, whose start counted too) holds the record
// until it ends, and one that committed makes this delivery a copy, so a
// message that was applied is never also dead. The record is then deleted
// again in the same transaction: the dead message alone keeps late copies
// out, and a requeue runs the handler.
func (in *Inbox[TTx]) buryCrashed(ctx context.Context, consumer string, d *Delivery, a postboxdriver.Attempts) Verdict {
	cerr := &CrashLoopError{Crashes: a.Crashes}
	a.Attempts += a.Crashes
	dm := deadMessage(consumer, d, cerr, a)
	dup := false
	err := in.store.InTx(ctx, func(tx TTx) error {
		ex := in.store.UnwrapExecutor(tx)
		first, err := ex.InboxInsert(ctx, consumer, d.ID)
		if err != nil || !first {
			dup = err == nil
			return err
		}
		if err := ex.InboxDelete(ctx, consumer, []string{d.ID}); err != nil {
			return err
		}
		return ex.BuryConsumerDead(ctx, dm)
	})
	switch {
	case err != nil:
		in.log.Warn("postbox inbox: could not write a dead message; redelivering", slog.String("consumer", consumer), slog.String("id", d.ID), slog.Any("error", err))
		return Verdict{Action: Retry, Delay: inboxInfraRetryDelay, Attempts: a.Attempts, Err: cerr}
	case dup:
		return Verdict{Action: Ack, Duplicate: true}
	}
	in.log.Warn("postbox inbox: message dead-lettered: its handler runs keep ending with the process gone", slog.String("consumer", consumer), slog.String("id", d.ID), slog.Int("crashes", a.Crashes))
	return Verdict{Action: DeadLettered, Attempts: a.Attempts, Err: cerr}
}

// failed settles a delivery whose handler run (or whose recording) failed
// and was rolled back: it counts the attempt and asks for a redelivery
// with backoff, or buries the message once its budget is spent. started
// says the run was counted by InboxStart.
func (in *Inbox[TTx]) failed(ctx context.Context, consumer string, d *Delivery, he *handlerError, started bool) Verdict {
	var ve *ValidationError
	if errors.As(he.err, &ve) {
		// A delivery postbox cannot even record (an empty or oversized id)
		// will never succeed: bury it at once.
		return in.bury(ctx, consumer, d, he.err, postboxdriver.Attempts{Attempts: 1, FirstFailureAt: time.Now(), LastFailureAt: time.Now()})
	}
	ra, retry := retryAfter(he.err)
	if retry && !ra.Counted {
		// The handler asks for a later delivery without spending an
		// attempt: nothing is recorded but the end of a counted run.
		in.settle(ctx, consumer, d, started)
		return Verdict{Action: Retry, Delay: ra.Delay, Err: he.err}
	}
	// The failure's record settles a counted run too.
	a, rerr := in.store.RecordFailure(ctx, consumer, d.ID, errorText(he.err))
	if rerr != nil {
		in.log.Warn("postbox inbox: could not count a failed attempt; redelivering", slog.String("consumer", consumer), slog.String("id", d.ID), slog.Any("error", rerr))
		in.settle(ctx, consumer, d, started)
		return Verdict{Action: Retry, Delay: inboxInfraRetryDelay, Err: he.err}
	}
	if a.Attempts >= in.cfg.MaxAttempts || IsPermanent(he.err) {
		return in.bury(ctx, consumer, d, he.err, a)
	}
	delay := backoff(a.Attempts-1, in.cfg.BackoffBase, in.cfg.BackoffMax)
	if retry {
		delay = ra.Delay
	}
	return Verdict{Action: Retry, Delay: delay, Attempts: a.Attempts, Err: he.err}
}

// deadMessage is the consumer dead message of d after herr.
func deadMessage(consumer string, d *Delivery, herr error, a postboxdriver.Attempts) DeadMessage {
	headers, err := json.Marshal(d.Headers)
	if err != nil || d.Headers == nil {
		headers = []byte("{}")
	}
	dm := DeadMessage{
		Consumer: truncate(consumer, MaxConsumerNameBytes), ID: d.ID,
		Topic: d.Topic, Key: d.Key, Payload: d.Payload, Headers: headers,
		Error: errorText(herr), Attempts: a.Attempts, FirstFailureAt: a.FirstFailureAt, LastFailureAt: a.LastFailureAt,
	}
	if validateConsumer("-", d.ID) != nil {
		// An id the inbox cannot record (empty, too long, not text) gets a
		// name of its own, so that two such dead messages never overwrite
		// each other; the error keeps what the id was.
		dm.ID = "invalid-id:" + NewID()
		dm.Error = errorText(fmt.Errorf("%s (delivered with id %q)", dm.Error, truncate(d.ID, 64)))
	}
	return dm
}

func (in *Inbox[TTx]) bury(ctx context.Context, consumer string, d *Delivery, herr error, a postboxdriver.Attempts) Verdict {
	if err := in.store.BuryConsumerDead(ctx, deadMessage(consumer, d, herr, a)); err != nil {
		in.log.Warn("postbox inbox: could not write a dead message; redelivering", slog.String("consumer", consumer), slog.String("id", d.ID), slog.Any("error", err))
		return Verdict{Action: Retry, Delay: inboxInfraRetryDelay, Attempts: a.Attempts, Err: herr}
	}
	in.log.Warn("postbox inbox: message dead-lettered: its budget is spent or its failure is permanent", slog.String("consumer", consumer), slog.String("id", d.ID), slog.Int("attempts", a.Attempts), slog.Any("error", herr))
	return Verdict{Action: DeadLettered, Attempts: a.Attempts, Err: herr}
}

// Processor returns the Processor a broker subscriber uses to run h for
// consumer: one transaction, and one commit, per delivery. Under load,
// BatchProcessor commits many deliveries at once.
//
// The Inbox also keeps h as consumer's handler for the requeues an
// operator asks for (RequestRequeue): Start carries them out with it.
func (in *Inbox[TTx]) Processor(consumer string, h Handler[TTx]) Processor {
	in.register(consumer, h)
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

// ListDead lists consumers' dead messages, newest first.
func (in *Inbox[TTx]) ListDead(ctx context.Context, f DeadFilter) ([]DeadMessage, error) {
	if err := validateDeadFilter(&f, true); err != nil {
		return nil, err
	}
	return in.store.ListConsumerDead(ctx, f)
}

// GetDead returns one of consumer's dead messages, or an error wrapping
// postboxdriver.ErrNotFound.
func (in *Inbox[TTx]) GetDead(ctx context.Context, consumer, messageID string) (DeadMessage, error) {
	if err := validateConsumer(consumer, messageID); err != nil {
		return DeadMessage{}, err
	}
	return in.store.GetConsumerDead(ctx, consumer, messageID)
}

// DeleteDead deletes one of consumer's dead messages and reports whether
// it existed.
func (in *Inbox[TTx]) DeleteDead(ctx context.Context, consumer, messageID string) (bool, error) {
	if err := validateConsumer(consumer, messageID); err != nil {
		return false, err
	}
	return in.store.DeleteConsumerDead(ctx, consumer, messageID)
}

// RequeueDead runs h again for one of consumer's dead messages, through
// the inbox, in one transaction that also removes the dead message. If h
// fails, the dead message stays as it was and the error is returned. A
// dead message whose id the inbox already recorded (it succeeded since) is
// just removed.
func (in *Inbox[TTx]) RequeueDead(ctx context.Context, consumer, messageID string, h Handler[TTx]) error {
	if err := validateConsumer(consumer, messageID); err != nil {
		return err
	}
	d := &Delivery{ID: messageID}
	take := func(tx TTx) error {
		dm, err := in.store.UnwrapExecutor(tx).TakeConsumerDead(ctx, consumer, messageID)
		if err != nil {
			return err
		}
		headers, err := DecodeHeaders(dm.Headers)
		if err != nil {
			return err
		}
		*d = Delivery{ID: dm.ID, Topic: dm.Topic, Key: dm.Key, Payload: dm.Payload, Headers: headers}
		return nil
	}
	alone.RLock()
	_, err := in.run(ctx, consumer, d, h, take)
	alone.RUnlock()
	var he *handlerError
	if errors.As(err, &he) {
		return fmt.Errorf("postbox: requeue %s/%s: handler: %w", consumer, messageID, he)
	}
	if err != nil {
		return fmt.Errorf("postbox: requeue %s/%s: %w", consumer, messageID, err)
	}
	return nil
}

// DeadStats counts the consumers' dead messages per consumer and topic,
// with those whose requeue was asked for and not carried out yet.
func (in *Inbox[TTx]) DeadStats(ctx context.Context) ([]ConsumerDeadStat, error) {
	return in.store.ConsumerDeadStats(ctx)
}

// RequestRequeue marks the consumers' dead messages s selects for a
// requeue and returns how many it marked. The handler lives in the
// consuming service, so the request waits there: the Inbox of a process
// that has a Processor (or BatchProcessor) for the consumer, started with
// Start, runs the handler through the inbox within RequeueInterval and
// removes the dead message (RunRequeues). A selection with neither ids
// nor a filter needs s.All, else ErrEmptySelection.
func (in *Inbox[TTx]) RequestRequeue(ctx context.Context, s DeadSelection) (int, error) {
	if err := s.checkConsumers(); err != nil {
		return 0, err
	}
	return in.store.RequestConsumerRequeue(ctx, s.DeadFilter)
}

// DeleteDeadSelected deletes the consumers' dead messages s selects and
// returns how many it deleted. A selection with neither ids nor a filter
// needs s.All, else ErrEmptySelection.
func (in *Inbox[TTx]) DeleteDeadSelected(ctx context.Context, s DeadSelection) (int, error) {
	if err := s.checkConsumers(); err != nil {
		return 0, err
	}
	const page = 1000
	f := s.DeadFilter
	f.Limit = page
	n := 0
	for {
		ds, err := in.store.ListConsumerDead(ctx, f)
		if err != nil {
			return n, err
		}
		for i := range ds {
			ok, err := in.store.DeleteConsumerDead(ctx, ds[i].Consumer, ds[i].ID)
			if err != nil {
				return n, err
			}
			if ok {
				n++
			}
		}
		if len(ds) < page {
			return n, nil
		}
	}
}

// checkConsumers checks a selection of consumers' dead messages.
func (s *DeadSelection) checkConsumers() error {
	if err := validateDeadFilter(&s.DeadFilter, true); err != nil {
		return err
	}
	if len(s.IDs) > 0 && s.Consumer == "" {
		return invalid("consumer", "", "is required with ids: a message id is unique per consumer only")
	}
	if emptyFilter(&s.DeadFilter) && s.Consumer == "" && !s.All {
		return ErrEmptySelection
	}
	return nil
}

// RunRequeues carries out the requeues asked for (RequestRequeue) of the
// consumers this Inbox has a handler for, at most 100 per call, oldest
// request first: each runs RequeueDead with the consumer's handler. A
// handler that fails again leaves the dead message with the new error
// and one more attempt, and clears the request. It returns how many
// messages were requeued; Start calls it every RequeueInterval.
func (in *Inbox[TTx]) RunRequeues(ctx context.Context) (int, error) {
	in.mu.Lock()
	consumers := make([]string, 0, len(in.handlers))
	handlers := make(map[string]Handler[TTx], len(in.handlers))
	for c, h := range in.handlers {
		consumers = append(consumers, c)
		handlers[c] = h
	}
	in.mu.Unlock()
	if len(consumers) == 0 {
		return 0, nil
	}
	slices.Sort(consumers)
	ds, err := in.store.ListConsumerRequeues(ctx, consumers, 100)
	if err != nil {
		return 0, err
	}
	n := 0
	for i := range ds {
		d := &ds[i]
		err := in.RequeueDead(ctx, d.Consumer, d.ID, handlers[d.Consumer])
		var he *handlerError
		switch {
		case err == nil:
			n++
			in.log.Info("postbox inbox: requeued dead message ran its handler", slog.String("consumer", d.Consumer), slog.String("id", d.ID))
		case errors.Is(err, postboxdriver.ErrNotFound):
			// Another process of the consumer took it, or it was deleted.
		case errors.As(err, &he):
			in.log.Warn("postbox inbox: requeued dead message failed again; it stays dead", slog.String("consumer", d.Consumer),
				slog.String("id", d.ID), slog.Any("error", he.err))
			if _, ferr := in.store.FailConsumerRequeue(ctx, d.Consumer, d.ID, truncate(he.err.Error(), maxErrorBytes)); ferr != nil {
				return n, ferr
			}
		default:
			return n, err
		}
	}
	return n, nil
}

// PruneResult counts what a retention pass deleted.
type PruneResult struct {
	Inbox int // inbox records
	Dead  int // consumers' dead messages
	// Busy reports that another process was pruning the same tables: this
	// pass deleted nothing and left the work to it.
	Busy bool
}

// The inbox retention runs under a claim in the database, so that one
// process at a time prunes however many consumers share the tables.
const (
	pruneTask = "inbox-prune"
	// pruneClaim is how long a claim lasts; it is renewed before every
	// batch, and each batch must end within it.
	pruneClaim = 30 * time.Second
	// releaseBudget bounds the release of the claim once a pass ends.
	releaseBudget = 5 * time.Second
)

// errClaimLost stops a pass whose claim another process took over after it
// expired.
var errClaimLost = errors.New("the claim on the inbox retention passed to another process")

// Prune deletes inbox records older than InboxRetention and consumers'
// dead messages older than DeadRetention, in batches of PruneBatch, until
// none are left or ctx ends. A negative retention deletes nothing.
//
// One process at a time prunes: a pass claims the task in the database
// first (renewed before each batch, each batch bounded by the claim), and
// a pass that finds another process's claim deletes nothing and reports
// Busy. When ctx ends while a claim is being made, the pass waits for its
// answer (at most a few seconds) and releases it before returning ctx's
// error.
func (in *Inbox[TTx]) Prune(ctx context.Context) (PruneResult, error) {
	var res PruneResult
	if in.cfg.InboxRetention < 0 && in.cfg.DeadRetention < 0 {
		return res, nil
	}
	// One claim per pass: an owner of its own, so that two passes of one
	// process exclude each other too.
	owner := "inbox-" + NewID()
	var until time.Time
	claimed := false
	// A claim is not cut short by ctx: a statement given up on may still
	// run on the database, after the release below, and hold the task
	// for a whole claim with no pass running. The claim's answer comes
	// first, bounded by releaseBudget, and ctx is checked after it.
	claim := func(ctx context.Context) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		start := time.Now()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseBudget)
		ok, err := in.store.ClaimMaintenance(cctx, pruneTask, owner, pruneClaim)
		cancel()
		switch {
		case err != nil:
			return fmt.Errorf("postbox: prune: claim: %w", err)
		case !ok:
			return errClaimLost
		}
		claimed = true
		// Ends before the claim does on the database clock: the claim
		// started no earlier than start.
		until = start.Add(pruneClaim * 9 / 10)
		return ctx.Err()
	}
	defer func() {
		if !claimed {
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseBudget)
		defer cancel()
		if err := in.store.ReleaseMaintenance(rctx, pruneTask, owner); err != nil {
			in.log.Warn("postbox inbox: could not release the retention claim; it expires on its own", slog.Any("error", err))
		}
	}()
	if err := claim(ctx); err != nil {
		if errors.Is(err, errClaimLost) {
			res.Busy = true
			return res, nil
		}
		return res, err
	}
	// Each batch renews the claim first and ends within it.
	batch := func(del func(ctx context.Context) (int, error)) func(ctx context.Context) (int, error) {
		return func(ctx context.Context) (int, error) {
			if err := claim(ctx); err != nil {
				return 0, err
			}
			bctx, cancel := context.WithDeadline(ctx, until)
			defer cancel()
			return del(bctx)
		}
	}
	var err error
	if in.cfg.InboxRetention >= 0 {
		res.Inbox, err = prune(ctx, 0, in.cfg.PruneBatch, batch(func(ctx context.Context) (int, error) {
			return in.store.PruneInbox(ctx, in.cfg.InboxRetention, in.cfg.PruneBatch)
		}))
		if err != nil {
			return res, fmt.Errorf("postbox: prune inbox: %w", err)
		}
	}
	if in.cfg.DeadRetention >= 0 {
		res.Dead, err = prune(ctx, 0, in.cfg.PruneBatch, batch(func(ctx context.Context) (int, error) {
			return in.store.PruneConsumerDead(ctx, in.cfg.DeadRetention, in.cfg.PruneBatch)
		}))
		if err != nil {
			return res, fmt.Errorf("postbox: prune consumer dead messages: %w", err)
		}
	}
	return res, nil
}

type retentionLoop struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// Start runs retention passes every PruneInterval and carries out
// requested requeues (RunRequeues) every RequeueInterval, until Stop.
func (in *Inbox[TTx]) Start(ctx context.Context) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.running != nil {
		return ErrStarted
	}
	ctx, cancel := context.WithCancel(ctx)
	m := &retentionLoop{cancel: cancel, done: make(chan struct{})}
	in.running = m
	go func() {
		defer close(m.done)
		t := time.NewTicker(in.cfg.PruneInterval)
		defer t.Stop()
		rq := time.NewTicker(in.cfg.RequeueInterval)
		defer rq.Stop()
		prune := func() {
			if res, err := in.Prune(ctx); err != nil && ctx.Err() == nil {
				in.log.Warn("postbox inbox: retention pass failed", slog.Any("error", err))
			} else if res.Inbox+res.Dead > 0 {
				in.log.Info("postbox inbox: retention pass", slog.Int("inbox", res.Inbox), slog.Int("dead", res.Dead))
			}
		}
		prune()
		for {
			select {
			case <-t.C:
				prune()
			case <-rq.C:
				if _, err := in.RunRequeues(ctx); err != nil && ctx.Err() == nil {
					in.log.Warn("postbox inbox: requested requeues failed", slog.Any("error", err))
				}
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

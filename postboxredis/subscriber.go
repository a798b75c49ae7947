package postboxredis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/configcheck"
	"github.com/postbox-go/postbox/internal/keyorder"
)

// Timings of a Run that are not configurable.
const (
	// An ack is tried this many times, each waiting this long: a lost
	// XACK leaves the entry pending, and it comes back to some subscriber
	// after MinIdle, which for a dead message means running the handler
	// again.
	ackAttempts = 3
	ackTimeout  = 2 * time.Second
	// A redelivery that could not reach Redis is tried again after this.
	redeliverRetry = 500 * time.Millisecond
	// Reads that fail back off from readBackoffMin, doubling, to
	// readBackoffMax.
	readBackoffMin = 50 * time.Millisecond
	readBackoffMax = 2 * time.Second
	// A verdict this version does not know is treated as a Retry with
	// this delay.
	unknownVerdictDelay = time.Second
	// The scripts that keep or hand back held entries take at most this
	// many entries a call.
	touchBatch = 256
	// releaseTimeout bounds handing the held entries back when Run ends.
	releaseTimeout = 5 * time.Second
)

// Subscriber consumes one stream through a consumer group and hands each
// entry to a postbox.Processor, usually Inbox.Processor, settling it as
// the Verdict says. It implements postbox.Subscriber. Run may be called
// more than once, also at the same time: each Run is a consumer of the
// group of its own, and competes for the group's entries with every
// other.
type Subscriber struct {
	client redis.UniversalClient
	cfg    *SubscriberConfig
	log    *slog.Logger
	name   string // stream > group, for errors and logs
	// autoWindow: MaxInFlight was left at its default, so a Run takes
	// its Processor's hint (postbox.InFlight).
	autoWindow bool
}

// NewSubscriber returns a Subscriber over client. cfg names the stream
// and the group and may set the rest; an invalid one returns a
// *postbox.ConfigError naming every bad field. It creates nothing: the
// group is topology (EnsureGroup).
func NewSubscriber(client redis.UniversalClient, cfg *SubscriberConfig) (*Subscriber, error) {
	c := cfg.WithDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if client == nil {
		return nil, errors.New("postboxredis: NewSubscriber needs a Redis client")
	}
	return &Subscriber{
		client: client, cfg: c, log: c.Logger, name: c.Stream + " > " + c.Group,
		autoWindow: cfg == nil || cfg.MaxInFlight == 0,
	}, nil
}

// Config returns the subscriber's configuration, defaults filled in. A
// Run whose Processor asks for a larger in-flight window than a
// MaxInFlight left at its default holds that many (postbox.InFlight).
func (s *Subscriber) Config() SubscriberConfig { return *s.cfg }

// Run reads the group's entries and processes them until ctx ends, then
// returns nil. It returns an error when its first read finds no group or
// no stream (ErrNoGroup), or a key of another type (ErrWrongType): the
// group is topology, made with EnsureGroup. Later failures (Redis
// unreachable, restarting, even the group gone) are logged and retried
// with backoff.
//
// Each entry becomes a postbox.Delivery: ID from the id field, else the
// ce-id header; Topic from the topic field, else ce-type, else the
// stream's name; Key from the key field, else ce-partitionkey; Payload
// from the payload field; Headers from the JSON object in the headers
// field; Delivered, the group's delivery count of the entry. p.Process
// runs with ctx, and the verdict settles the entry:
//
//   - Ack and DeadLettered: XACK, tried again if Redis does not answer.
//   - Retry: the entry stays pending and is held by this Run for the
//     verdict's delay, then delivered to p again (its delivery count
//     raised by one). Meanwhile the Run keeps it from being claimed.
//
// An entry with neither an id field nor a ce-id header cannot pass
// through an inbox: it is acknowledged and logged with its entry id,
// and p never sees it.
//
// Every claim pass (at the start of Run and every ClaimInterval) first
// claims entries that other consumers of the group left pending for
// MinIdle (XAUTOCLAIM): a subscriber that died, or stopped without
// handing its entries back.
//
// When ctx ends, Run stops reading, waits for the entries being
// processed (ctx is theirs too, so their transactions roll back unless
// they committed) and settles them, then hands every entry it still
// holds back to the group: claimable at once, or, for a Retry, once its
// delay is over (when the delay is shorter than MinIdle). Finally it
// deletes its consumer from the group if nothing is pending for it and
// its name was generated.
func (s *Subscriber) Run(ctx context.Context, p postbox.Processor) error {
	if p == nil {
		return errors.New("postboxredis: Run needs a Processor")
	}
	if ctx.Err() != nil {
		return nil
	}
	consumer, generated := s.cfg.Consumer, false
	if consumer == "" {
		consumer, generated = uniqueConsumer(), true
	}
	window := s.cfg.MaxInFlight
	if s.autoWindow {
		window = postbox.InFlight(p, window, maxMaxInFlight)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := &run{
		s: s, ctx: runCtx, p: p, consumer: consumer,
		sem:  make(chan struct{}, window),
		held: map[string]*entry{},
		keys: keyorder.New[*entry](window, markersPerPlace*window),
	}
	r.bg.Add(1)
	go r.maintain()
	err := r.read()
	cancel()
	r.shutdown(generated)
	return err
}

// uniqueConsumer makes a consumer name no other Run uses: host, process
// id and a random suffix.
func uniqueConsumer() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "postbox"
	}
	host = strings.Map(func(r rune) rune {
		if r <= ' ' || r == 0x7f {
			return '_'
		}
		return r
	}, configcheck.Shorten(host))
	var b [6]byte
	_, _ = rand.Read(b[:])
	return host + "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])
}

// run is one Run's state.
type run struct {
	s        *Subscriber
	ctx      context.Context
	p        postbox.Processor
	consumer string
	// sem holds a token for every entry the Run took and has not settled
	// or handed back: being processed, waiting for a retry, or queued
	// behind its key.
	sem  chan struct{}
	bg   sync.WaitGroup // the maintenance goroutine
	work sync.WaitGroup // processing goroutines and retry timers

	mu   sync.Mutex
	held map[string]*entry       // by entry id
	keys *keyorder.Order[*entry] // PerKey: the lines of keyed entries, by stream id
}

// reserve waits for a free token and takes up to MaxInFlight free ones;
// it returns how many, or 0 once ctx ended.
func (r *run) reserve() int {
	select {
	case r.sem <- struct{}{}:
	case <-r.ctx.Done():
		return 0
	}
	n := 1
	for n < cap(r.sem) {
		select {
		case r.sem <- struct{}{}:
			n++
		default:
			return n
		}
	}
	return n
}

func (r *run) release(n int) {
	for range n {
		<-r.sem
	}
}

// read claims and reads entries until ctx ends or the first read finds
// no group.
func (r *run) read() error {
	cursor := "0-0"
	var nextClaim time.Time // at once: take over what a dead Run left
	started := false
	failures := 0
	for {
		n := r.reserve()
		if n == 0 {
			return nil
		}
		got := 0
		var err error
		if !time.Now().Before(nextClaim) {
			var k int
			k, cursor, err = r.claim(cursor, n)
			got += k
			if err == nil {
				nextClaim = time.Now().Add(r.s.cfg.ClaimInterval)
			}
		}
		if err == nil && got < n {
			var k int
			k, err = r.readNew(n - got)
			got += k
		}
		r.release(n - got)
		if err == nil {
			started, failures = true, 0
			continue
		}
		if r.ctx.Err() != nil {
			return nil
		}
		if !started && (errors.Is(err, ErrNoGroup) || errors.Is(err, ErrWrongType)) {
			return fmt.Errorf("postboxredis: consume %s: %w", r.s.name, err)
		}
		failures++
		wait := min(readBackoffMin<<min(failures-1, 16), readBackoffMax)
		r.s.log.Warn("postboxredis subscriber: read failed; retrying",
			slog.String("stream", r.s.cfg.Stream), slog.String("group", r.s.cfg.Group), slog.Duration("in", wait), slog.Any("error", err))
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-r.ctx.Done():
			t.Stop()
			return nil
		}
	}
}

// readErr wraps the errors of the group's reads.
func readErr(err error) error {
	switch {
	case redis.HasErrorPrefix(err, "NOGROUP"):
		return fmt.Errorf("%w: %w", ErrNoGroup, err)
	case redis.HasErrorPrefix(err, "WRONGTYPE"):
		return fmt.Errorf("%w: %w", ErrWrongType, err)
	}
	return err
}

// readNew reads up to n new entries, holding n tokens, and admits them;
// it returns how many entries it read (each took a token).
func (r *run) readNew(n int) (int, error) {
	// The read is not cut short by ctx, so that every entry Redis
	// delivers is known here and can be handed back; Block bounds it.
	res, err := r.s.client.XReadGroup(context.WithoutCancel(r.ctx), &redis.XReadGroupArgs{
		Group: r.s.cfg.Group, Consumer: r.consumer,
		Streams: []string{r.s.cfg.Stream, ">"},
		Count:   int64(n), Block: r.s.cfg.Block,
	}).Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, readErr(err)
	}
	got := 0
	for _, st := range res {
		for _, m := range st.Messages {
			if got == n {
				// More than asked for cannot happen; guard the tokens.
				break
			}
			got++
			fields := make(map[string]string, len(m.Values))
			for k, v := range m.Values {
				if s, ok := v.(string); ok {
					fields[k] = s
				}
			}
			r.admit(m.ID, fields, 1)
		}
	}
	return got, nil
}

// claim claims up to n entries idle for MinIdle, holding n tokens, and
// admits them; it returns how many it claimed and the next cursor.
func (r *run) claim(cursor string, n int) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), r.s.cfg.Block+5*time.Second)
	defer cancel()
	res, err := claimScript.Run(ctx, r.s.client, []string{r.s.cfg.Stream},
		r.s.cfg.Group, r.consumer, r.s.cfg.MinIdle.Milliseconds(), cursor, n).Slice()
	if err != nil {
		return 0, cursor, readErr(err)
	}
	if len(res) != 3 {
		return 0, cursor, fmt.Errorf("unexpected claim reply %v", res)
	}
	next, _ := res[0].(string)
	if next == "" {
		next = "0-0"
	}
	claimed, _ := res[1].([]any)
	if deleted, _ := res[2].([]any); len(deleted) > 0 {
		r.s.log.Warn("postboxredis subscriber: pending entries were deleted from the stream before they were acknowledged (trimmed by MaxLen, or XDEL); they cannot be delivered",
			slog.String("stream", r.s.cfg.Stream), slog.String("group", r.s.cfg.Group), slog.Any("entry_ids", deleted))
	}
	got := 0
	for _, c := range claimed {
		e, _ := c.([]any)
		if len(e) != 3 || got == n {
			continue
		}
		id, _ := e[0].(string)
		flat, _ := e[1].([]any)
		count, _ := e[2].(int64)
		fields := flatFields(flat)
		got++
		r.s.log.Info("postboxredis subscriber: claimed an entry another consumer left pending",
			slog.String("stream", r.s.cfg.Stream), slog.String("group", r.s.cfg.Group), slog.String("entry_id", id), slog.Int64("deliveries", count))
		r.admit(id, fields, int(count))
	}
	return got, next, nil
}

// delivery builds the Delivery of an entry's fields.
func (s *Subscriber) delivery(entryID string, fields map[string]string, delivered int) *postbox.Delivery {
	d := &postbox.Delivery{
		ID: fields[FieldID], Topic: fields[FieldTopic], Key: fields[FieldKey],
		Payload: []byte(fields[FieldPayload]), Delivered: delivered,
	}
	if h, ok := fields[FieldHeaders]; ok && h != "" {
		if err := json.Unmarshal([]byte(h), &d.Headers); err != nil {
			s.log.Warn("postboxredis subscriber: entry headers are not a JSON object of strings; delivering without them",
				slog.String("stream", s.cfg.Stream), slog.String("entry_id", entryID), slog.Any("error", err))
			d.Headers = nil
		}
	}
	if d.Headers == nil {
		d.Headers = map[string]string{}
	}
	if d.ID == "" {
		d.ID = d.Headers[postbox.HeaderID]
	}
	if d.Topic == "" {
		d.Topic = d.Headers[postbox.HeaderType]
	}
	if d.Topic == "" {
		d.Topic = s.cfg.Stream
	}
	if d.Key == "" {
		d.Key = d.Headers[postbox.HeaderPartitionKey]
	}
	return d
}

// process hands e to the processor and settles it as the verdict says.
func (r *run) process(e *entry) {
	v := r.p.Process(r.ctx, e.d)
	switch v.Action {
	case postbox.Ack, postbox.DeadLettered:
		if err := r.ack(e.id); err != nil {
			r.s.log.Warn("postboxredis subscriber: ack failed; the entry stays pending and is claimed again after MinIdle",
				slog.String("stream", r.s.cfg.Stream), slog.String("group", r.s.cfg.Group), slog.String("id", e.d.ID),
				slog.String("verdict", v.Action.String()), slog.Any("error", err))
		}
		r.settled(e)
	case postbox.Retry:
		r.hold(e, v.Delay)
	default:
		r.s.log.Error("postboxredis subscriber: unknown verdict; retrying",
			slog.String("stream", r.s.cfg.Stream), slog.String("id", e.d.ID), slog.String("verdict", v.Action.String()))
		r.hold(e, unknownVerdictDelay)
	}
}

// ack acknowledges an entry, trying again while Redis does not answer.
// Acks outlive ctx: an entry whose transaction committed as ctx ended is
// still acknowledged, rather than claimed later only to be absorbed as a
// copy.
func (r *run) ack(entryID string) error {
	base := context.WithoutCancel(r.ctx)
	var err error
	for i := range ackAttempts {
		if i > 0 {
			time.Sleep(readBackoffMin << i) // a short pause before the next try; no event to wait on
		}
		ctx, cancel := context.WithTimeout(base, ackTimeout)
		err = r.s.client.XAck(ctx, r.s.cfg.Stream, r.s.cfg.Group, entryID).Err()
		cancel()
		if err == nil || isMessageFault(err) || redis.HasErrorPrefix(err, "NOGROUP") {
			break
		}
	}
	return err
}

// maintain keeps the held entries from being claimed and prunes dead
// consumers, until ctx ends.
func (r *run) maintain() {
	defer r.bg.Done()
	touchEvery := r.s.cfg.MinIdle / 3
	touch := time.NewTicker(touchEvery / 2)
	defer touch.Stop()
	prune := time.NewTicker(max(r.s.cfg.ClaimInterval, min(r.s.cfg.IdleConsumerTTL/4, 5*time.Minute)))
	defer prune.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-touch.C:
			r.touch(touchEvery)
		case <-prune.C:
			r.prune()
		}
	}
}

// prune deletes consumers of the group that died and have nothing
// pending.
func (r *run) prune() {
	ctx, cancel := context.WithTimeout(r.ctx, ackTimeout)
	defer cancel()
	n, err := pruneConsumersScript.Run(ctx, r.s.client, []string{r.s.cfg.Stream},
		r.s.cfg.Group, r.consumer, r.s.cfg.IdleConsumerTTL.Milliseconds()).Int64()
	switch {
	case err != nil && r.ctx.Err() == nil:
		r.s.log.Debug("postboxredis subscriber: pruning idle consumers failed", slog.String("stream", r.s.cfg.Stream), slog.Any("error", err))
	case n > 0:
		r.s.log.Info("postboxredis subscriber: deleted idle consumers with nothing pending",
			slog.String("stream", r.s.cfg.Stream), slog.String("group", r.s.cfg.Group), slog.Int64("consumers", n))
	}
}

// shutdown settles what the Run still holds once reading stopped and ctx
// ended.
func (r *run) shutdown(deleteConsumer bool) {
	r.bg.Wait()
	r.mu.Lock()
	for _, e := range r.held {
		if e.timer != nil && e.timer.Stop() {
			r.work.Done()
		}
		e.timer = nil
	}
	r.mu.Unlock()
	r.work.Wait()
	r.handBack()
	if deleteConsumer {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), releaseTimeout)
		defer cancel()
		if err := deleteConsumerScript.Run(ctx, r.s.client, []string{r.s.cfg.Stream}, r.s.cfg.Group, r.consumer).Err(); err != nil {
			r.s.log.Debug("postboxredis subscriber: could not delete the consumer", slog.String("consumer", r.consumer), slog.Any("error", err))
		}
	}
}

var _ postbox.Subscriber = (*Subscriber)(nil)

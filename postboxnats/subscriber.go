package postboxnats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/configcheck"
)

// Subscriber defaults and bounds, as documented on SubscriberConfig.
const (
	DefaultMaxInFlight = 64
	maxMaxInFlight     = 4096

	// A settling ack waits this long for the server's confirmation, and
	// is tried this many times: an ack whose confirmation is lost is
	// sent again (acks are idempotent), so that a dead-lettered
	// delivery is not redelivered and counted again after AckWait.
	ackTimeout  = 2 * time.Second
	ackAttempts = 2

	// defaultAckWait is the server's AckWait when the consumer sets none.
	defaultAckWait = 30 * time.Second

	// How long the Subscriber waits for the client's pull subscription
	// to wind down at the end of Run.
	closeTimeout = 5 * time.Second

	// The first maxKicks waits for a delivery inside the client's
	// iterator last pullKick each (see run.next).
	pullKick = 250 * time.Millisecond
	maxKicks = 4

	// pullHeartbeat is the idle heartbeat the Subscriber's pulls ask for.
	pullHeartbeat = 5 * time.Second
)

// SubscriberConfig configures a Subscriber. The zero value of every field
// means its default; WithDefaults fills them in and Validate checks the
// result, naming every bad field at once.
type SubscriberConfig struct {
	// MaxInFlight bounds the deliveries the Subscriber holds at once:
	// those being processed and, with PerKey, those waiting for an
	// earlier message of their key. The client's pull buffer holds as
	// many again. Default 64, or, when Run's Processor asks for more (a
	// postbox.InFlightHinter, as Inbox.BatchProcessor is), that many, at
	// most 4096. With Inbox.BatchProcessor it also bounds the batches:
	// when set, keep it at least twice MaxBatch times Concurrency, so
	// that the next batch fills while the others commit.
	MaxInFlight int

	// PerKey processes the deliveries of one key (the ce-partitionkey
	// header) one at a time, in stream order, a retry included: a later
	// message of a key waits while an earlier one is processed or waits
	// for its delayed redelivery. Deliveries without a key stay fully
	// parallel. The order holds within one Run; see the package
	// documentation for what it takes across subscribers and restarts.
	PerKey bool

	// Stream is the consumer's stream. With PerKey it keeps a key's
	// order when a delivery is lost on the way, as when the server or
	// node a pull was answered through fails or is cut off: the
	// Subscriber sees the gap in the consumer's delivery numbers, reads
	// the lost messages' keys from the stream, and holds those keys
	// until the server sends the messages again (after AckWait). Without
	// it a lost delivery is logged, and its key's later messages may be
	// processed before it. Unused without PerKey.
	Stream jetstream.Stream

	// SubjectPrefix is the publisher's Config.SubjectPrefix: when a
	// message carries no ce-type header, its topic is its subject with
	// this prefix removed. It must be empty or end with ".".
	SubjectPrefix string

	// Topic, when set, maps a message's subject and headers to its topic
	// instead: the inverse of the publisher's Config.Subject. It must be
	// safe for concurrent use. SubjectPrefix must then be empty.
	Topic func(subject string, headers nats.Header) string

	// Logger; default slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with every zero field set to its
// default. c may be nil.
func (c *SubscriberConfig) WithDefaults() *SubscriberConfig {
	var out SubscriberConfig
	if c != nil {
		out = *c
	}
	if out.MaxInFlight == 0 {
		out.MaxInFlight = DefaultMaxInFlight
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return &out
}

// Validate checks a SubscriberConfig that WithDefaults has filled in. It
// returns a *postbox.ConfigError listing every bad field, or nil.
func (c *SubscriberConfig) Validate() error {
	var ps []*postbox.ValidationError
	bad := func(field string, value any, format string, args ...any) {
		ps = append(ps, configcheck.Problem(field, value, format, args...))
	}
	if c.MaxInFlight < 1 || c.MaxInFlight > maxMaxInFlight {
		bad("MaxInFlight", c.MaxInFlight, "must be between 1 and %d", maxMaxInFlight)
	}
	if p := c.SubjectPrefix; p != "" {
		switch {
		case !strings.HasSuffix(p, "."):
			bad("SubjectPrefix", p, `must end with "." as the publisher's does`)
		case validateSubject(p+"x") != nil:
			bad("SubjectPrefix", p, "is not a valid subject prefix: %v", validateSubject(p+"x"))
		}
		if c.Topic != nil {
			bad("SubjectPrefix", p, "must be empty when Topic is set; Topic decides the whole topic")
		}
	}
	if len(ps) > 0 {
		return &postbox.ConfigError{Problems: ps}
	}
	return nil
}

// Subscriber consumes a durable JetStream pull consumer and hands each
// delivery to a postbox.Processor, usually Inbox.Processor, settling it
// as the Verdict says. It implements postbox.Subscriber. Run may be
// called more than once, also at the same time: each Run pulls on its own
// and competes for the consumer's messages with every other.
type Subscriber struct {
	cons jetstream.Consumer
	cfg  *SubscriberConfig
	log  *slog.Logger
	name string // stream > consumer, for errors and logs
	// The shortest and the longest time the server waits for an ack
	// before it redelivers: AckWait, or the steps of BackOff.
	ackMin, ackMax time.Duration
	filters        []string // the consumer's filter subjects; none: all
	// autoWindow: MaxInFlight was left at its default, so a Run takes
	// its Processor's hint (postbox.InFlight).
	autoWindow bool
}

// NewSubscriber returns a Subscriber for consumer, as EnsureConsumer
// returns it (or Stream.Consumer / JetStream.Consumer for one the
// operator made). cfg may be nil for all defaults; an invalid one
// returns a *postbox.ConfigError naming every bad field. A consumer that
// is not durable, or does not use explicit acks, is refused with an
// error wrapping ErrConsumerConfig.
func NewSubscriber(consumer jetstream.Consumer, cfg *SubscriberConfig) (*Subscriber, error) {
	c := cfg.WithDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if consumer == nil {
		return nil, errors.New("postboxnats: NewSubscriber needs a consumer")
	}
	info := consumer.CachedInfo()
	if info == nil {
		return nil, errors.New("postboxnats: the consumer carries no info; get it from EnsureConsumer or the JetStream API")
	}
	if err := checkConsumerConfig(&info.Config); err != nil {
		return nil, fmt.Errorf("postboxnats: consumer %q on stream %q: %w", info.Name, info.Stream, err)
	}
	if c.Stream != nil {
		if si := c.Stream.CachedInfo(); si == nil || si.Config.Name != info.Stream {
			name := ""
			if si != nil {
				name = si.Config.Name
			}
			return nil, &postbox.ConfigError{Problems: []*postbox.ValidationError{
				configcheck.Problem("Stream", name, "is not the consumer's stream %q", info.Stream),
			}}
		}
	}
	ackMin, ackMax := ackWaits(&info.Config)
	filters := slices.Clone(info.Config.FilterSubjects)
	if info.Config.FilterSubject != "" {
		filters = append(filters, info.Config.FilterSubject)
	}
	return &Subscriber{
		cons: consumer, cfg: c, log: c.Logger,
		name:   info.Stream + " > " + info.Name,
		ackMin: ackMin, ackMax: ackMax,
		filters:    filters,
		autoWindow: cfg == nil || cfg.MaxInFlight == 0,
	}, nil
}

// ackWaits returns the shortest and the longest wait for an ack before a
// redelivery: AckWait (the server's default when unset), or, when set,
// the BackOff steps, which replace it.
func ackWaits(cfg *jetstream.ConsumerConfig) (lo, hi time.Duration) {
	if len(cfg.BackOff) == 0 {
		w := cfg.AckWait
		if w <= 0 {
			w = defaultAckWait
		}
		return w, w
	}
	lo, hi = cfg.BackOff[0], cfg.BackOff[0]
	for _, b := range cfg.BackOff[1:] {
		lo, hi = min(lo, b), max(hi, b)
	}
	return lo, hi
}

// Config returns the subscriber's configuration, defaults filled in. A
// Run whose Processor asks for a larger in-flight window than a
// MaxInFlight left at its default holds that many (postbox.InFlight).
func (s *Subscriber) Config() SubscriberConfig { return *s.cfg }

// Run pulls deliveries and processes them until ctx ends, then returns
// nil; it returns an error when the subscription fails for good (the
// connection was closed, the consumer deleted).
//
// Each delivery becomes a postbox.Delivery: ID from Nats-Msg-Id, else
// ce-id; Key from ce-partitionkey; Topic from ce-type, else the subject
// (see SubscriberConfig); Headers, every header but the Nats-* ones, with
// its first value; Delivered, JetStream's delivery count. p.Process runs
// with ctx, and the verdict settles the delivery: Ack and DeadLettered
// ack it and wait for the server to confirm, Retry naks it with the
// verdict's delay. A message with neither id cannot pass through an
// inbox: it is terminated (never redelivered) and logged with its stream
// sequence, and p never sees it.
//
// When ctx ends, Run stops pulling, waits for the deliveries being
// processed (ctx is theirs too, so their transactions roll back unless
// they committed) and settles them, and returns. Deliveries it pulled
// but had not started are abandoned: JetStream redelivers them after
// AckWait.
func (s *Subscriber) Run(ctx context.Context, p postbox.Processor) error {
	if p == nil {
		return errors.New("postboxnats: Run needs a Processor")
	}
	if ctx.Err() != nil {
		return nil
	}
	window := s.cfg.MaxInFlight
	if s.autoWindow {
		window = postbox.InFlight(p, window, maxMaxInFlight)
	}
	it, err := s.cons.Messages(
		jetstream.PullMaxMessages(window),
		// A pull the server lost (the consumer's leader moved, or the
		// node between failed) is noticed by a missed heartbeat: within
		// two of them, 10 s rather than the client's default 30.
		jetstream.PullHeartbeat(pullHeartbeat),
		// The client re-issues its pull after a missed heartbeat on its
		// own; a missed heartbeat is not a reason to stop consuming.
		jetstream.WithMessagesErrOnMissingHeartbeat(false),
	)
	if err != nil {
		return fmt.Errorf("postboxnats: consume %s: %w", s.name, err)
	}
	r := &run{s: s, ctx: ctx, p: p, sem: make(chan struct{}, window)}
	if s.cfg.PerKey {
		r.keys = newKeyOrder(r, window, s.ackMin, s.ackMax)
		r.wg.Add(1)
		go r.keys.tick(ctx, &r.wg, &r.saturated)
	}
	err = r.pull(it)
	it.Stop()
	s.awaitClosed(it)
	r.wg.Wait()
	return err
}

// awaitClosed waits, for a bounded time, until the client's pull
// subscription has wound down after Stop, so that Run leaves no goroutine
// of its own behind. The iterator of Messages signals nothing when it
// closes; its Closed reports a closed channel once the subscription is
// gone, so it is asked again until then.
func (s *Subscriber) awaitClosed(it jetstream.MessagesContext) {
	c, ok := it.(interface{ Closed() <-chan struct{} })
	if !ok {
		return
	}
	deadline := time.NewTimer(closeTimeout)
	defer deadline.Stop()
	poll := time.NewTicker(2 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case <-c.Closed():
			return
		default:
		}
		select {
		case <-poll.C:
		case <-deadline.C:
			s.log.Warn("postboxnats subscriber: the pull subscription did not close in time", slog.String("consumer", s.name))
			return
		}
	}
}

// run is one Run's state.
type run struct {
	s   *Subscriber
	ctx context.Context
	p   postbox.Processor
	// sem holds a token for every delivery taken from the client and not
	// yet settled or abandoned: being processed, or held for its key.
	sem       chan struct{}
	saturated atomic.Bool // the puller waits for a token
	keys      *keyOrder   // nil without PerKey
	gaps      gapWatch    // the puller's, with PerKey
	wg        sync.WaitGroup
}

func (r *run) release() { <-r.sem }

// disrupted tells the per-key scheduler that the server could not be
// reached (see keyOrder.disrupted).
func (r *run) disrupted() {
	if r.keys != nil {
		r.keys.disrupted(time.Now())
	}
}

// pull takes deliveries from the client while a token is free.
func (r *run) pull(it jetstream.MessagesContext) error {
	for {
		select {
		case r.sem <- struct{}{}:
		default:
			r.saturated.Store(true)
			select {
			case r.sem <- struct{}{}:
				r.saturated.Store(false)
			case <-r.ctx.Done():
				return nil
			}
		}
		msg, err := r.next(it)
		if err != nil {
			r.release()
			if r.ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("postboxnats: consume %s: %w", r.s.name, err)
		}
		r.dispatch(msg)
	}
}

// next waits for the next delivery.
//
// The client's iterator asks the server for more only at the top of its
// Next loop, and skips that while its previous pull request is still
// being sent (fetchInProgress, nats.go v1.55.0). When the server answers
// that request in full before the flag is cleared, which a small batch
// makes likely, Next blocks with no request outstanding until its missed
// heartbeat timer fires: twice pullHeartbeat. So the first waits after a
// delivery end every pullKick, which runs that check again once the flag
// is clear. After maxKicks of them the wait blocks for good: a request is
// outstanding by then, and the client's own missed heartbeat detection
// (whose timer every Next call restarts) must stay able to fire, for a
// request the server lost.
func (r *run) next(it jetstream.MessagesContext) (jetstream.Msg, error) {
	for range maxKicks {
		ctx, cancel := context.WithTimeout(r.ctx, pullKick)
		msg, err := it.Next(jetstream.NextContext(ctx))
		cancel()
		if err == nil || r.ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return msg, err
		}
	}
	return it.Next(jetstream.NextContext(r.ctx))
}

// dispatch routes one delivery, which holds a token.
func (r *run) dispatch(msg jetstream.Msg) {
	if r.ctx.Err() != nil {
		// Taken just as ctx ended: abandoned to AckWait, like the
		// client's buffer.
		r.release()
		return
	}
	d, md := r.s.delivery(msg)
	var seq uint64
	if md != nil {
		seq = md.Sequence.Stream
		if r.keys != nil {
			r.observe(md)
		}
	}
	if d.ID == "" {
		r.terminate(msg, seq)
		r.release()
		return
	}
	if r.keys == nil || d.Key == "" || seq == 0 {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			defer r.release()
			r.settle(msg, d, r.p.Process(r.ctx, d))
		}()
		return
	}
	r.keys.arrive(d.Key, seq, &entry{msg: msg, d: d, touched: time.Now()})
}

// redelivered reports whether settling v asks the server to deliver the
// message again, and after what delay.
func redelivered(v postbox.Verdict) (again bool, delay time.Duration) {
	switch v.Action {
	case postbox.Ack, postbox.DeadLettered:
		return false, 0
	case postbox.Retry:
		return true, max(v.Delay, 0)
	}
	return true, 0
}

// settle acks or naks msg. Settling outlives ctx: a delivery whose
// transaction committed just as ctx ended is still acked, so that it is
// not redelivered only to be absorbed as a copy.
func (r *run) settle(msg jetstream.Msg, d *postbox.Delivery, v postbox.Verdict) {
	log := r.s.log
	switch v.Action {
	case postbox.Ack, postbox.DeadLettered:
		if err := r.ack(msg); err != nil {
			r.disrupted()
			// The delivery comes back after AckWait; for an Ack the
			// inbox absorbs it as a copy.
			log.Warn("postboxnats subscriber: ack not confirmed; the message will be redelivered after AckWait",
				slog.String("consumer", r.s.name), slog.String("id", d.ID), slog.String("verdict", v.Action.String()), slog.Any("error", err))
		}
	case postbox.Retry:
		var err error
		if v.Delay > 0 {
			err = msg.NakWithDelay(v.Delay)
		} else {
			err = msg.Nak()
		}
		if err != nil {
			r.disrupted()
			log.Warn("postboxnats subscriber: nak failed; the message will be redelivered after AckWait",
				slog.String("consumer", r.s.name), slog.String("id", d.ID), slog.Any("error", err))
		}
	default:
		log.Error("postboxnats subscriber: unknown verdict; redelivering",
			slog.String("consumer", r.s.name), slog.String("id", d.ID), slog.String("verdict", v.Action.String()))
		_ = msg.Nak()
	}
}

// ack acknowledges msg and waits for the server's confirmation. DoubleAck
// rather than a plain Ack: a lost plain ack is only noticed when the
// message comes back after AckWait. That is harmless for an Ack (the
// inbox absorbs the copy) but not for a dead message, whose copy would run
// the handler again and rewrite the dead message; and an unconfirmed ack
// must not release the next message of a key as if the server had
// settled this one. The confirmation costs one round trip, paid
// concurrently by up to MaxInFlight deliveries.
func (r *run) ack(msg jetstream.Msg) error {
	base := context.WithoutCancel(r.ctx)
	var err error
	for range ackAttempts {
		ctx, cancel := context.WithTimeout(base, ackTimeout)
		err = msg.DoubleAck(ctx)
		cancel()
		if err == nil || errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
			break
		}
	}
	if errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
		return nil
	}
	return err
}

// terminate ends a delivery that carries no id: the inbox could neither
// record it nor dead-letter it under a name of its own, and a redelivery
// would change nothing. Term (not TermWithReason, which servers before
// 2.10.4 ignore) stops its redelivery; the message stays in the stream,
// findable by the logged sequence, for as long as the stream keeps it.
func (r *run) terminate(msg jetstream.Msg, seq uint64) {
	err := msg.Term()
	r.s.log.Error("postboxnats subscriber: message without Nats-Msg-Id or ce-id terminated; it cannot pass through an inbox",
		slog.String("consumer", r.s.name), slog.String("subject", msg.Subject()), slog.Uint64("stream_seq", seq), slog.Any("term_error", err))
}

// delivery builds the postbox.Delivery for msg, and returns msg's
// metadata (nil when it cannot be read).
func (s *Subscriber) delivery(msg jetstream.Msg) (*postbox.Delivery, *jetstream.MsgMetadata) {
	h := msg.Headers()
	d := &postbox.Delivery{Payload: msg.Data(), Headers: make(map[string]string, len(h))}
	for k, vs := range h {
		if len(vs) == 0 || len(k) >= 5 && strings.EqualFold(k[:5], "nats-") {
			continue
		}
		d.Headers[k] = vs[0]
	}
	d.ID = header(h, jetstream.MsgIDHeader)
	if d.ID == "" {
		d.ID = header(h, postbox.HeaderID)
	}
	d.Key = header(h, postbox.HeaderPartitionKey)
	switch {
	case s.cfg.Topic != nil:
		d.Topic = s.cfg.Topic(msg.Subject(), h)
	default:
		d.Topic = header(h, postbox.HeaderType)
		if d.Topic == "" {
			d.Topic = strings.TrimPrefix(msg.Subject(), s.cfg.SubjectPrefix)
		}
	}
	md, err := msg.Metadata()
	if err != nil {
		return d, nil
	}
	d.Delivered = int(md.NumDelivered)
	return d, md
}

// header returns the first value of name in h, matching the name exactly
// first (NATS headers keep their case, and postbox writes them in lower
// case) and then without regard to case, for other producers.
func header(h nats.Header, name string) string {
	if v := h[name]; len(v) > 0 {
		return v[0]
	}
	for k, v := range h {
		if len(v) > 0 && strings.EqualFold(k, name) {
			return v[0]
		}
	}
	return ""
}

var _ postbox.Subscriber = (*Subscriber)(nil)

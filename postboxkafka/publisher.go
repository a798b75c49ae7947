package postboxkafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubkit"
)

// Publisher produces envelopes to Kafka with acks=all on an idempotent
// producer, and reports each one done on its acknowledgement. It
// implements postbox.Publisher; its methods are safe for concurrent use.
//
// It produces through the caller's *kgo.Client without a goroutine per
// message: a publish costs the record, the client's promise, a timer for
// PublishTimeout and a context.AfterFunc registration.
type Publisher struct {
	cfg *Config
	cl  *kgo.Client
	log *slog.Logger
	// kit keeps Close out while a Publish registers its flight, so that
	// Close waits for every flight registered; its context ends topic
	// lookups at Close.
	kit *pubkit.Kit

	mu      sync.Mutex
	flights map[*flight]struct{} // produced, the promise not yet run
	lookups map[string][]waiter  // Kafka topic -> publishes awaiting its lookup
	waiting int                  // publishes in lookups
	settled chan struct{}        // a token whenever a flight or a lookup ends, for Close
	// lookups. Not the kit's goroutines: they are started while Close
	// waits for the publishes that need them.
	wg sync.WaitGroup
}

// flight is one publish awaiting its outcome. The client's promise and
// the end of the publish's context or its PublishTimeout race to its
// done: say the timeout passes while the acknowledgement is on its way;
// the timeout is reported, the relay sends the message again later under
// the same ce_id, and the consumers' inbox absorbs the copy.
type flight struct {
	pubkit.Flight
	id    string
	topic string // the Kafka topic
}

type waiter struct {
	f     *flight
	cause error
}

// New returns a Publisher that produces through cl. cfg may be nil for all
// defaults; an invalid one, or a client configured against what a
// published message must be worth, returns a *postbox.ConfigError naming
// every problem: cl must keep franz-go's defaults of acks=all
// (kgo.RequiredAcks(kgo.AllISRAcks())) and idempotent writes, and must not
// allow topic auto-creation, produce transactionally, flush manually or
// force a default topic.
//
// New creates nothing on the cluster: topics are topology, made with
// EnsureTopic or by the operator. Call Close when done; the client stays
// the caller's to close, after the Publisher.
func New(cl *kgo.Client, cfg *Config) (*Publisher, error) {
	c := cfg.WithDefaults()
	var ps problems
	var ce *postbox.ConfigError
	if errors.As(c.Validate(), &ce) {
		ps = ce.Problems
	}
	if cl == nil {
		return nil, errors.New("postboxkafka: New needs a *kgo.Client")
	}
	ps = append(ps, checkProducer(cl)...)
	if err := ps.Err(); err != nil {
		return nil, err
	}
	return &Publisher{
		cfg: c, cl: cl, log: c.Logger, kit: pubkit.New(0, ErrClosed),
		flights: map[*flight]struct{}{},
		lookups: map[string][]waiter{},
		settled: make(chan struct{}, 1),
	}, nil
}

// Config returns the publisher's configuration, defaults filled in.
func (p *Publisher) Config() Config { return *p.cfg }

// Publish produces env to its Kafka topic and returns once the client
// has buffered the record. done is called exactly once:
//
//   - nil when the partition's leader acknowledged the record after every
//     in-sync replica stored it (acks=all);
//   - a postbox.MessageError when the message or its topic was refused
//     too large, an invalid record, topic or header, no
//     write permission on the topic, or a topic the cluster confirms does
//     not exist;
//   - the context's error, wrapped, when ctx ends first;
//   - any other error for an infrastructure failure: no acknowledgement
//     within PublishTimeout, not enough in-sync replicas, no leader, the
//     client closed, the Publisher closed.
//
// franz-go cancels records a partition at a time: when a publish's context
// ends, or its PublishTimeout passes, before its record was sent, the
// client fails that record and the ones buffered behind it in its
// partition, which then fail with that context's error. They count as
// infrastructure failures, spend no attempt, and are sent again.
//
// done runs on the caller's goroutine, the client's promise goroutine, a
// topic lookup's goroutine, or the goroutine that sees the context end,
// and must not block. Publish blocks while the client's buffer is full
// (kgo.MaxBufferedRecords), until ctx ends or PublishTimeout passes.
func (p *Publisher) Publish(ctx context.Context, env *postbox.Envelope, done func(error)) {
	if err := ctx.Err(); err != nil {
		done(fmt.Errorf("postboxkafka: publish %s: %w", env.ID, err))
		return
	}
	rec, err := p.record(env, time.Now())
	if err != nil {
		done(postbox.Permanent(fmt.Errorf("postboxkafka: publish %s: %w", env.ID, err)))
		return
	}
	f := &flight{id: env.ID, topic: rec.Topic}
	f.Start(done)
	if !p.kit.Open() {
		done(fmt.Errorf("postboxkafka: publish %s: %w", env.ID, ErrClosed))
		return
	}
	p.mu.Lock()
	p.flights[f] = struct{}{}
	p.mu.Unlock()
	p.kit.Leave()

	// The record's context bounds its wait for buffer space and, while it
	// is not yet sent, its stay in the buffer. Once sent, an idempotent
	// producer waits for its outcome whatever the context says; the watch
	// reports the end of the wait to the relay meanwhile.
	rctx := f.WatchContext(ctx, p.cfg.PublishTimeout, func(ctxErr error) error {
		if ctxErr != nil {
			return fmt.Errorf("postboxkafka: publish %s: %w", f.id, ctxErr)
		}
		return fmt.Errorf("postboxkafka: publish %s to %s: %w (%s)", f.id, f.topic, ErrPublishTimeout, p.cfg.PublishTimeout)
	})
	p.cl.Produce(rctx, rec, func(_ *kgo.Record, err error) {
		f.Stop()
		p.resolve(f, err)
	})
}

// resolve reports the client's outcome for f, through a topic lookup when
// the topic was unknown. It runs on the client's promise goroutine, which
// must not block.
func (p *Publisher) resolve(f *flight, err error) {
	defer func() {
		p.mu.Lock()
		delete(p.flights, f)
		p.mu.Unlock()
		p.poke()
	}()
	switch {
	case err == nil:
		f.Finish(nil)
	case f.Finished():
		// The context ended first and the relay has its answer.
	default:
		switch classify(err) {
		case pubkit.Permanent:
			f.Finish(postbox.Permanent(fmt.Errorf("postboxkafka: publish %s to %s: %w", f.id, f.topic, err)))
		case pubkit.Message:
			f.Finish(postbox.NewMessageError(fmt.Errorf("postboxkafka: publish %s to %s: %w", f.id, f.topic, err)))
		case pubkit.Unconfirmed:
			p.lookup(f, err)
		default:
			f.Finish(fmt.Errorf("postboxkafka: publish %s to %s: %w", f.id, f.topic, err))
		}
	}
}

// lookup asks the cluster whether f's topic exists, once for every publish
// that met it unknown meanwhile.
func (p *Publisher) lookup(f *flight, cause error) {
	p.mu.Lock()
	if p.kit.Context().Err() != nil {
		p.mu.Unlock()
		f.Finish(fmt.Errorf("postboxkafka: publish %s to %s: %w (%w)", f.id, f.topic, cause, ErrClosed))
		return
	}
	ws, running := p.lookups[f.topic]
	p.lookups[f.topic] = append(ws, waiter{f: f, cause: cause})
	p.waiting++
	if !running {
		p.wg.Add(1)
		go p.runLookup(f.topic)
	}
	p.mu.Unlock()
}

func (p *Publisher) runLookup(topic string) {
	defer p.wg.Done()
	ctx, cancel := context.WithTimeout(p.kit.Context(), p.cfg.PublishTimeout)
	missing, err := topicMissing(ctx, p.cl, topic)
	cancel()
	p.mu.Lock()
	ws := p.lookups[topic]
	delete(p.lookups, topic)
	p.waiting -= len(ws)
	p.mu.Unlock()
	if err != nil {
		p.log.Debug("postboxkafka: topic lookup failed", slog.String("topic", topic), slog.Any("error", err))
	}
	for _, w := range ws {
		switch {
		case err != nil:
			w.f.Finish(fmt.Errorf("postboxkafka: publish %s to %s: %w (the topic lookup failed: %w)", w.f.id, topic, w.cause, err))
		case missing:
			w.f.Finish(postbox.NewMessageError(fmt.Errorf("postboxkafka: publish %s: %w: %s", w.f.id, ErrNoTopic, topic)))
		default:
			w.f.Finish(fmt.Errorf("postboxkafka: publish %s to %s: %w (the topic exists; the broker did not know it yet)", w.f.id, topic, w.cause))
		}
	}
	p.poke()
}

func (p *Publisher) poke() {
	select {
	case p.settled <- struct{}{}:
	default:
	}
}

// Close stops accepting publishes (each fails with ErrClosed from then
// on) and waits until every outstanding one has its outcome, or until ctx
// ends: then those still unacknowledged fail with ErrClosed, an
// infrastructure failure, and Close returns ctx's error. Their records stay
// in the client, which may still deliver them; the relay sends them again
// under the same ce_id, and the inbox absorbs a copy. Close leaves the
// client open: close it after the Publisher.
func (p *Publisher) Close(ctx context.Context) error {
	p.kit.Close()
	var err error
	for err == nil {
		p.mu.Lock()
		n := len(p.flights) + p.waiting
		p.mu.Unlock()
		if n == 0 {
			break
		}
		select {
		case <-p.settled:
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	p.kit.Cancel()
	p.wg.Wait()
	if err != nil {
		p.mu.Lock()
		left := make([]*flight, 0, len(p.flights))
		for f := range p.flights {
			left = append(left, f)
		}
		p.mu.Unlock()
		for _, f := range left {
			f.Finish(fmt.Errorf("postboxkafka: publish %s to %s: %w before its acknowledgement", f.id, f.topic, ErrClosed))
		}
	}
	return err
}

var _ postbox.Publisher = (*Publisher)(nil)

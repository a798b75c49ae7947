package postboxredis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/configcheck"
	"github.com/postbox-go/postbox/internal/printable"
	"github.com/postbox-go/postbox/internal/pubkit"
)

// The fields of a stream entry, in the order they are added. Every entry
// has all five, so that Redis stores the field names once per node of
// the stream instead of once per entry.
const (
	FieldID      = "id"      // the message id (postbox's UUIDv7)
	FieldTopic   = "topic"   // the message's topic
	FieldKey     = "key"     // the ordering key; "" when the message has none
	FieldPayload = "payload" // the payload, unchanged
	FieldHeaders = "headers" // a JSON object of the headers (CloudEvents attributes included)
)

// DedupeKeySuffix sits between a stream's name (in braces unless it holds
// a hash tag) and the message id in the name of a dedupe key:
// "{orders}:postbox:dedupe:0192...".
const DedupeKeySuffix = ":postbox:dedupe:"

// publishScript adds one entry, atomically with its dedupe guard.
//
// KEYS[1] is the stream; KEYS[2], when present, the dedupe key.
// ARGV[1] is the dedupe window in milliseconds, ARGV[2] MAXLEN ("0" for
// none), ARGV[3] "~" or "=", and ARGV[4...] the fields and values.
//
// It returns {"ok", entry id}; {"dup", entry id} when the dedupe key
// holds the entry id of an earlier publish of the message (the key's
// expiry is renewed, a write that also gives a WAIT after it something
// to wait for); {"nostream"} when the stream does not exist (the script
// never creates one); {"wrongtype", type} when the key is not a stream.
var publishScript = redis.NewScript(`
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then return {'nostream'} end
if t ~= 'stream' then return {'wrongtype', t} end
if KEYS[2] then
  local prev = redis.call('GET', KEYS[2])
  if prev then
    redis.call('PEXPIRE', KEYS[2], ARGV[1])
    return {'dup', prev}
  end
end
local args = {KEYS[1]}
if ARGV[2] ~= '0' then
  args[2] = 'MAXLEN'
  args[3] = ARGV[3]
  args[4] = ARGV[2]
end
args[#args + 1] = '*'
for i = 4, #ARGV do args[#args + 1] = ARGV[i] end
local id = redis.call('XADD', unpack(args))
if KEYS[2] then redis.call('SET', KEYS[2], id, 'PX', ARGV[1]) end
return {'ok', id}
`)

// Publisher adds envelopes to Redis streams and reports each one done on
// Redis's reply. It implements postbox.Publisher; its methods are safe
// for concurrent use.
//
// Publishes are queued and sent by a few goroutines of the Publisher's
// own, each taking whatever queued up while it was busy (up to MaxBatch)
// and sending it as one pipeline: hundreds of outstanding publishes cost
// a few round trips, not a connection each.
type Publisher struct {
	client   redis.UniversalClient
	cfg      *Config
	dedupeMs string
	maxLen   string
	trim     string

	// kit holds the MaxPending window (a slot per publish not yet
	// settled) and keeps Close out while a Publish enqueues, so that
	// nothing is queued after Close drained the queue. Its goroutines are
	// the pipelines, and its context ends them at Close.
	kit   *pubkit.Kit
	queue chan *request // publishes waiting for a pipeline; never fuller than the window
}

// request is one publish on its way. Its slot is freed before its done
// runs. The reply, the publish's context, the batch's timeout and Close
// race to done; whichever comes first is reported. When the context
// wins, the relay treats the message as not published and sends it again
// later with the same id, which the dedupe guard absorbs if the first add
// went through after all.
type request struct {
	pubkit.Flight
	id, stream string
	keys       []string
	args       []any
}

// New returns a Publisher over client. cfg may be nil for all defaults;
// an invalid one returns a *postbox.ConfigError naming every bad field.
//
// New creates nothing in Redis: streams are topology, made with
// EnsureGroup or by the operator, never as a side effect of publishing.
// Call Close when done; the client stays the caller's to close.
func New(client redis.UniversalClient, cfg *Config) (*Publisher, error) {
	c := cfg.WithDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if client == nil {
		return nil, errors.New("postboxredis: New needs a Redis client")
	}
	if c.MinReplicas > 0 {
		var ps problems
		switch cl := client.(type) {
		case *redis.ClusterClient, *redis.Ring:
			ps.Add("MinReplicas", c.MinReplicas, "is not supported on a %T: WAIT has no key to be routed by", client)
		case *redis.Client:
			if rt := cl.Options().ReadTimeout; rt > 0 && c.ReplicaTimeout >= rt {
				ps.Add("ReplicaTimeout", c.ReplicaTimeout, "must be under the client's ReadTimeout (%s), or the client gives up on WAIT first", rt)
			}
		}
		if err := ps.Err(); err != nil {
			return nil, err
		}
	}
	p := &Publisher{
		client:   client,
		cfg:      c,
		dedupeMs: strconv.FormatInt(c.DedupeWindow.Milliseconds(), 10),
		maxLen:   strconv.FormatInt(c.MaxLen, 10),
		trim:     "~",
		kit:      pubkit.New(c.MaxPending, ErrClosed),
		queue:    make(chan *request, c.MaxPending),
	}
	if c.TrimExact {
		p.trim = "="
	}
	for range c.Pipelines {
		p.kit.Go(p.pipeline)
	}
	return p, nil
}

// Config returns the publisher's configuration, defaults filled in.
func (p *Publisher) Config() Config { return *p.cfg }

// Stream returns the stream topic is published to, or an error wrapping
// ErrInvalidStream.
func (p *Publisher) Stream(topic string) (string, error) {
	s := p.cfg.Stream
	if s == "" {
		s = p.cfg.StreamPrefix + topic
	}
	if err := ValidateStreamName(s); err != nil {
		return "", fmt.Errorf("topic %q: %w", configcheck.Shorten(topic), err)
	}
	return s, nil
}

// Pending returns the number of publishes not yet settled by Redis,
// including those whose done was already called because their context
// ended: each holds a slot of the MaxPending window until it resolves.
func (p *Publisher) Pending() int { return p.kit.Window().Pending() }

// Publish adds env to the stream its topic maps to, as an entry with the
// fields id, topic, key, payload and headers and an id Redis makes, and
// returns once the publish is queued for a pipeline. done is called
// exactly once:
//
//   - nil when Redis added the entry, or when the dedupe guard found the
//     message added within DedupeWindow;
//   - a postbox.MessageError when the message itself cannot be added
//     (see the package's table of failures);
//   - ctx.Err() when ctx ends first;
//   - any other error for an infrastructure failure.
//
// done runs on the caller's goroutine (an invalid message, an ended
// context, a closed Publisher) or on one of the Publisher's, so it must
// not block. Publish may be called from several goroutines at once; it
// blocks while MaxPending publishes are unsettled, until ctx ends.
func (p *Publisher) Publish(ctx context.Context, env *postbox.Envelope, done func(error)) {
	r, ok := pubkit.Start(p.kit, ctx, env, done, p.request)
	if !ok {
		return
	}
	p.queue <- r // has room: every queued request holds a slot
	p.kit.Leave()
}

// CheckMessage implements postbox.MessageChecker: what Publish could
// never send is refused when the message is written. It builds the entry
// as Publish does, so a topic whose stream name this package refuses, a
// header that is not UTF-8, and an entry over MaxEntryBytes are refused.
// The server's own proto-max-bulk-len is not known before a publish; an
// entry over it (with MaxEntryBytes raised above it) is dead at its first
// publish.
func (p *Publisher) CheckMessage(env *postbox.Envelope) error {
	_, err := p.request(env)
	return err
}

// request builds the script call for env.
func (p *Publisher) request(env *postbox.Envelope) (*request, error) {
	if env.ID == "" || len(env.ID) > MaxIDBytes || !printable.Line(env.ID) {
		return nil, fmt.Errorf("%w: %q", ErrNoID, configcheck.Shorten(env.ID))
	}
	stream, err := p.Stream(env.Topic)
	if err != nil {
		return nil, err
	}
	headers := []byte("{}")
	if len(env.Headers) > 0 {
		for k, v := range env.Headers {
			if !utf8.ValidString(k) || !utf8.ValidString(v) {
				return nil, fmt.Errorf("%w %q: name or value is not valid UTF-8", ErrInvalidHeader, configcheck.Shorten(k))
			}
		}
		if headers, err = json.Marshal(env.Headers); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidHeader, err)
		}
	}
	size := len(env.ID) + len(env.Topic) + len(env.Key) + len(env.Payload) + len(headers)
	if size > p.cfg.MaxEntryBytes {
		return nil, fmt.Errorf("%w: message %s is %d bytes, over MaxEntryBytes (%d)", ErrTooLarge, env.ID, size, p.cfg.MaxEntryBytes)
	}
	keys := []string{stream}
	if !p.cfg.DisableDedupe {
		keys = append(keys, sameSlot(stream)+DedupeKeySuffix+env.ID)
	}
	payload := env.Payload
	if payload == nil {
		payload = []byte{}
	}
	return &request{
		id: env.ID, stream: stream, keys: keys,
		args: []any{
			p.dedupeMs, p.maxLen, p.trim,
			FieldID, env.ID, FieldTopic, env.Topic, FieldKey, env.Key,
			FieldPayload, payload, FieldHeaders, headers,
		},
	}, nil
}

// pipeline sends queued publishes until Close.
func (p *Publisher) pipeline() {
	ctx := p.kit.Context()
	batch := make([]*request, 0, p.cfg.MaxBatch)
	for {
		select {
		case <-ctx.Done():
			p.drain()
			return
		case r := <-p.queue:
			if ctx.Err() != nil {
				// Closed while this one was chosen over ctx.Done.
				r.Settle(ErrClosed)
				p.drain()
				return
			}
			batch = append(batch[:0], r)
		fill:
			for len(batch) < p.cfg.MaxBatch {
				select {
				case r := <-p.queue:
					batch = append(batch, r)
				default:
					break fill
				}
			}
			p.send(batch)
			clear(batch)
		}
	}
}

// drain fails whatever is still queued with ErrClosed.
func (p *Publisher) drain() {
	for {
		select {
		case r := <-p.queue:
			r.Settle(ErrClosed)
		default:
			return
		}
	}
}

// send runs one pipeline for batch and settles every publish in it.
func (p *Publisher) send(batch []*request) {
	// A publish whose context ended while it queued was reported already;
	// not sending it spares Redis an entry the relay will send again.
	live := make([]*request, 0, len(batch))
	for _, r := range batch {
		if r.Finished() {
			r.Stop()
			r.Release()
			continue
		}
		live = append(live, r)
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(p.kit.Context(), p.cfg.PublishTimeout)
	defer cancel()
	// The client bounds its own reads and writes (ReadTimeout,
	// WriteTimeout, retries) and looks at a context's deadline only with
	// ContextTimeoutEnabled; the timeout is reported here either way, and
	// the reply that may still come is then ignored.
	unwatch := context.AfterFunc(ctx, func() {
		cause := ErrPublishTimeout
		if p.kit.Context().Err() != nil {
			cause = ErrClosed
		}
		for _, r := range live {
			r.Finish(fmt.Errorf("postboxredis: publish %s to %q: %w", r.id, r.stream, cause))
		}
	})
	errs := p.exec(ctx, live)
	unwatch()
	for i, r := range live {
		r.Settle(errs[i])
	}
}

// exec sends the script calls of rs in one pipeline and returns each
// one's outcome, classified.
func (p *Publisher) exec(ctx context.Context, rs []*request) []error {
	cmds := make([]*redis.Cmd, len(rs))
	pipe := p.client.Pipeline()
	for i, r := range rs {
		cmds[i] = publishScript.EvalSha(ctx, pipe, r.keys, r.args...)
	}
	var wait *redis.Cmd
	if p.cfg.MinReplicas > 0 {
		wait = pipe.Do(ctx, "wait", p.cfg.MinReplicas, p.cfg.ReplicaTimeout.Milliseconds())
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	waits := make([]*redis.Cmd, len(rs))
	var again []int
	for i, c := range cmds {
		waits[i] = wait
		if redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		// The server lost its script cache (a restart, a failover, SCRIPT
		// FLUSH): nothing ran, so send those calls again with the source,
		// which also caches it.
		pipe := p.client.Pipeline()
		for _, i := range again {
			cmds[i] = publishScript.Eval(ctx, pipe, rs[i].keys, rs[i].args...)
		}
		var wait2 *redis.Cmd
		if p.cfg.MinReplicas > 0 {
			wait2 = pipe.Do(ctx, "wait", p.cfg.MinReplicas, p.cfg.ReplicaTimeout.Milliseconds())
		}
		_, _ = pipe.Exec(ctx)
		for _, i := range again {
			waits[i] = wait2
		}
	}
	errs := make([]error, len(rs))
	for i, c := range cmds {
		errs[i] = p.outcome(rs[i], c, waits[i])
	}
	return errs
}

// outcome reads one script call's reply.
func (p *Publisher) outcome(r *request, c *redis.Cmd, wait *redis.Cmd) error {
	fail := func(err error) error {
		return classified(fmt.Errorf("postboxredis: publish %s to %q: %w", r.id, r.stream, err))
	}
	vals, err := c.Slice()
	if err != nil {
		return fail(err)
	}
	status := ""
	if len(vals) > 0 {
		status, _ = vals[0].(string)
	}
	switch status {
	case "ok", "dup":
	case "nostream":
		return fail(ErrNoStream)
	case "wrongtype":
		var t any = "?"
		if len(vals) > 1 {
			t = vals[1]
		}
		return fail(fmt.Errorf("%w: it holds a %v", ErrWrongType, t))
	default:
		return fail(fmt.Errorf("unexpected script reply %v", vals))
	}
	if wait != nil {
		n, err := wait.Int64()
		if err != nil {
			return fail(fmt.Errorf("%w: WAIT: %w", ErrNotReplicated, err))
		}
		if n < int64(p.cfg.MinReplicas) {
			return fail(fmt.Errorf("%w: %d of %d replicas within %s", ErrNotReplicated, n, p.cfg.MinReplicas, p.cfg.ReplicaTimeout))
		}
	}
	return nil
}

// Close stops the publisher: publishes still awaiting their reply fail
// with an error wrapping ErrClosed (an infrastructure failure: the relay
// publishes them again), and every later Publish fails with ErrClosed.
// It waits, until ctx ends, for the pipelines in flight to return. The
// client is left open. Calling Close again does nothing.
func (p *Publisher) Close(ctx context.Context) error {
	if !p.kit.Close() {
		return nil
	}
	p.kit.Cancel()
	if err := p.kit.Wait(ctx); err != nil {
		return fmt.Errorf("postboxredis: close: %w", err)
	}
	p.drain()
	return nil
}

var _ postbox.Publisher = (*Publisher)(nil)

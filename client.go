package postbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

// Client is postbox's one front door: it writes messages in transactions,
// runs the relay that moves them to the broker (Start, Stop, Drain), and
// hands out the consumer side (Inbox) and the operator side (Admin), all
// over one driver and one Config. TTx is the transaction type of the
// driver: pgx.Tx for postboxpgx, *sql.Tx for postboxsql and postboxsqlite.
type Client[TTx any] struct {
	cfg    *Config
	store  postboxdriver.Store[TTx]
	wake   *wakeup
	signal *signaler // nil without change signals
	// nparts is the partition count of the relay running in this
	// process, by which a write names the lanes to wake; 0 before Start.
	nparts atomic.Int64
	routes routes
	inbox  *Inbox[TTx]
	admin  *Admin

	// mu orders Start and Stop; running, the relay they started, is
	// written under it and read without it (RelayState must not wait for
	// a Start that is reaching the database).
	mu      sync.Mutex
	running atomic.Pointer[relayRun]
}

// NewClient makes a Client over driver. cfg may be nil for all defaults;
// an invalid one returns a *ConfigError naming every bad field.
func NewClient[TTx any](driver postboxdriver.Driver[TTx], cfg *Config) (*Client[TTx], error) {
	c := cfg.WithDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if driver == nil {
		return nil, errors.New("postbox: NewClient needs a driver")
	}
	store, err := driver.Open(c.Prefix)
	if err != nil {
		return nil, err
	}
	client := &Client[TTx]{cfg: c, store: store, wake: newWakeup(), routes: c.effectiveRoutes(), signal: newSignaler(store, c)}
	client.inbox = &Inbox[TTx]{cfg: c, store: store, log: c.Logger}
	client.admin = &Admin{ex: store, cfg: c}
	return client, nil
}

// Config returns the client's configuration, defaults filled in.
func (c *Client[TTx]) Config() Config { return *c.cfg }

// Inbox returns the consumer side: exactly-once effect for handlers, and
// the consumers' dead messages.
func (c *Client[TTx]) Inbox() *Inbox[TTx] { return c.inbox }

// Admin returns the operator side: status, the outbox's dead messages,
// retention and replay.
func (c *Client[TTx]) Admin() *Admin { return c.admin }

// WriteTx writes msgs in the caller's transaction tx, with one statement:
// they exist if and only if tx commits. Each message is validated first;
// on a *ValidationError nothing is written.
//
// Messages sharing a key are published in the order written. That order
// is the insert order: two transactions writing one key at the same time
// have none, so serialize writers of a key (lock the entity's row in the
// same transaction) when its order matters.
//
// A nil tx, and two messages with one id, are refused with a
// *ValidationError before any statement runs, so the caller's transaction
// stays usable.
func (c *Client[TTx]) WriteTx(ctx context.Context, tx TTx, msgs ...Message) error {
	if isNil(tx) {
		return invalid("tx", "", "is nil: WriteTx writes in the caller's open transaction")
	}
	rows, err := c.rows(ctx, msgs)
	if err != nil || len(rows) == 0 {
		return err
	}
	ex := c.store.UnwrapExecutor(tx)
	if err := ex.Insert(ctx, rows); err != nil {
		return fmt.Errorf("postbox: write: %w", err)
	}
	parts, ids := c.writtenOf(rows)
	if ac, ok := ex.(postboxdriver.AfterCommitter); ok && ac.AfterCommit(func() { c.notify(wakeCommitted, parts, ids) }) {
		return nil // the relays are woken once the rows are there
	}
	// The transaction is not committed yet; the relays, woken now, look
	// again shortly after on their fast poll and find the rows then.
	c.notify(wakeEarly, parts, nil)
	return nil
}

// Write writes msgs in a transaction of its own.
func (c *Client[TTx]) Write(ctx context.Context, msgs ...Message) error {
	rows, err := c.rows(ctx, msgs)
	if err != nil || len(rows) == 0 {
		return err
	}
	if err := c.store.Insert(ctx, rows); err != nil {
		return fmt.Errorf("postbox: write: %w", err)
	}
	parts, ids := c.writtenOf(rows)
	c.notify(wakeCommitted, parts, ids)
	return nil
}

func (c *Client[TTx]) rows(ctx context.Context, msgs []Message) ([]postboxdriver.Row, error) {
	now := time.Now()
	// One trace context for the whole write: every message gets a copy.
	var trace map[string]string
	if c.cfg.Tracer != nil {
		trace = map[string]string{}
		c.cfg.Tracer.Inject(ctx, trace)
	}
	rows := make([]postboxdriver.Row, len(msgs))
	var ids map[string]int // the ids the writer set, to refuse one given twice
	for i := range msgs {
		m := &msgs[i]
		if err := m.validate(i, c.cfg.MaxPayloadBytes); err != nil {
			return nil, err
		}
		if err := m.checkTrace(i, trace); err != nil {
			return nil, err
		}
		if m.ID != "" {
			if ids == nil {
				ids = make(map[string]int)
			}
			if j, ok := ids[m.ID]; ok {
				return nil, invalid(fmt.Sprintf("messages[%d].id", i), m.ID, "is the id of messages[%d]: one write holds an id once", j)
			}
			ids[m.ID] = i
		}
		id := m.ID
		if id == "" {
			id = NewID()
		}
		h := storedHeaders(m, c.cfg.Source, now, trace)
		if len(c.routes) > 0 {
			pub := c.routes.route(m.Topic)
			if pub == nil {
				return nil, invalid(fmt.Sprintf("messages[%d].topic", i), m.Topic, "matches no route: no relay of this client would publish it")
			}
			if mc, ok := pub.(MessageChecker); ok {
				env := newEnvelope(id, m.Topic, m.Key, m.Payload, maps.Clone(h), c.cfg.Source, replayHorizon(c.cfg.Retention), now, 1)
				if err := mc.CheckMessage(env); err != nil {
					return nil, &ValidationError{Field: fmt.Sprintf("messages[%d]", i), Value: truncate(m.Topic, 64), Reason: "its publisher refuses it: " + err.Error()}
				}
			}
		}
		if c.cfg.Validator != nil {
			if err := c.cfg.Validator.ValidatePayload(m.Topic, m.Payload); err != nil {
				var ve *ValidationError
				if errors.As(err, &ve) {
					// A copy: the validator may hand out one error value.
					named := *ve
					named.Field = fmt.Sprintf("messages[%d].%s", i, ve.Field)
					return nil, &named
				}
				return nil, &ValidationError{Field: fmt.Sprintf("messages[%d].payload", i), Reason: err.Error()}
			}
		}
		stored, err := json.Marshal(h)
		if err != nil {
			return nil, err
		}
		rows[i] = postboxdriver.Row{ID: id, Topic: m.Topic, Key: m.Key, Payload: m.Payload, Headers: stored}
	}
	return rows, nil
}

// isNil reports whether v, a transaction of the driver's type, is nil: a
// nil interface (pgx.Tx) or a nil pointer (*sql.Tx).
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return rv.IsNil()
	}
	return false
}

// notify wakes the relay in this process, the lanes that read parts, and,
// through the change signal, those in others: unless this process's relay
// holds every partition and no other relay is live, when no relay
// elsewhere could read the rows. A wake-up for committed rows names them
// (ids), so that a lane that has read them already is not woken.
func (c *Client[TTx]) notify(kind wakeKind, parts uint64, ids []written) {
	c.wake.send(kind, parts, ids)
	if !c.wake.alone.Load() {
		c.signal.send(kind == wakeEarly)
	}
}

// writtenOf is the mask of the partitions rows fall in, for the relay
// running in this process, and the rows by id and partition; allParts
// and no rows when there is no relay or its partitions do not fit in a
// mask, and no rows past maxNamed.
func (c *Client[TTx]) writtenOf(rows []postboxdriver.Row) (uint64, []written) {
	n := int(c.nparts.Load())
	if n < 1 || n > 64 {
		return allParts, nil
	}
	var ids []written
	if len(rows) <= maxNamed {
		ids = make([]written, len(rows))
	}
	var mask uint64
	for i := range rows {
		p := postboxdriver.PartitionOf(rows[i].Key, rows[i].ID, n)
		mask |= 1 << p
		if ids != nil {
			ids[i] = written{id: rows[i].ID, part: p}
		}
	}
	return mask, ids
}

// Start runs the relay in the background until Stop. It fails fast when no
// Publisher is configured or the tables are not migrated.
func (c *Client[TTx]) Start(ctx context.Context) error {
	if len(c.routes) == 0 {
		return ErrNoPublisher
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running.Load() != nil {
		return ErrStarted
	}
	r, err := newRelay(ctx, c.store, c.cfg, c.routes, c.wake)
	if err != nil {
		return err
	}
	c.nparts.Store(int64(r.nparts))
	c.running.Store(r.start())
	return nil
}

// Stop stops the relay: it claims nothing more, finishes the batch and
// the lease renewal in flight, records the batch's outcome and releases
// its partitions so another replica takes them at once. When ctx ends
// first, in-flight publishes are abandoned (their rows stay pending and
// are published again later) and Stop returns ctx's error once the relay
// has exited.
func (c *Client[TTx]) Stop(ctx context.Context) error {
	c.mu.Lock()
	run := c.running.Swap(nil)
	c.mu.Unlock()
	if run == nil {
		return ErrNotStarted
	}
	return run.stop(ctx)
}

// RelayState reports what the relay started in this process is doing:
// whether it runs, and the failure to reach its database it is retrying,
// if any, since when. An operator's health check or status page reads it:
// a relay that runs but cannot renew its leases, read or record is not
// relaying.
func (c *Client[TTx]) RelayState() RelayState {
	run := c.running.Load()
	if run == nil {
		return RelayState{}
	}
	st := RelayState{Running: true}
	if f, ok := run.r.failing.oldest(); ok {
		st.Err, st.Since = f.err, f.since
	}
	return st
}

// Stats reports the state of the outbox.
func (c *Client[TTx]) Stats(ctx context.Context) (postboxdriver.Stats, error) {
	return c.store.Stats(ctx)
}

package pgsql

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

// Channel is the NOTIFY channel of the tables named with prefix: writers
// signal on it, relays listen on it.
func Channel(prefix string) string { return prefix + "outbox" }

// signalSQL sends a signal in a transaction of its own that does not wait
// for its WAL flush: a NOTIFY's transaction is given an xid and takes a
// database-wide lock until it has committed, so one that waited for its
// flush would make the signals as slow as a commit.
const signalSQL = `SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, $2)`

// newSignalID names the signals of one Core made by New (one Client's),
// so that its own relay, which that Client's writes wake directly, does
// not wake again for them.
func newSignalID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "client " + hex.EncodeToString(b[:])
}

// Signal implements postboxdriver.Signaler on the driver's pool. The
// payload is the Core's signal id, the partitions written since its last
// signal as a 64-bit mask in hexadecimal, so that a relay wakes only the
// lanes that read them, and "committed" when the writes had committed
// ("client 1f2e… 8000000000000401 committed").
func (c *Core) Signal(ctx context.Context, committed bool) error {
	if c.inTx {
		return postboxdriver.ErrNotInTx
	}
	payload := c.signalID + " " + strconv.FormatUint(c.written.Swap(0), 16)
	if committed {
		payload += " " + signalCommitted
	}
	_, err := c.db.Exec(ctx, signalSQL, Channel(c.prefix), payload)
	return err
}

// signalCommitted ends the payload of a signal whose writes had committed.
const signalCommitted = "committed"

// signalRelays follows the Core's signal id in the payload of a change
// among the relays (Coordinate): "client 1f2e… relays".
const signalRelays = "relays"

// readSignal reads a signal's payload: whether it is the Core's own, and
// what it says: writes, or a change among the relays. A signal sent with
// SQL, with any other payload, or with no partition recorded names every
// partition, and is not known to come after its writer's commit.
func (c *Core) readSignal(payload string) (own bool, h postboxdriver.Heard) {
	if !strings.HasPrefix(payload, "client ") {
		return false, h
	}
	id, rest, _ := strings.Cut(payload[len("client "):], " ")
	if c.signalID == "client "+id {
		return true, h
	}
	if rest == signalRelays {
		h.Relays = true
		return false, h
	}
	mask, flag, _ := strings.Cut(rest, " ")
	m, err := strconv.ParseUint(mask, 16, 64)
	if err != nil || m == 0 {
		return false, h
	}
	h.Committed = flag == signalCommitted
	for p := range Partitions {
		if m&(1<<p) != 0 {
			h.Partitions = append(h.Partitions, p)
		}
	}
	return false, h
}

// ListenConn is the one connection a relay listens on, of its own and
// outside any pool: the driver adapts its client's connection to it.
type ListenConn interface {
	Querier
	// Wait returns the payload of the next notification on the channels
	// the connection listens on.
	Wait(ctx context.Context) (string, error)
	Close(ctx context.Context) error
}

// probeWait is how long Listen waits for its probe: a signal it sends on
// another connection once listening, which proves the signals reach it.
const probeWait = 2 * time.Second

// Listen implements postboxdriver.Listener's Listen on conn, which it
// closes: LISTEN, then a probe sent through the pool (another
// connection), which must arrive within probeWait, then heard for each
// signal.
//
// Through a transaction pooler, LISTEN would run on a server connection
// that then goes on serving other clients, listening still: nobody would
// read its notifications, and PostgreSQL's notification queue, which
// cannot move past a listener, would grow until NOTIFY fails. So Listen
// first looks for a pooler as CheckConnections does, with conn as one of
// the two connections, and listens only when it finds none; should the
// probe still not arrive, it unlistens before it gives up.
func (c *Core) Listen(ctx context.Context, conn ListenConn, ready func(), heard func(postboxdriver.Heard)) error {
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	err := c.db.Pin(ctx, func(b Querier, _ bool) error {
		for range poolerRounds {
			pooled, err := serverMoved(ctx, conn, b)
			if err != nil {
				return err
			}
			if pooled {
				return fmt.Errorf("%w: a server connection changed hands between transactions of one client connection", postboxdriver.ErrNoSignals)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	ch := Channel(c.prefix)
	if _, err := conn.Exec(ctx, `LISTEN "`+ch+`"`); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	probe := "probe " + hex.EncodeToString(b[:])
	if _, err := c.db.Exec(ctx, signalSQL, ch, probe); err != nil {
		return fmt.Errorf("listen: send the probe: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, probeWait)
	defer cancel()
	for {
		p, err := conn.Wait(pctx)
		if err != nil {
			if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), probeWait)
				defer cancel()
				if _, uerr := conn.Exec(uctx, `UNLISTEN *`); uerr != nil {
					err = uerr
				}
				return fmt.Errorf("%w: the probe sent through the pool did not arrive within %s (%w)", postboxdriver.ErrNoSignals, probeWait, err)
			}
			return fmt.Errorf("listen: %w", err)
		}
		if p == probe {
			break
		}
		if own, h := c.readSignal(p); !own {
			heard(h) // another client's signal, before the probe
		}
	}
	ready()
	for {
		p, err := conn.Wait(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("listen: %w", err)
		}
		if own, h := c.readSignal(p); !own {
			heard(h)
		}
	}
}

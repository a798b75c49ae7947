//go:build faults

package faults

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/postbox-go/postbox"
)

// payload is what every message carries: its own id (to check that the
// broker's message id is the one made before the insert, G7), its key,
// its per-key sequence number in write order, whether the consumer must
// reject it, and whether it is a crash-looping message: one whose publish
// ends the relay process (crashRelay) or whose handler ends the consumer
// process (crashConsumer). The crash marker is the last field, so that
// the relays' broker proxies find the whole payload before it.
type payload struct {
	ID     string `json:"id"`
	Key    string `json:"key"`
	Seq    int    `json:"seq"`
	Poison bool   `json:"poison,omitempty"`
	Crash  string `json:"crash,omitempty"`
}

// The crash-looping messages (payload.Crash).
const (
	crashRelay    = "relay"
	crashConsumer = "consumer"
)

// Outcomes in the history.
const (
	committed  = "committed"
	rolledBack = "rolled_back"
	unknown    = "unknown" // Commit returned an error: settled later from the domain table
)

// histRec is one line of the history file: a message and what became of
// its transaction. A later line for the same id (Resolved) overrides.
type histRec struct {
	ID       string    `json:"id"`
	Key      string    `json:"key"`
	Seq      int       `json:"seq"`
	Poison   bool      `json:"poison,omitempty"`
	Crash    string    `json:"crash,omitempty"`
	Outcome  string    `json:"outcome"`
	At       time.Time `json:"at"` // when the writer saw the outcome
	Writer   int       `json:"writer"`
	Tx       int64     `json:"tx"`
	Note     string    `json:"note,omitempty"`
	Resolved bool      `json:"resolved,omitempty"`
}

// history appends records to a JSONL file as the writers go; the checker
// reads the file back, not this process's memory.
type history struct {
	path string
	mu   sync.Mutex
	f    *os.File
	w    *bufio.Writer
	enc  *json.Encoder
	txs  int64
	mem  map[string]histRec // for the settle wait and the unknown commits
}

func newHistory(path string) (*history, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	w := bufio.NewWriter(f)
	return &history{path: path, f: f, w: w, enc: json.NewEncoder(w), mem: map[string]histRec{}}, nil
}

func (h *history) add(recs ...histRec) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.txs++
	for _, r := range recs {
		r.Tx = h.txs
		_ = h.enc.Encode(r)
		h.mem[r.ID] = r
	}
}

func (h *history) resolve(r histRec) {
	h.mu.Lock()
	defer h.mu.Unlock()
	_ = h.enc.Encode(r)
	h.mem[r.ID] = r
}

func (h *history) transactions() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.txs
}

// committedRecs returns the committed messages.
func (h *history) committedRecs() map[string]histRec {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string]histRec{}
	for id, r := range h.mem {
		if r.Outcome == committed {
			out[id] = r
		}
	}
	return out
}

func (h *history) unknownIDs() []histRec {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []histRec
	for _, r := range h.mem {
		if r.Outcome == unknown {
			out = append(out, r)
		}
	}
	return out
}

func (h *history) close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return errors.Join(h.w.Flush(), h.f.Close())
}

// readHistory reads the history file: the final outcome of every message.
func readHistory(path string) (map[string]histRec, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]histRec{}
	dec := json.NewDecoder(f)
	for {
		var r histRec
		if err := dec.Decode(&r); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("history %s: %w", path, err)
		}
		out[r.ID] = r
	}
}

// writer commits and rolls back transactions until until. Each takes the
// row lock of one key's entity, so one key's writes are serialized and
// their order is the order of the per-key sequence numbers; its decisions
// come from a generator seeded from the run's seed.
func (h *harness) writer(ctx context.Context, n int, until time.Time) {
	rng := rand.New(rand.NewPCG(h.seed, uint64(n)+1))
	for (time.Now().Before(until) || h.injecting.Load()) && ctx.Err() == nil {
		key := fmt.Sprintf("k%04d", rng.IntN(h.prof.Keys))
		count := 1
		if rng.IntN(4) == 0 {
			count += 1 + rng.IntN(2)
		}
		poison := make([]bool, count)
		for i := range poison {
			poison[i] = rng.Float64() < h.prof.Poison
		}
		rollback := rng.Float64() < h.prof.Rollback
		pause := time.Duration(rng.Int64N(int64(h.prof.Pace) + 1))
		h.writeTx(ctx, n, key, poison, "", rollback)
		sleep(ctx, pause)
	}
}

// writeCrash commits one crash-looping message of kind (crashRelay or
// crashConsumer) on key, trying again for a while when the database is
// down, and says how it went.
func (h *harness) writeCrash(ctx context.Context, key, kind string) string {
	var out string
	for try := time.Now(); time.Since(try) < 20*time.Second && ctx.Err() == nil; {
		var id string
		if id, out = h.writeTx(ctx, -1, key, []bool{false}, kind, false); out == committed {
			return "committed " + id
		}
		sleep(ctx, 200*time.Millisecond)
	}
	return "not written: " + out
}

// writeTx writes one transaction of len(poison) messages on key, marked
// crash (all of them) when that is set, and commits it unless rollback.
// It returns the last message's id and the outcome.
func (h *harness) writeTx(ctx context.Context, n int, key string, poison []bool, crash string, rollback bool) (string, string) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	count := len(poison)
	tx, err := h.db.begin(ctx)
	if err != nil {
		h.writeErrs.Add(1)
		return "", "begin: " + err.Error()
	}
	defer func() { _ = tx.rollback(context.WithoutCancel(ctx)) }()
	last, err := tx.lock(ctx, key, count)
	if err != nil {
		h.writeErrs.Add(1)
		return "", "lock: " + err.Error()
	}
	recs := make([]histRec, count)
	msgs := make([]postbox.Message, count)
	ids, seqs := make([]string, count), make([]int, count)
	for i := range count {
		seq := last - count + 1 + i
		id := postbox.NewID()
		body, _ := json.Marshal(payload{ID: id, Key: key, Seq: seq, Poison: poison[i], Crash: crash})
		msgs[i] = postbox.Message{ID: id, Topic: h.writeTopic(), Key: key, Payload: body, ContentType: "application/json"}
		recs[i] = histRec{ID: id, Key: key, Seq: seq, Poison: poison[i], Crash: crash, Writer: n}
		ids[i], seqs[i] = id, seq
	}
	outcome, note := rolledBack, ""
	err = tx.write(ctx, key, msgs, seqs)
	switch {
	case err != nil:
		// Aborted: rolled back, so these must never be published either.
		h.writeErrs.Add(1)
		note = "aborted: " + err.Error()
		_ = tx.rollback(ctx)
	case rollback:
		if err := tx.rollback(ctx); err != nil {
			note = "rollback error: " + err.Error()
		}
	default:
		if err := tx.commit(ctx); err != nil {
			outcome, note = unknown, "commit error: "+err.Error()
		} else {
			outcome = committed
		}
	}
	now := time.Now()
	for i := range recs {
		recs[i].Outcome, recs[i].Note, recs[i].At = outcome, note, now
	}
	h.hist.add(recs...)
	return ids[count-1], outcome
}

// writeTopic is the topic the writers write to: the run's own when it
// has one (a shard's, shards_test.go), else topic.
func (h *harness) writeTopic() string {
	if h.topic != "" {
		return h.topic
	}
	return topic
}

// resolveUnknown settles commits whose outcome the writer could not see,
// from the domain rows written in the same transaction.
func (h *harness) resolveUnknown(ctx context.Context) {
	unknown := h.hist.unknownIDs()
	if len(unknown) == 0 {
		return
	}
	ids, err := h.db.column(ctx, "writes", "message_id", "")
	if err != nil {
		h.t.Errorf("resolve %d unknown commits: %v", len(unknown), err)
		return
	}
	written := map[string]bool{}
	for _, id := range ids {
		written[id] = true
	}
	for _, r := range unknown {
		r.Resolved = true
		r.Outcome = rolledBack
		if written[r.ID] {
			r.Outcome = committed
		}
		h.hist.resolve(r)
	}
}

// seen is one message as stored in the stream.
type seen struct {
	StreamSeq uint64
	MsgID     string // Nats-Msg-Id
	Subject   string
	P         payload
	Stored    time.Time // the server's timestamp: when it was stored and acknowledged
}

// watcher holds what the broker stored, as the broker's watch read it on
// a connection of its own (not through the proxy).
type watcher struct {
	mu      sync.Mutex
	msgs    []seen
	first   map[string]time.Time
	lastSeq uint64
}

// add records one stored copy, in the order the broker stored it.
func (w *watcher) add(s seen) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, s)
	if _, ok := w.first[s.MsgID]; !ok {
		w.first[s.MsgID] = s.Stored
	}
	w.lastSeq = s.StreamSeq
}

func (w *watcher) has(id string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.first[id]
	return ok
}

func (w *watcher) last() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastSeq
}

func (w *watcher) snapshot() []seen {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]seen(nil), w.msgs...)
}

//go:build faults

package faults

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"
)

// The checker judges a run from what the harness recorded on its own: the
// history file (every message and the fate of its transaction), the
// stream as the watcher read it, the consumer's effects table, and the
// process deaths each crash-looping message caused, as the supervisors
// recorded them. Of postbox's tables it reads only the consumer's dead
// letters and the relay's dead table, to check who is dead, never to
// decide what was committed, published or applied, nor how often a
// message crashed.

// violation is one broken rule.
type violation struct {
	Rule      string `json:"rule"`
	Guarantee string `json:"guarantee"`
	ID        string `json:"id,omitempty"`
	Key       string `json:"key,omitempty"`
	Detail    string `json:"detail"`
}

// recovery measures how the system came back from one fault. Times are
// the stream's own storage timestamps against the fault's start and lift.
type recovery struct {
	// BacklogAtStart counts messages committed before the fault and not
	// yet in the stream when it began.
	BacklogAtStart int `json:"backlog_at_start"`
	// FirstPublishMs is the time from the fault to the next message
	// stored in the stream (other relays may go on publishing).
	FirstPublishMs int64 `json:"first_publish_ms"`
	// BacklogDrainMs is the time from the fault until every message
	// committed before it is in the stream (0 when none was waiting);
	// for a crash it is about the lease. -1: never.
	BacklogDrainMs int64 `json:"backlog_drain_ms"`
	// DrainAfterLiftMs is the time from the fault's lift (restart, SIGCONT,
	// end of the loop or the hole) until every message committed before
	// the lift is in the stream; 0 when all were in by then. -1: never.
	DrainAfterLiftMs int64 `json:"drain_after_lift_ms"`
	// MaxLagMs is the longest commit-to-stored time of the messages
	// committed while the fault held, and up to 2s after.
	MaxLagMs int64 `json:"max_lag_ms"`
}

type counts struct {
	Transactions     int64 `json:"transactions"`
	Committed        int   `json:"committed"`
	CommittedPoison  int   `json:"committed_poison"`
	RolledBack       int   `json:"rolled_back"`
	Aborted          int   `json:"aborted"`
	UnknownResolved  int   `json:"unknown_commits_resolved"`
	WriteErrors      int64 `json:"write_errors"`
	StreamMessages   int   `json:"stream_messages"`
	StreamDistinct   int   `json:"stream_distinct"`
	StreamDuplicates int   `json:"stream_duplicates"`
	Effects          int   `json:"effects"`
	DupEffects       int   `json:"dup_effects"`
	ConsumerDead     int   `json:"consumer_dead_letters"`
	RelayDead        int   `json:"relay_dead"`
	OutboxPending    int64 `json:"outbox_pending_at_end"` // over the log, the log's too
	// LogRows are the rows in the log at the end, over the log: what the
	// writers put there and no record moved to the outbox.
	LogRows int `json:"log_rows_at_end,omitempty"`
	// The crash-looping messages committed, and the process deaths they
	// caused (relays killed, consumer exits).
	RelayCrashMessages    int `json:"relay_crash_messages"`
	ConsumerCrashMessages int `json:"consumer_crash_messages"`
	RelayCrashKills       int `json:"relay_crash_kills"`
	ConsumerCrashExits    int `json:"consumer_crash_exits"`
	// ApplyOrderAcrossRestart counts the per-key inversions of effects
	// that a consumer process's death excuses (apply_order).
	ApplyOrderAcrossRestart int `json:"apply_order_across_restart"`
}

// crashOutcome is what became of one crash-looping message.
type crashOutcome struct {
	ID   string `json:"id"`
	Kind string `json:"kind"` // relay or consumer
	Key  string `json:"key"`
	Seq  int    `json:"seq"`
	// Deaths counts the process deaths it caused; Bound is the most it
	// may cause, Unmarked of them in relays that had given up their
	// crash marks, Resent of them consumer runs of what the broker sent
	// again as a first delivery (consumerCrashBound).
	Deaths   int  `json:"deaths"`
	Bound    int  `json:"bound"`
	Unmarked int  `json:"unmarked,omitempty"`
	Resent   int  `json:"resent,omitempty"`
	Dead     bool `json:"dead"`
	// LaterApplied counts its key's later committed messages applied:
	// the key moved on.
	LaterApplied int `json:"later_applied"`
}

type lagStats struct {
	P50Ms int64 `json:"p50_ms"`
	P99Ms int64 `json:"p99_ms"`
	MaxMs int64 `json:"max_ms"`
}

type procStats struct {
	Starts          int        `json:"starts"`
	UnexpectedExits []string   `json:"unexpected_exits,omitempty"`
	Crashes         []crashRec `json:"crashes,omitempty"` // deaths a crash-looping message caused
	CleanStop       bool       `json:"clean_stop"`
}

type report struct {
	Pass           bool            `json:"pass"`
	Seed           uint64          `json:"seed"`
	Profile        profile         `json:"profile"`
	Broker         string          `json:"broker"`           // nats or rabbitmq
	Database       string          `json:"database"`         // PostgreSQL or MariaDB
	Storage        string          `json:"storage"`          // table or log (POSTBOX_FAULTS_STORAGE)
	Dedupe         string          `json:"dedupe"`           // broker or inbox: who drops the relays' re-sends
	Pooler         string          `json:"pooler,omitempty"` // pgbouncer when PostgreSQL was reached through one
	Started        time.Time       `json:"started"`
	Elapsed        string          `json:"elapsed"`
	Settled        bool            `json:"settled"`
	SettleMs       int64           `json:"settle_ms"` // from the writers' end until everything arrived
	Prefix         string          `json:"prefix"`
	Stream         string          `json:"stream"`
	Dir            string          `json:"dir"`
	Counts         counts          `json:"counts"`
	Lag            lagStats        `json:"lag"`
	FaultsByKind   map[string]int  `json:"faults_by_kind"`
	Faults         []*fault        `json:"faults"`
	Relays         []procStats     `json:"relays"`
	Consumer       procStats       `json:"consumer"`
	Crashes        []crashOutcome  `json:"crashes,omitempty"`
	ByRule         map[string]int  `json:"violations_by_rule"`
	ViolationCount int             `json:"violation_count"`
	Violations     []violation     `json:"violations"` // at most 20 per rule
	Notes          []string        `json:"notes,omitempty"`
	Fleet          *fleetReport    `json:"fleet,omitempty"`
	Failover       *failoverReport `json:"failover,omitempty"`
}

func (r *report) Summary() string {
	verdict := "PASS"
	if !r.Pass {
		verdict = "FAIL"
	}
	c := r.Counts
	kinds := make([]string, 0, len(r.FaultsByKind))
	for k, n := range r.FaultsByKind {
		kinds = append(kinds, fmt.Sprintf("%s×%d", k, n))
	}
	sort.Strings(kinds)
	var maxBacklog, maxLift int64
	for _, f := range r.Faults {
		if f.Recovery != nil {
			maxBacklog = max(maxBacklog, f.Recovery.BacklogDrainMs)
			maxLift = max(maxLift, f.Recovery.DrainAfterLiftMs)
		}
	}
	starts := 0
	exits := 0
	for _, rs := range r.Relays {
		starts += rs.Starts
		exits += len(rs.UnexpectedExits)
	}
	worst, resent := map[string]int{}, 0
	for _, co := range r.Crashes {
		worst[co.Kind] = max(worst[co.Kind], co.Deaths)
		resent += co.Resent
	}
	var fo string
	if f := r.Failover; f != nil {
		fo = fmt.Sprintf(" | failover (%s): promoted %dms after the kill, first commit %dms and first publish %dms after the promotion, forgotten commits %d (published %d), effects lost %d, async warning %v",
			f.Replication, f.KillToPromoteMs, f.FirstCommitMs, f.FirstPublishMs, f.Forgotten, f.ForgottenPublished, f.EffectsLost, f.AsyncWarning)
	}
	return fmt.Sprintf("%s seed=%d profile=%s database=%s storage=%s broker=%s dedupe=%s elapsed=%s | tx %d: committed %d (poison %d), rolled back %d (aborted %d), unknown resolved %d | "+
		"stream %d stored, %d distinct, %d duplicates | effects %d, double applications %d, consumer dead letters %d, relay dead %d | "+
		"crash-looping: relay %d (%d kills, at most %d for one, bound %d plus one per kill of a relay that gave up its crash marks), consumer %d (%d exits, at most %d for one, bound %d plus one per first delivery sent again, %d sent again; order inversions across its restarts %d) | "+
		"faults %d [%s], relay starts %d, unexpected exits %d | lag p50 %dms p99 %dms max %dms, worst backlog drain %dms, worst drain after a lift %dms, settled %v in %dms | violations %d %v",
		verdict, r.Seed, r.Profile.Name, r.Database, r.Storage, r.Broker, r.Dedupe, r.Elapsed, c.Transactions, c.Committed, c.CommittedPoison, c.RolledBack, c.Aborted, c.UnknownResolved,
		c.StreamMessages, c.StreamDistinct, c.StreamDuplicates, c.Effects, c.DupEffects, c.ConsumerDead, c.RelayDead,
		c.RelayCrashMessages, c.RelayCrashKills, worst[crashRelay], relayCrashBound, c.ConsumerCrashMessages, c.ConsumerCrashExits, worst[crashConsumer], consumerCrashBound, resent, c.ApplyOrderAcrossRestart,
		len(r.Faults), strings.Join(kinds, " "), starts, exits, r.Lag.P50Ms, r.Lag.P99Ms, r.Lag.MaxMs, maxBacklog, maxLift, r.Settled, r.SettleMs,
		r.ViolationCount, r.ByRule) + fo
}

type effectRow struct {
	ID, Key string
	Seq     int
	At      time.Time
}

// observed is everything the checker judges.
type observed struct {
	hist         map[string]histRec
	stream       []seen // in stream order
	effects      []effectRow
	dups         []string
	consumerDead []string
	relayDead    []string
	// noApplyOrder, when set, says why the effects are not held to per-key
	// order: the broker's subscriber does not promise it.
	noApplyOrder string
	// forgotten: commits a writer saw that the database no longer has
	// (a failover to a replica that had not received them).
	forgotten map[string]bool
	// crashes: the process deaths crash-looping messages caused, as the
	// harness recorded them (relays it killed, consumer exits).
	crashes []crashRec
	// giveUps: per relay life, when it gave up its crash marks, from its
	// log.
	giveUps map[string][]time.Time
}

// check gathers what the run left behind and judges it.
func (h *harness) check(ctx context.Context) *report {
	t := h.t
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	var o observed
	var err error
	if o.hist, err = readHistory(h.hist.path); err != nil {
		t.Fatalf("checker: %v", err)
	}
	o.stream = h.watch.snapshot()
	if err := writeJSONLines(filepath.Join(h.dir, "stream.jsonl"), o.stream); err != nil {
		t.Logf("checker: %v", err)
	}
	if !h.broker.perKeyDelivery() {
		o.noApplyOrder = h.broker.name() + "'s subscriber does not promise per-key order (a requeued delivery goes behind later ones); the broker's own order of first copies is still checked (stream_order)"
	}
	p := h.prefix
	if o.effects, err = h.db.effects(ctx); err != nil {
		t.Fatalf("checker: effects: %v", err)
	}
	strs := func(table, col, cond string) []string {
		out, err := h.db.column(ctx, table, col, cond)
		if err != nil {
			t.Fatalf("checker: %s.%s: %v", table, col, err)
		}
		return out
	}
	o.dups = strs("dup_effects", "message_id", "")
	o.consumerDead = strs("consumer_dead", "message_id", "consumer = '"+consumerName+"'")
	o.relayDead = strs("dead", "id", "")

	var faults []*fault
	if sched := h.faults(); sched != nil {
		faults = sched
	}
	if h.prof.Replica != "" {
		// After a failover, the domain row each writer committed with its
		// message says whether the new primary has the commit.
		kept := map[string]bool{}
		for _, id := range strs("writes", "message_id", "") {
			kept[id] = true
		}
		o.forgotten = map[string]bool{}
		for id, r := range o.hist {
			if r.Outcome == committed && !kept[id] {
				o.forgotten[id] = true
			}
		}
	}
	var logs []string
	for _, r := range append(append([]*proc(nil), h.relays...), h.consumer) {
		_, _, crashes := r.stats()
		o.crashes = append(o.crashes, crashes...)
		if r.idVar != "" {
			logs = append(logs, r.logs)
		}
	}
	if o.giveUps, err = giveUps(logs); err != nil {
		t.Fatalf("checker: relay logs: %v", err)
	}
	rep := judge(o, faults)
	h.judgeFailover(o, rep)
	rep.Counts.OutboxPending, _ = h.db.pending(ctx)
	if rep.Storage = h.storage; h.storage == storageLog {
		// A run over the log that left nothing in it did not test it.
		if rep.Counts.LogRows, err = h.db.count(ctx, "log"); err != nil || rep.Counts.LogRows == 0 {
			h.t.Errorf("faults: storage log, but the log holds %d rows at the end (%v)", rep.Counts.LogRows, err)
		}
	}
	rep.Counts.Transactions = h.hist.transactions()
	rep.Counts.WriteErrors = h.writeErrs.Load()
	rep.Seed, rep.Profile, rep.Started = h.seed, h.prof, h.started
	rep.Settled, rep.SettleMs = h.settled, h.settledAt.Sub(h.writersDone).Milliseconds()
	rep.Prefix, rep.Stream, rep.Dir, rep.Broker, rep.Database = p, h.broker.where(), h.dir, h.broker.name(), h.db.name()
	for i, r := range h.relays {
		starts, exits, crashes := r.stats()
		clean := i < len(h.cleanStops) && h.cleanStops[i]
		rep.Relays = append(rep.Relays, procStats{Starts: starts, UnexpectedExits: exits, Crashes: crashes, CleanStop: clean})
		if len(exits) > 0 {
			rep.Notes = append(rep.Notes, fmt.Sprintf("relay %d exited on its own %d times (see relay%d.log)", i, len(exits), i))
		}
		if !clean {
			rep.Notes = append(rep.Notes, fmt.Sprintf("relay %d did not stop cleanly on SIGTERM", i))
		}
	}
	starts, exits, crashes := h.consumer.stats()
	rep.Consumer = procStats{Starts: starts, UnexpectedExits: exits, Crashes: crashes, CleanStop: h.consumerClean}
	for _, e := range exits {
		rep.add("harness", "-", "", "", "the consumer process %s (see consumer.log)", e)
	}
	if !h.consumerClean {
		rep.add("harness", "-", "", "", "the consumer did not stop cleanly on SIGTERM (see consumer.log)")
	}
	if h.watcherErr != nil {
		rep.add("harness", "-", "", "", "the stream watcher stopped: %v", h.watcherErr)
	}
	if !h.settled {
		rep.add("harness", "-", "", "", "the run did not settle within the drain limit (what is missing is listed under the other rules)")
	}
	// A run that tested nothing must not pass for one that broke nothing.
	if rep.Counts.Committed == 0 {
		rep.add("harness", "-", "", "", "the writers committed nothing")
	}
	for _, f := range faults {
		if f.Start.IsZero() {
			rep.add("harness", "-", "", "", "scheduled fault never ran: %s", f)
		}
	}
	rep.Pass = rep.ViolationCount == rep.tolerated(h.prof.Tolerate)
	return rep
}

// tolerated counts the violations of the rules a profile expects.
func (r *report) tolerated(rules []string) int {
	n := 0
	for _, rule := range rules {
		n += r.ByRule[rule]
	}
	return n
}

func (h *harness) faults() []*fault { return h.sched }

// writeJSONLines writes one JSON value per line: the stream as the
// watcher read it, the lease polls, beside the history, so that a
// violation can be traced copy by copy.
func writeJSONLines[T any](path string, vs []T) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for _, v := range vs {
		if err := enc.Encode(v); err != nil {
			_ = f.Close()
			return err
		}
	}
	if err := w.Flush(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

func (r *report) add(rule, guarantee, id, key, format string, args ...any) {
	if r.ByRule == nil {
		r.ByRule = map[string]int{}
	}
	r.ViolationCount++
	r.ByRule[rule]++
	if r.ByRule[rule] <= 20 {
		r.Violations = append(r.Violations, violation{Rule: rule, Guarantee: guarantee, ID: id, Key: key, Detail: fmt.Sprintf(format, args...)})
	}
}

// beforeOrAfter says d, how long one time came before another, as "d
// before", or as "d after" when it came after.
func beforeOrAfter(d time.Duration) string {
	if d < 0 {
		return (-d).String() + " after"
	}
	return d.String() + " before"
}

// forgottenOutcome marks, inside judge, a commit the database forgot.
const forgottenOutcome = "forgotten"

// judge applies the rules. It is a pure function of what was observed.
// deathNoticed bounds how long after the harness reaps a consumer process
// the broker may still hand that process's pull requests a message.
const deathNoticed = 500 * time.Millisecond

func judge(o observed, faults []*fault) *report {
	r := &report{ByRule: map[string]int{}, FaultsByKind: map[string]int{}, Faults: faults}
	c := &r.Counts
	commitAt := map[string]time.Time{}
	if len(o.forgotten) > 0 {
		o.hist = maps.Clone(o.hist) // judge's own outcomes, below
	}
	for id, h := range o.hist {
		if h.Outcome == committed && o.forgotten[id] {
			// Neither committed nor rolled back any more: the database
			// forgot it. Its copies in the stream and its effect are
			// the loss, not a breach of the other rules.
			h.Outcome = forgottenOutcome
			o.hist[id] = h
			r.add("forgotten_commit", "G2 G5", id, h.Key, "key %s seq %d: the writer saw the commit at %s; the database no longer has it", h.Key, h.Seq, h.At.Format(time.RFC3339Nano))
			continue
		}
		switch h.Outcome {
		case committed:
			c.Committed++
			commitAt[id] = h.At
			if h.Poison {
				c.CommittedPoison++
			}
			switch h.Crash {
			case crashRelay:
				c.RelayCrashMessages++
			case crashConsumer:
				c.ConsumerCrashMessages++
			}
		case rolledBack:
			c.RolledBack++
			if strings.HasPrefix(h.Note, "aborted") {
				c.Aborted++
			}
		default:
			r.add("unresolved_commit", "-", id, h.Key, "the outcome of this commit could not be settled")
		}
		if h.Resolved {
			c.UnknownResolved++
		}
	}

	// The stream: no message of a rolled-back transaction (G1), one id
	// from the writer to the broker (G7), every committed message (G2),
	// each key's first copies in write order (G4).
	first := map[string]seen{}
	lastSeq := map[string]int{}
	lastStored := map[string]seen{} // the copy of lastSeq
	c.StreamMessages = len(o.stream)
	for _, s := range o.stream {
		if s.MsgID != s.P.ID {
			r.add("identity", "G7", s.MsgID, s.P.Key, "stream seq %d: Nats-Msg-Id %q but the payload was written with id %q", s.StreamSeq, s.MsgID, s.P.ID)
		}
		h, ok := o.hist[s.MsgID]
		switch {
		case !ok:
			r.add("unknown_published", "G1", s.MsgID, s.P.Key, "stream seq %d: no writer wrote this id", s.StreamSeq)
		case h.Outcome == rolledBack:
			r.add("rolled_back_published", "G1", s.MsgID, h.Key, "stream seq %d: published, but its transaction rolled back (%s)", s.StreamSeq, h.Note)
		case h.Crash == crashRelay:
			r.add("crash_published", "G2", s.MsgID, h.Key, "stream seq %d: a message that kills every relay publishing it reached the broker", s.StreamSeq)
		}
		if _, dup := first[s.MsgID]; dup {
			c.StreamDuplicates++
			continue
		}
		first[s.MsgID] = s
		if !ok || h.Outcome != committed {
			continue
		}
		if prev, had := lastSeq[h.Key]; had && h.Seq <= prev {
			// When each was stored and committed: how far apart the
			// copies were, and whether this one committed first.
			ps := lastStored[h.Key]
			r.add("stream_order", "G4", s.MsgID, h.Key, "stream seq %d: key %s seq %d first stored after seq %d (stream seq %d): stored %s after it, committed %s it",
				s.StreamSeq, h.Key, h.Seq, prev, ps.StreamSeq, s.Stored.Sub(ps.Stored), beforeOrAfter(o.hist[ps.MsgID].At.Sub(h.At)))
		}
		if h.Seq > lastSeq[h.Key] || lastStored[h.Key].MsgID == "" {
			lastSeq[h.Key], lastStored[h.Key] = h.Seq, s
		}
	}
	c.StreamDistinct = len(first)
	for id := range commitAt {
		if _, ok := first[id]; !ok && o.hist[id].Crash != crashRelay {
			h := o.hist[id]
			r.add("committed_not_published", "G2", id, h.Key, "key %s seq %d committed at %s, never stored in the stream", h.Key, h.Seq, h.At.Format(time.RFC3339Nano))
		}
	}

	// The effects: each committed message applied exactly once (G6), none
	// of a rolled-back transaction (G1), poison never, and per key in
	// write order.
	c.Effects, c.DupEffects = len(o.effects), len(o.dups)
	applied := map[string]bool{}
	byKey := map[string][]effectRow{}
	for _, e := range o.effects {
		applied[e.ID] = true
		h, ok := o.hist[e.ID]
		switch {
		case !ok:
			r.add("unknown_effect", "G6", e.ID, e.Key, "applied, but no writer wrote this id")
			continue
		case h.Outcome == rolledBack:
			r.add("rolled_back_applied", "G1", e.ID, h.Key, "applied, but its transaction rolled back")
		case h.Poison:
			r.add("poison_applied", "G6", e.ID, h.Key, "a poison message was applied")
		case h.Crash != "":
			r.add("crash_applied", "G6", e.ID, h.Key, "a crash-looping message (%s) was applied: a run that never returned committed", h.Crash)
		}
		if e.Key != h.Key || e.Seq != h.Seq {
			r.add("effect_mismatch", "G6", e.ID, h.Key, "effect says key %s seq %d, history key %s seq %d", e.Key, e.Seq, h.Key, h.Seq)
		}
		if h.Outcome == forgottenOutcome {
			// Its seq may be written again by a later commit on the new
			// primary: the order of what the database kept is checked.
			continue
		}
		byKey[h.Key] = append(byKey[h.Key], effectRow{ID: e.ID, Key: h.Key, Seq: h.Seq, At: e.At})
	}
	for _, id := range o.dups {
		r.add("applied_twice", "G6", id, o.hist[id].Key, "the handler's effect committed a second time")
	}
	for id := range commitAt {
		if h := o.hist[id]; !h.Poison && h.Crash == "" && !applied[id] {
			r.add("not_applied", "G2 G6", id, h.Key, "key %s seq %d committed, never applied", h.Key, h.Seq)
		}
	}
	if o.noApplyOrder != "" {
		r.Notes = append(r.Notes, "apply_order not checked: "+o.noApplyOrder)
		byKey = nil
	}
	// The subscriber keeps a key's order within one consumer process
	// (postboxnats: "Nor does it hold across a restart"): what a process
	// that died had pulled comes back after AckWait, behind what the next
	// one received meanwhile. An inversion is excused when both messages
	// were applied after a death of the consumer and the earlier one was
	// in the stream before it, or within deathNoticed after it, so that
	// the dead process may have held it: a death is recorded when the
	// harness reaps the process, and the broker goes on handing messages
	// to its pull requests until it reads the closed connection (a message
	// stored 4 ms after a reaped death came back AckWait later).
	var restarts []time.Time
	for _, cr := range o.crashes {
		if cr.Proc == "consumer" {
			restarts = append(restarts, cr.At)
		}
	}
	slices.SortFunc(restarts, func(a, b time.Time) int { return a.Compare(b) })
	acrossRestart := func(lower, higher effectRow) bool {
		s, ok := first[lower.ID]
		if !ok {
			return false
		}
		i, _ := slices.BinarySearchFunc(restarts, s.Stored.Add(-deathNoticed), func(a, b time.Time) int { return a.Compare(b) })
		return i < len(restarts) && restarts[i].Before(higher.At)
	}
	for key, es := range byKey {
		sort.SliceStable(es, func(i, j int) bool { return es[i].At.Before(es[j].At) })
		for i := 1; i < len(es); i++ {
			if es[i].Seq <= es[i-1].Seq && acrossRestart(es[i], es[i-1]) {
				c.ApplyOrderAcrossRestart++
				continue
			}
			if es[i].Seq <= es[i-1].Seq {
				r.add("apply_order", "G4", es[i].ID, key, "key %s seq %d applied at %s, after seq %d at %s",
					key, es[i].Seq, es[i].At.Format(time.RFC3339Nano), es[i-1].Seq, es[i-1].At.Format(time.RFC3339Nano))
			}
		}
	}

	// Dead letters: every committed poison message and every message
	// that kills the consumer, and nothing else, in the consumer's dead
	// letters; nothing but the messages that kill the relay dead at the
	// relay.
	c.ConsumerDead, c.RelayDead = len(o.consumerDead), len(o.relayDead)
	dead := map[string]bool{}
	for _, id := range o.consumerDead {
		dead[id] = true
		h, ok := o.hist[id]
		if !ok || h.Outcome != committed || !h.Poison && h.Crash != crashConsumer {
			r.add("unexpected_dead_letter", "G2 G6", id, h.Key, "dead-lettered by the consumer but not a committed poison message nor one that kills the consumer (outcome %q)", h.Outcome)
		}
	}
	for id := range commitAt {
		if h := o.hist[id]; h.Poison && !dead[id] {
			r.add("poison_not_dead", "G2", id, h.Key, "a committed poison message is not in the consumer's dead letters")
		}
	}
	relayDead := map[string]bool{}
	for _, id := range o.relayDead {
		relayDead[id] = true
		if h := o.hist[id]; h.Outcome != committed || h.Crash != crashRelay {
			r.add("relay_dead", "G2", id, h.Key, "the relay buried a message no broker rejected and no relay died publishing")
		}
	}
	judgeCrashes(r, o, commitAt, applied, map[string]map[string]bool{crashRelay: relayDead, crashConsumer: dead})

	// Latency from commit to the stream, overall and around each fault.
	// A message that kills the relay never reaches it.
	var lags []int64
	for id, at := range commitAt {
		if s, ok := first[id]; ok {
			lags = append(lags, max(s.Stored.Sub(at).Milliseconds(), 0))
		}
	}
	slices.Sort(lags)
	if n := len(lags); n > 0 {
		r.Lag = lagStats{P50Ms: lags[n/2], P99Ms: lags[min(n-1, n*99/100)], MaxMs: lags[n-1]}
	}
	stored := make([]time.Time, 0, len(first))
	for _, s := range first {
		stored = append(stored, s.Stored)
	}
	slices.SortFunc(stored, func(a, b time.Time) int { return a.Compare(b) })
	for _, f := range faults {
		if f.Start.IsZero() {
			continue
		}
		r.FaultsByKind[f.Kind]++
		rec := &recovery{FirstPublishMs: -1}
		if i, _ := slices.BinarySearchFunc(stored, f.Start, func(a, b time.Time) int { return a.Compare(b) }); i < len(stored) {
			rec.FirstPublishMs = stored[i].Sub(f.Start).Milliseconds()
		}
		backlog, lifted := f.Start, f.Lifted
		backlogMissing, liftMissing := false, false
		for id, at := range commitAt {
			s, ok := first[id]
			if at.Before(f.Start) {
				if !ok {
					backlogMissing = true
				} else if !s.Stored.Before(f.Start) {
					rec.BacklogAtStart++
					if s.Stored.After(backlog) {
						backlog = s.Stored
					}
				}
			}
			if at.Before(f.Lifted) {
				if !ok {
					liftMissing = true
				} else if s.Stored.After(lifted) {
					lifted = s.Stored
				}
			}
			if ok && !at.Before(f.Start) && at.Before(f.Lifted.Add(2*time.Second)) {
				rec.MaxLagMs = max(rec.MaxLagMs, s.Stored.Sub(at).Milliseconds())
			}
		}
		rec.BacklogDrainMs = backlog.Sub(f.Start).Milliseconds()
		if backlogMissing {
			rec.BacklogDrainMs = -1
		}
		rec.DrainAfterLiftMs = lifted.Sub(f.Lifted).Milliseconds()
		if liftMissing {
			rec.DrainAfterLiftMs = -1
		}
		f.Recovery = rec
	}
	return r
}

// judgeCrashes holds each committed crash-looping message to its bound:
// dead where its kind says (dead[kind]), after no more process deaths
// than the bound and at least one (else the fault tested nothing), never
// applied, its key's later messages applied. Every death the harness
// recorded must be a committed crash-looping message's of that kind.
func judgeCrashes(r *report, o observed, commitAt map[string]time.Time, applied map[string]bool, dead map[string]map[string]bool) {
	c := &r.Counts
	proc := map[string]string{crashRelay: "relay", crashConsumer: "consumer"}
	deaths, unmarked, firsts := map[string]int{}, map[string]int{}, map[string]int{}
	for _, cr := range o.crashes {
		h, ok := o.hist[cr.ID]
		kind := crashRelay
		if cr.Proc == "consumer" {
			kind = crashConsumer
			c.ConsumerCrashExits++
		} else {
			c.RelayCrashKills++
		}
		if !ok || h.Outcome != committed || h.Crash != kind {
			r.add("crash_unknown", "-", cr.ID, h.Key, "%s died at %s for %q, not a committed message that kills the %s", cr.Proc, cr.At.Format(time.RFC3339Nano), cr.ID, proc[kind])
			continue
		}
		deaths[cr.ID]++
		if kind == crashConsumer && cr.Delivered == 1 {
			firsts[cr.ID]++
		}
		if cr.Life != "" && slices.ContainsFunc(o.giveUps[cr.Life], func(at time.Time) bool { return at.Before(cr.At) }) {
			unmarked[cr.ID]++
		}
	}
	// Per key, its committed messages, to see that the key moved on.
	byKey := map[string][]histRec{}
	for id := range commitAt {
		h := o.hist[id]
		byKey[h.Key] = append(byKey[h.Key], h)
	}
	var ids []string
	for id := range commitAt {
		if o.hist[id].Crash != "" {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		h := o.hist[id]
		bound := map[string]int{crashRelay: relayCrashBound, crashConsumer: consumerCrashBound}[h.Crash]
		resent := max(firsts[id]-1, 0)
		co := crashOutcome{ID: id, Kind: h.Crash, Key: h.Key, Seq: h.Seq, Deaths: deaths[id], Bound: bound + unmarked[id] + resent, Unmarked: unmarked[id], Resent: resent, Dead: dead[h.Crash][id]}
		bound = co.Bound
		switch {
		case !co.Dead:
			r.add("crash_not_dead", "G2", id, h.Key, "a message that kills the %s (%d deaths) is not a dead message there", proc[h.Crash], co.Deaths)
		case co.Deaths > bound:
			r.add("crash_bound", "G2", id, h.Key, "a message that kills the %s caused %d deaths before it was dead; the bound is %d (%d of them in relays that had given up crash marks, %d on what the broker sent again as a first delivery)", proc[h.Crash], co.Deaths, bound, co.Unmarked, co.Resent)
		case co.Deaths == 0:
			r.add("crash_untested", "-", id, h.Key, "a message that kills the %s is dead without having killed one", proc[h.Crash])
		}
		for _, later := range byKey[h.Key] {
			if later.Seq <= h.Seq || later.Poison || later.Crash != "" {
				continue
			}
			if applied[later.ID] {
				co.LaterApplied++
			} else {
				r.add("crash_key_stuck", "G2", later.ID, h.Key, "key %s seq %d, after the message that kills the %s (seq %d), was never applied", h.Key, later.Seq, proc[h.Crash], h.Seq)
			}
		}
		r.Crashes = append(r.Crashes, co)
	}
}

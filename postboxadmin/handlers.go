package postboxadmin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/postbox-go/postbox"
)

// Default list sizes, as the CLI's.
const (
	defaultDeadLimit    = 100
	defaultReplaysLimit = 50
)

type statusJSON struct {
	Pending       int64 `json:"pending"`
	Dead          int64 `json:"dead"`
	PublishedKept int64 `json:"published_kept"`
	// PendingEstimated and PublishedKeptEstimated are set where the count
	// is the database's estimate (postboxdriver.Stats).
	PendingEstimated        bool    `json:"pending_estimated"`
	PublishedKeptEstimated  bool    `json:"published_kept_estimated"`
	OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
	// UnroutedPending counts the pending messages of topics no route of
	// the relay takes (Config.Routed); they are included in Pending.
	UnroutedPending int64       `json:"unrouted_pending"`
	Topics          []topicJSON `json:"topics"`
	// HeldSnapshot is null when no other session holds a snapshot (and
	// always on SQLite).
	HeldSnapshot *heldSnapshotJSON `json:"held_snapshot"`
	Partitions   partitionsJSON    `json:"partitions"`
	// Shards is every shard's state, when the server has them
	// (Config.Shards).
	Shards []shardJSON `json:"shards,omitempty"`
}

type shardJSON struct {
	Shard string    `json:"shard"`
	Up    bool      `json:"up"`
	Error string    `json:"error,omitempty"`
	Since time.Time `json:"since"`
}

// partitionsJSON is the state of the partitions' leases.
type partitionsJSON struct {
	Total   int          `json:"total"`
	Unowned int          `json:"unowned"`
	Relays  int          `json:"relays"`
	Holders []holderJSON `json:"holders"`
}

// holderJSON is a relay holding live leases.
type holderJSON struct {
	Relay      string `json:"relay"`
	Partitions []int  `json:"partitions"`
	// ExpiresIn is the time until the first of its leases expires unless
	// renewed, on the database clock.
	ExpiresIn float64 `json:"lease_expires_in_seconds"`
}

// holdersOf groups the live leases by relay, in relay order.
func holdersOf(p *postbox.PartitionStats) []holderJSON {
	out := []holderJSON{}
	at := map[string]int{}
	for _, l := range p.Leases {
		if l.Expired || l.Owner == "" {
			continue
		}
		left := max(l.ExpiresAt.Sub(p.Now).Seconds(), 0)
		i, ok := at[l.Owner]
		if !ok {
			i = len(out)
			at[l.Owner] = i
			out = append(out, holderJSON{Relay: l.Owner, ExpiresIn: left})
		}
		out[i].Partitions = append(out[i].Partitions, l.Partition)
		out[i].ExpiresIn = min(out[i].ExpiresIn, left)
	}
	slices.SortFunc(out, func(a, b holderJSON) int { return strings.Compare(a.Relay, b.Relay) })
	return out
}

type heldSnapshotJSON struct {
	AgeSeconds float64 `json:"age_seconds"`
	PID        int     `json:"pid"`
	State      string  `json:"state"`
}

type topicJSON struct {
	Topic                   string  `json:"topic"`
	Pending                 int64   `json:"pending"`
	Dead                    int64   `json:"dead"`
	OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
	PublishedLastMinute     int64   `json:"published_last_minute"`
	PublishLagSeconds       float64 `json:"publish_lag_seconds"`
	// Routed is false for a topic no route of the relay takes.
	Routed bool `json:"routed"`
}

func (s *Server) getStatus(w http.ResponseWriter, r *http.Request, _ principal) error {
	if _, err := query(r); err != nil {
		return err
	}
	st, err := s.status(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.statusOf(&st))
	return nil
}

// status reads the status and keeps a sample of it for the dashboard's
// charts.
func (s *Server) status(ctx context.Context) (postbox.Status, error) {
	st, err := s.cfg.Admin.Status(ctx)
	if err != nil {
		return st, err
	}
	s.samples.add(&st, time.Now())
	return st, nil
}

// statusOf is the status as the API answers it.
func (s *Server) statusOf(st *postbox.Status) statusJSON {
	out := statusJSON{Pending: st.Pending, Dead: st.Dead, PublishedKept: st.Published,
		PendingEstimated: st.PendingEstimated, PublishedKeptEstimated: st.PublishedEstimated,
		OldestPendingAgeSeconds: st.OldestPendingAge.Seconds(), Topics: make([]topicJSON, 0, len(st.Topics)),
		Partitions: partitionsJSON{Total: st.Partitions.Total, Unowned: st.Partitions.Unowned, Relays: st.Partitions.Relays, Holders: holdersOf(&st.Partitions)}}
	if h := st.HeldSnapshot; h != nil {
		out.HeldSnapshot = &heldSnapshotJSON{AgeSeconds: h.Age.Seconds(), PID: h.PID, State: h.State}
	}
	if s.cfg.Shards != nil {
		for _, sh := range s.cfg.Shards() {
			out.Shards = append(out.Shards, shardJSON{Shard: sh.Shard, Up: sh.Up, Error: sh.Error, Since: sh.Since.UTC()})
		}
	}
	for _, t := range st.Topics {
		routed := s.routed(t.Topic)
		if !routed {
			out.UnroutedPending += t.Pending
		}
		out.Topics = append(out.Topics, topicJSON{Topic: t.Topic, Pending: t.Pending, Dead: t.Dead,
			OldestPendingAgeSeconds: t.OldestPendingAge.Seconds(), PublishedLastMinute: t.PublishedLastMinute,
			PublishLagSeconds: t.PublishLagLastMinute.Seconds(), Routed: routed})
	}
	return out
}

// routed reports whether a relay routes topic (Config.Routed).
func (s *Server) routed(topic string) bool {
	return s.cfg.Routed == nil || s.cfg.Routed(topic)
}

// payloadJSON carries a payload twice: "payload" as base64 (JSON's
// encoding of bytes, lossless for any payload) and, when the payload is
// valid UTF-8, "payload_text" as the text itself.
type payloadJSON struct {
	Payload     []byte  `json:"payload"`
	PayloadText *string `json:"payload_text,omitempty"`
}

func payloadOf(p []byte) payloadJSON {
	out := payloadJSON{Payload: p}
	if p == nil {
		out.Payload = []byte{}
	}
	if utf8.Valid(p) {
		t := string(p)
		out.PayloadText = &t
	}
	return out
}

// headersJSON decodes stored headers; a column that is not a JSON object
// of strings (written by hand, say) is shown raw instead.
type headersJSON struct {
	Headers    map[string]string `json:"headers"`
	HeadersRaw string            `json:"headers_raw,omitempty"`
}

func headersOf(b []byte) headersJSON {
	h, err := postbox.DecodeHeaders(b)
	if err != nil {
		return headersJSON{Headers: map[string]string{}, HeadersRaw: string(b)}
	}
	return headersJSON{Headers: h}
}

type deadMessageJSON struct {
	Seq   int64  `json:"seq"`
	ID    string `json:"id"`
	Topic string `json:"topic"`
	Key   string `json:"key"`
	payloadJSON
	headersJSON
	Attempts  int       `json:"attempts"`
	LastError string    `json:"last_error"`
	CreatedAt time.Time `json:"created_at"`
	DeadAt    time.Time `json:"dead_at"`
}

func deadMessageOf(d *postbox.DeadMessage) deadMessageJSON {
	return deadMessageJSON{Seq: d.Seq, ID: d.ID, Topic: d.Topic, Key: d.Key, payloadJSON: payloadOf(d.Payload), headersJSON: headersOf(d.Headers),
		Attempts: d.Attempts, LastError: d.Error, CreatedAt: d.CreatedAt.UTC(), DeadAt: d.DeadAt.UTC()}
}

func (s *Server) listDead(w http.ResponseWriter, r *http.Request, _ principal) error {
	q, err := query(r, "topic", "key", "since", "until", "limit")
	if err != nil {
		return err
	}
	f, err := deadFilter(q.Get("topic"), q.Get("key"), q.Get("since"), q.Get("until"))
	if err != nil {
		return err
	}
	if f.Limit, err = parseLimit(q.Get("limit"), defaultDeadLimit); err != nil {
		return err
	}
	ds, err := s.cfg.Admin.ListDead(r.Context(), f)
	if err != nil {
		return err
	}
	out := make([]deadMessageJSON, 0, len(ds))
	for i := range ds {
		out = append(out, deadMessageOf(&ds[i]))
	}
	writeJSON(w, http.StatusOK, map[string]any{"messages": out})
	return nil
}

// deadFilter checks and converts the filter of the dead-message
// endpoints; postbox.Admin checks the rest (ids, the window's order).
func deadFilter(topic, key, since, until string) (postbox.DeadFilter, error) {
	if err := checkTopic(topic); err != nil {
		return postbox.DeadFilter{}, err
	}
	if err := checkKey(key); err != nil {
		return postbox.DeadFilter{}, err
	}
	now := time.Now()
	s, err := parseTime("since", since, now)
	if err != nil {
		return postbox.DeadFilter{}, err
	}
	u, err := parseTime("until", until, now)
	if err != nil {
		return postbox.DeadFilter{}, err
	}
	return postbox.DeadFilter{Topic: topic, Key: key, Since: s, Until: u}, nil
}

func (s *Server) getDead(w http.ResponseWriter, r *http.Request, _ principal) error {
	if _, err := query(r); err != nil {
		return err
	}
	id := r.PathValue("id")
	if id == "requeue" || id == "delete" {
		w.Header().Set("Allow", http.MethodPost)
		return &apiError{status: http.StatusMethodNotAllowed, msg: "method " + r.Method + " is not allowed on " + r.URL.Path + "; allowed: POST"}
	}
	d, err := s.cfg.Admin.GetDead(r.Context(), id)
	var ve *postbox.ValidationError
	if errors.As(err, &ve) {
		ve.Field = "id" // Admin names it ids[0], as one of a selection
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, deadMessageOf(&d))
	return nil
}

// selection reads the body of requeue and delete.
func selection(r *http.Request) (postbox.DeadSelection, error) {
	var b struct {
		ids                      []string
		topic, key, since, until string
		all                      bool
	}
	err := decodeBody(r, fields{"ids": &b.ids, "topic": &b.topic, "key": &b.key, "since": &b.since, "until": &b.until, "all": &b.all}, false)
	if err != nil {
		return postbox.DeadSelection{}, err
	}
	return selectionOf(b.ids, b.topic, b.key, b.since, b.until, b.all)
}

// selectionOf checks and converts a selection of the outbox's dead
// messages, from the API's body or the dashboard's form.
func selectionOf(ids []string, topic, key, since, until string, all bool) (postbox.DeadSelection, error) {
	f, err := deadFilter(topic, key, since, until)
	if err != nil {
		return postbox.DeadSelection{}, err
	}
	f.IDs = ids
	return postbox.DeadSelection{DeadFilter: f, All: all}, nil
}

func (s *Server) requeueDead(w http.ResponseWriter, r *http.Request, who principal) error {
	return s.bulk(w, r, who, "requeue", (*postbox.Admin).RequeueDead)
}

func (s *Server) deleteDead(w http.ResponseWriter, r *http.Request, who principal) error {
	return s.bulk(w, r, who, "delete", (*postbox.Admin).DeleteDead)
}

func (s *Server) bulk(w http.ResponseWriter, r *http.Request, who principal, verb string,
	op func(*postbox.Admin, context.Context, postbox.DeadSelection) (int, error)) error {
	if _, err := query(r); err != nil {
		return err
	}
	sel, err := selection(r)
	if err != nil {
		return err
	}
	n, err := s.applyBulk(r.Context(), who, verb, op, sel)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]int{"count": n})
	return nil
}

// applyBulk runs a requeue or delete of the outbox's dead messages for
// who, and logs it: the API's and the dashboard's one way to do either.
func (s *Server) applyBulk(ctx context.Context, who principal, verb string,
	op func(*postbox.Admin, context.Context, postbox.DeadSelection) (int, error), sel postbox.DeadSelection) (int, error) {
	n, err := op(s.cfg.Admin, ctx, sel)
	if err != nil {
		return 0, err
	}
	s.log.Info("postboxadmin: dead messages "+verb+"d", slog.String("actor", who.name), slog.Int("count", n),
		slog.Int("ids", len(sel.IDs)), slog.String("topic", sel.Topic), slog.String("key", sel.Key),
		slog.Time("since", sel.Since), slog.Time("until", sel.Until), slog.Bool("all", sel.All))
	return n, nil
}

type replayJSON struct {
	Count  int       `json:"count"`
	DryRun bool      `json:"dry_run"`
	AsNew  bool      `json:"as_new"`
	Since  time.Time `json:"since"`
	Until  time.Time `json:"until"`
	Topic  string    `json:"topic"`
	Key    string    `json:"key"`
	Actor  string    `json:"actor"`
	// Dropped counts the selected messages a broker would drop as copies
	// (published within its duplicate window); 0 for a replay as new.
	Dropped int `json:"dropped"`
	// Topics is the replay per topic, with the broker's duplicate window.
	Topics []replayTopicJSON `json:"topics"`
	// Notes say in words what the broker will do with the messages.
	Notes []string `json:"notes"`
}

type replayTopicJSON struct {
	Topic               string  `json:"topic"`
	Count               int     `json:"count"`
	DedupeWindowSeconds float64 `json:"dedupe_window_seconds"`
	DedupeBy            string  `json:"dedupe_by"`
	Dropped             int     `json:"dropped"`
}

// replayInput is a replay request as the API's body and the dashboard's
// form give it.
type replayInput struct {
	since, until, topic, key     string
	dryRun, asNew, acceptDropped bool
}

func (s *Server) replay(w http.ResponseWriter, r *http.Request, who principal) error {
	if _, err := query(r); err != nil {
		return err
	}
	var b replayInput
	if err := decodeBody(r, fields{"since": &b.since, "until": &b.until, "topic": &b.topic, "key": &b.key, "dry_run": &b.dryRun,
		"as_new": &b.asNew, "accept_dropped": &b.acceptDropped}, false); err != nil {
		return err
	}
	out, err := s.runReplay(r.Context(), who, b)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// runReplay checks and runs a replay for who: the preview of what the
// brokers will drop, the refusal while any would be, the replay (or its
// dry run) and the log line. The API and the dashboard both replay here.
func (s *Server) runReplay(ctx context.Context, who principal, b replayInput) (replayJSON, error) {
	if b.since == "" {
		return replayJSON{}, badRequest("since", `since is required: an RFC 3339 time or a duration ago ("2h", "7d")`)
	}
	if err := checkTopic(b.topic); err != nil {
		return replayJSON{}, err
	}
	if err := checkKey(b.key); err != nil {
		return replayJSON{}, err
	}
	now := time.Now()
	since, err := parseTime("since", b.since, now)
	if err != nil {
		return replayJSON{}, err
	}
	until, err := parseTime("until", b.until, now)
	if err != nil {
		return replayJSON{}, err
	}
	if until.IsZero() {
		until = now
	}
	req := postbox.ReplayRequest{Since: since, Until: until, Topic: b.topic, Key: b.key, DryRun: b.dryRun, AsNew: b.asNew, Actor: who.name}
	out := replayJSON{DryRun: b.dryRun, AsNew: b.asNew, Since: since.UTC(), Until: until.UTC(), Topic: b.topic, Key: b.key, Actor: who.name,
		Topics: []replayTopicJSON{}, Notes: []string{}}
	if !b.asNew {
		// Before anything changes: what the brokers will do with copies
		// under the same ids.
		p, err := s.cfg.Admin.ReplayPreview(ctx, req, s.cfg.DedupeWindow)
		if err != nil {
			return replayJSON{}, err
		}
		out.Dropped = p.Dropped()
		for _, t := range p.Topics {
			out.Topics = append(out.Topics, replayTopicJSON{Topic: t.Topic, Count: t.Count, DedupeWindowSeconds: t.Window.Seconds(),
				DedupeBy: t.Where, Dropped: t.Dropped})
			if t.Dropped > 0 {
				out.Notes = append(out.Notes, fmt.Sprintf("%s: %d of %d message(s) were published within the last %s, the duplicate window of %s: "+
					"sent again under their own ids, the broker drops them as copies; replay them as new messages (as_new) for consumers that must run again, "+
					"or replay after the window", t.Topic, t.Dropped, t.Count, t.Window, t.Where))
			}
		}
		if out.Dropped > 0 && !b.dryRun && !b.acceptDropped {
			return replayJSON{}, &apiError{status: http.StatusConflict, field: "as_new", msg: fmt.Sprintf("not replayed: %d of the %d message(s) would be dropped by the broker "+
				"as copies (%s); set \"as_new\": true to send them as new messages, or \"accept_dropped\": true to replay under their own ids anyway",
				out.Dropped, p.Count, strings.Join(out.Notes, "; "))}
		}
	}
	n, err := s.cfg.Admin.Replay(ctx, req)
	if err != nil {
		return replayJSON{}, err
	}
	out.Count = n
	switch {
	case b.asNew && b.dryRun:
		out.Notes = append(out.Notes, fmt.Sprintf("would send %d message(s) as new messages: fresh ids, the original id in the %s header; every consumer runs them again", n, postbox.HeaderReplayOf))
	case b.asNew:
		out.Notes = append(out.Notes, fmt.Sprintf("sent %d message(s) as new messages: fresh ids, the original id in the %s header; every consumer runs them again", n, postbox.HeaderReplayOf))
	case out.Dropped == 0:
		out.Notes = append(out.Notes, "under their own ids: consumers whose inbox holds an id run nothing; the others process the messages")
	}
	s.log.Info("postboxadmin: replay", slog.String("actor", who.name), slog.Int("count", n), slog.Bool("dry_run", b.dryRun), slog.Bool("as_new", b.asNew),
		slog.Int("dropped", out.Dropped), slog.Time("since", since), slog.Time("until", until), slog.String("topic", b.topic), slog.String("key", b.key))
	return out, nil
}

func (s *Server) listReplays(w http.ResponseWriter, r *http.Request, _ principal) error {
	as, err := s.replays(r)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"replays": as})
	return nil
}

// replays reads the replay audit, newest first, as many entries as the
// query's limit says, times in UTC.
func (s *Server) replays(r *http.Request) ([]postbox.ReplayAudit, error) {
	q, err := query(r, "limit")
	if err != nil {
		return nil, err
	}
	limit, err := parseLimit(q.Get("limit"), defaultReplaysLimit)
	if err != nil {
		return nil, err
	}
	as, err := s.cfg.Admin.Replays(r.Context(), limit)
	if err != nil {
		return nil, err
	}
	for i := range as {
		as[i].At, as[i].Since, as[i].Until = as[i].At.UTC(), as[i].Since.UTC(), as[i].Until.UTC()
	}
	if as == nil {
		as = []postbox.ReplayAudit{}
	}
	return as, nil
}

func (s *Server) prune(w http.ResponseWriter, r *http.Request, who principal) error {
	if _, err := query(r); err != nil {
		return err
	}
	if err := decodeBody(r, fields{}, true); err != nil {
		return err
	}
	n, err := s.cfg.Admin.Prune(r.Context(), nil)
	if err != nil {
		if n > 0 {
			s.log.Warn("postboxadmin: prune stopped early", slog.String("actor", who.name), slog.Int("deleted", n), slog.Any("error", err))
		}
		return err
	}
	s.log.Info("postboxadmin: prune", slog.String("actor", who.name), slog.Int("deleted", n))
	writeJSON(w, http.StatusOK, map[string]int{"deleted": n})
	return nil
}

type deadLetterJSON struct {
	Consumer  string `json:"consumer"`
	MessageID string `json:"message_id"`
	Topic     string `json:"topic"`
	Key       string `json:"key"`
	payloadJSON
	headersJSON
	Error          string    `json:"error"`
	Attempts       int       `json:"attempts"`
	FirstFailureAt time.Time `json:"first_failure_at"`
	LastFailureAt  time.Time `json:"last_failure_at"`
	DeadAt         time.Time `json:"dead_at"`
}

func deadLetterOf(d *postbox.DeadMessage) deadLetterJSON {
	return deadLetterJSON{Consumer: d.Consumer, MessageID: d.ID, Topic: d.Topic, Key: d.Key, payloadJSON: payloadOf(d.Payload),
		headersJSON: headersOf(d.Headers), Error: d.Error, Attempts: d.Attempts,
		FirstFailureAt: d.FirstFailureAt.UTC(), LastFailureAt: d.LastFailureAt.UTC(), DeadAt: d.DeadAt.UTC()}
}

var errNoConsumerDead = &apiError{status: http.StatusNotImplemented,
	msg: "consumers' dead messages are not served here: the server has no inbox configured (Config.ConsumerDead)"}

func (s *Server) listConsumerDead(w http.ResponseWriter, r *http.Request, _ principal) error {
	if s.cfg.ConsumerDead == nil {
		return errNoConsumerDead
	}
	q, err := query(r, "consumer", "topic", "key", "since", "until", "limit")
	if err != nil {
		return err
	}
	consumer := q.Get("consumer")
	if err := checkText("consumer", consumer, postbox.MaxConsumerNameBytes, true); err != nil {
		return err
	}
	f, err := deadFilter(q.Get("topic"), q.Get("key"), q.Get("since"), q.Get("until"))
	if err != nil {
		return err
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return badRequest("since", "since must be before until")
	}
	limit, err := parseLimit(q.Get("limit"), defaultDeadLimit)
	if err != nil {
		return err
	}
	ds, err := s.cfg.ConsumerDead.ListDead(r.Context(), postbox.DeadFilter{Consumer: consumer, Topic: f.Topic, Key: f.Key, Since: f.Since, Until: f.Until, Limit: limit})
	if err != nil {
		return err
	}
	out := make([]deadLetterJSON, 0, len(ds))
	for i := range ds {
		out = append(out, deadLetterOf(&ds[i]))
	}
	writeJSON(w, http.StatusOK, map[string]any{"dead_letters": out})
	return nil
}

// consumerPath checks the consumer and message id of a consumer dead message's path.
func (s *Server) consumerPath(r *http.Request) (consumer, id string, err error) {
	if s.cfg.ConsumerDead == nil {
		return "", "", errNoConsumerDead
	}
	if _, err := query(r); err != nil {
		return "", "", err
	}
	consumer, id = r.PathValue("consumer"), r.PathValue("id")
	if err := checkText("consumer", consumer, postbox.MaxConsumerNameBytes, false); err != nil {
		return "", "", err
	}
	if err := checkText("id", id, postbox.MaxDeliveryIDBytes, false); err != nil {
		return "", "", err
	}
	return consumer, id, nil
}

func (s *Server) getConsumerDead(w http.ResponseWriter, r *http.Request, _ principal) error {
	consumer, id, err := s.consumerPath(r)
	if err != nil {
		return err
	}
	d, err := s.cfg.ConsumerDead.GetDead(r.Context(), consumer, id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, deadLetterOf(&d))
	return nil
}

func (s *Server) deleteConsumerDead(w http.ResponseWriter, r *http.Request, who principal) error {
	consumer, id, err := s.consumerPath(r)
	if err != nil {
		return err
	}
	ok, err := s.cfg.ConsumerDead.DeleteDead(r.Context(), consumer, id)
	if err != nil {
		return err
	}
	if !ok {
		return &apiError{status: http.StatusNotFound, msg: "not found"}
	}
	s.log.Info("postboxadmin: consumer's dead message deleted", slog.String("actor", who.name), slog.String("consumer", consumer), slog.String("id", id))
	writeJSON(w, http.StatusOK, map[string]int{"count": 1})
	return nil
}

// consumerSelection reads the body of the consumers' requeue and delete:
// the outbox's selection, with "consumer", which ids need.
func consumerSelection(r *http.Request) (postbox.DeadSelection, error) {
	var b struct {
		ids                                []string
		consumer, topic, key, since, until string
		all                                bool
	}
	err := decodeBody(r, fields{"ids": &b.ids, "consumer": &b.consumer, "topic": &b.topic, "key": &b.key, "since": &b.since,
		"until": &b.until, "all": &b.all}, false)
	if err != nil {
		return postbox.DeadSelection{}, err
	}
	return consumerSelectionOf(b.ids, b.consumer, b.topic, b.key, b.since, b.until, b.all)
}

// consumerSelectionOf checks and converts a selection of consumers' dead
// messages, from the API's body or the dashboard's form.
func consumerSelectionOf(ids []string, consumer, topic, key, since, until string, all bool) (postbox.DeadSelection, error) {
	if err := checkText("consumer", consumer, postbox.MaxConsumerNameBytes, true); err != nil {
		return postbox.DeadSelection{}, err
	}
	for i, id := range ids {
		if err := checkText(fmt.Sprintf("ids[%d]", i), id, postbox.MaxDeliveryIDBytes, false); err != nil {
			return postbox.DeadSelection{}, err
		}
	}
	if len(ids) > 0 && consumer == "" {
		return postbox.DeadSelection{}, badRequest("consumer", `"consumer" is required with "ids": a message id is unique per consumer only`)
	}
	f, err := deadFilter(topic, key, since, until)
	if err != nil {
		return postbox.DeadSelection{}, err
	}
	f.IDs, f.Consumer = ids, consumer
	return postbox.DeadSelection{DeadFilter: f, All: all}, nil
}

// requeueConsumerDead asks for a requeue of the selected consumers' dead
// messages: the handler lives in the consuming service, whose running
// Inbox carries the request out (202: accepted, not done yet).
func (s *Server) requeueConsumerDead(w http.ResponseWriter, r *http.Request, who principal) error {
	return s.consumerBulk(w, r, who, "requeue requested", http.StatusAccepted, ConsumerDead.RequestRequeue)
}

func (s *Server) deleteConsumerDeadSelected(w http.ResponseWriter, r *http.Request, who principal) error {
	return s.consumerBulk(w, r, who, "deleted", http.StatusOK, ConsumerDead.DeleteDeadSelected)
}

func (s *Server) consumerBulk(w http.ResponseWriter, r *http.Request, who principal, done string, status int,
	op func(ConsumerDead, context.Context, postbox.DeadSelection) (int, error)) error {
	if s.cfg.ConsumerDead == nil {
		return errNoConsumerDead
	}
	if _, err := query(r); err != nil {
		return err
	}
	sel, err := consumerSelection(r)
	if err != nil {
		return err
	}
	n, err := s.applyConsumerBulk(r.Context(), who, done, op, sel)
	if err != nil {
		return err
	}
	writeJSON(w, status, map[string]int{"count": n})
	return nil
}

// applyConsumerBulk runs a requeue request or delete of consumers' dead
// messages for who, and logs it.
func (s *Server) applyConsumerBulk(ctx context.Context, who principal, done string,
	op func(ConsumerDead, context.Context, postbox.DeadSelection) (int, error), sel postbox.DeadSelection) (int, error) {
	n, err := op(s.cfg.ConsumerDead, ctx, sel)
	if err != nil {
		return 0, err
	}
	s.log.Info("postboxadmin: consumers' dead messages "+done, slog.String("actor", who.name), slog.Int("count", n),
		slog.String("consumer", sel.Consumer), slog.Int("ids", len(sel.IDs)), slog.String("topic", sel.Topic), slog.String("key", sel.Key),
		slog.Time("since", sel.Since), slog.Time("until", sel.Until), slog.Bool("all", sel.All))
	return n, nil
}

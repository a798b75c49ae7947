package postboxadmin

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/postbox-go/postbox"
)

// The dashboard's dead messages (the outbox's and the consumers'), and
// replay. Every change goes GET form → GET confirmation (which counts what
// it will change and fixes relative times) → POST with the session's CSRF
// token → result, through the same functions as the API.

// filterView is a list filter as the form shows it.
type filterView struct {
	Consumer, Topic, Key, Since, Until, Limit string
}

// Empty reports whether no filter field is set.
func (f filterView) Empty() bool {
	return f.Consumer == "" && f.Topic == "" && f.Key == "" && f.Since == "" && f.Until == ""
}

func filterOf(q url.Values) filterView {
	return filterView{Consumer: q.Get("consumer"), Topic: q.Get("topic"), Key: q.Get("key"), Since: q.Get("since"), Until: q.Get("until"), Limit: q.Get("limit")}
}

// listView is a list page's data.
type listView struct {
	Filter   filterView
	Messages []messageView
	// Limit is the list's bound; Full is set when the list reached it.
	Limit int
	Full  bool
}

// messageView is one dead message, outbox's or consumer's.
type messageView struct {
	postbox.DeadMessage
	Payload    payloadView
	Headers    headersJSON
	HeaderKeys []string
}

func messageViewOf(d *postbox.DeadMessage) messageView {
	h := headersOf(d.Headers)
	keys := make([]string, 0, len(h.Headers))
	for k := range h.Headers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return messageView{DeadMessage: *d, Payload: payloadViewOf(d.Payload), Headers: h, HeaderKeys: keys}
}

func (s *Server) deadListPage(w http.ResponseWriter, r *http.Request, v *view) error {
	q, err := query(r, "topic", "key", "since", "until", "limit")
	if err != nil {
		return err
	}
	fv := filterOf(q)
	f, err := deadFilter(fv.Topic, fv.Key, fv.Since, fv.Until)
	if err != nil {
		return err
	}
	if f.Limit, err = parseLimit(fv.Limit, defaultDeadLimit); err != nil {
		return err
	}
	ds, err := s.cfg.Admin.ListDead(r.Context(), f)
	if err != nil {
		return err
	}
	v.Title, v.Data = "Dead messages", listOf(fv, ds, f.Limit)
	s.render(w, http.StatusOK, "dead", v)
	return nil
}

func listOf(fv filterView, ds []postbox.DeadMessage, limit int) listView {
	out := listView{Filter: fv, Limit: limit, Full: len(ds) >= limit}
	for i := range ds {
		out.Messages = append(out.Messages, messageViewOf(&ds[i]))
	}
	return out
}

func (s *Server) deadShowPage(w http.ResponseWriter, r *http.Request, v *view) error {
	q, err := query(r, "id")
	if err != nil {
		return err
	}
	d, err := s.cfg.Admin.GetDead(r.Context(), q.Get("id"))
	if err != nil {
		return err
	}
	v.Title, v.Data = "Dead message "+d.ID, messageViewOf(&d)
	s.render(w, http.StatusOK, "dead_show", v)
	return nil
}

// confirmView is a confirmation page's data: what will be done to how
// many messages, and the selection, times fixed, for the form.
type confirmView struct {
	Action   string // "requeue" or "delete"
	Verb     string // in words
	Count    int
	AtLeast  bool // Count reached confirmCountLimit
	Sample   []messageView
	IDs      []string
	Filter   filterView
	All      bool
	Consumer bool
}

// selectionForm reads a selection from a form or query: ids, consumer,
// topic, key, since, until, all.
func selectionForm(q url.Values) (ids []string, fv filterView, all bool) {
	for _, id := range q["ids"] {
		if id = strings.TrimSpace(id); id != "" {
			ids = append(ids, id)
		}
	}
	return ids, filterOf(q), q.Get("all") == "on"
}

// errNothingSelected refuses a confirmation with neither ids nor a filter.
var errNothingSelected = badRequest("ids", "no messages selected: tick messages in the list, give a filter, or choose every dead message")

// fixTimes turns relative times ("2h") into the times they mean now, so
// that the action changes what the confirmation counted.
func fixTimes(fv *filterView, sel *postbox.DeadSelection) {
	if !sel.Since.IsZero() {
		fv.Since = sel.Since.UTC().Format(time.RFC3339Nano)
	}
	if !sel.Until.IsZero() {
		fv.Until = sel.Until.UTC().Format(time.RFC3339Nano)
	}
}

func confirmAction(q url.Values) (action, verb string, err error) {
	switch q.Get("action") {
	case "requeue":
		return "requeue", "Requeue", nil
	case "delete":
		return "delete", "Delete", nil
	}
	return "", "", badRequest("action", `action must be "requeue" or "delete"`)
}

func (s *Server) deadConfirmPage(w http.ResponseWriter, r *http.Request, v *view) error {
	q, err := queryList(r, "ids", "action", "ids", "topic", "key", "since", "until", "all")
	if err != nil {
		return err
	}
	action, verb, err := confirmAction(q)
	if err != nil {
		return err
	}
	ids, fv, all := selectionForm(q)
	sel, err := selectionOf(ids, fv.Topic, fv.Key, fv.Since, fv.Until, all)
	if err != nil {
		return err
	}
	if len(ids) == 0 && fv.Empty() && !all {
		return errNothingSelected
	}
	f := sel.DeadFilter
	f.Limit = confirmCountLimit
	ds, err := s.cfg.Admin.ListDead(r.Context(), f)
	if err != nil {
		return err
	}
	fixTimes(&fv, &sel)
	v.Title, v.Data = verb+" dead messages", confirmOf(action, verb, ds, ids, fv, all, false)
	s.render(w, http.StatusOK, "confirm", v)
	return nil
}

func confirmOf(action, verb string, ds []postbox.DeadMessage, ids []string, fv filterView, all, consumer bool) confirmView {
	c := confirmView{Action: action, Verb: verb, Count: len(ds), AtLeast: len(ds) >= confirmCountLimit, IDs: ids, Filter: fv, All: all, Consumer: consumer}
	for i := range ds[:min(len(ds), dashboardRows)] {
		c.Sample = append(c.Sample, messageViewOf(&ds[i]))
	}
	return c
}

// resultView is an action's result page.
type resultView struct {
	Message string
	Back    string // the list to go back to, under Base
}

func (s *Server) deadActPage(w http.ResponseWriter, r *http.Request, v *view) error {
	ids, fv, all := selectionForm(r.PostForm)
	sel, err := selectionOf(ids, fv.Topic, fv.Key, fv.Since, fv.Until, all)
	if err != nil {
		return err
	}
	who := v.Who
	var res resultView
	if strings.HasSuffix(r.URL.Path, "/requeue") {
		n, err := s.applyBulk(r.Context(), who, "requeue", (*postbox.Admin).RequeueDead, sel)
		if err != nil {
			return err
		}
		res.Message = plural(n, "dead message") + " requeued: the relay publishes them again, in order among their keys' messages."
	} else {
		n, err := s.applyBulk(r.Context(), who, "delete", (*postbox.Admin).DeleteDead, sel)
		if err != nil {
			return err
		}
		res.Message = plural(n, "dead message") + " deleted."
	}
	res.Back = "/dead"
	v.Title, v.Data = "Done", res
	s.render(w, http.StatusOK, "result", v)
	return nil
}

func (s *Server) consumerListPage(w http.ResponseWriter, r *http.Request, v *view) error {
	if s.cfg.ConsumerDead == nil {
		return errNoConsumerDead
	}
	q, err := query(r, "consumer", "topic", "key", "since", "until", "limit")
	if err != nil {
		return err
	}
	fv := filterOf(q)
	sel, err := consumerSelectionOf(nil, fv.Consumer, fv.Topic, fv.Key, fv.Since, fv.Until, false)
	if err != nil {
		return err
	}
	f := sel.DeadFilter
	if f.Limit, err = parseLimit(fv.Limit, defaultDeadLimit); err != nil {
		return err
	}
	ds, err := s.cfg.ConsumerDead.ListDead(r.Context(), f)
	if err != nil {
		return err
	}
	v.Title, v.Data = "Consumers' dead messages", listOf(fv, ds, f.Limit)
	s.render(w, http.StatusOK, "consumers", v)
	return nil
}

func (s *Server) consumerShowPage(w http.ResponseWriter, r *http.Request, v *view) error {
	if s.cfg.ConsumerDead == nil {
		return errNoConsumerDead
	}
	q, err := query(r, "consumer", "id")
	if err != nil {
		return err
	}
	consumer, id := q.Get("consumer"), q.Get("id")
	if _, err := consumerSelectionOf([]string{id}, consumer, "", "", "", "", false); err != nil {
		return err
	}
	d, err := s.cfg.ConsumerDead.GetDead(r.Context(), consumer, id)
	if err != nil {
		return err
	}
	v.Title, v.Data = "Consumer "+d.Consumer+": dead message "+d.ID, messageViewOf(&d)
	s.render(w, http.StatusOK, "consumer_show", v)
	return nil
}

func (s *Server) consumerConfirmPage(w http.ResponseWriter, r *http.Request, v *view) error {
	if s.cfg.ConsumerDead == nil {
		return errNoConsumerDead
	}
	q, err := queryList(r, "ids", "action", "ids", "consumer", "topic", "key", "since", "until", "all")
	if err != nil {
		return err
	}
	action, verb, err := confirmAction(q)
	if err != nil {
		return err
	}
	ids, fv, all := selectionForm(q)
	sel, err := consumerSelectionOf(ids, fv.Consumer, fv.Topic, fv.Key, fv.Since, fv.Until, all)
	if err != nil {
		return err
	}
	if len(ids) == 0 && fv.Empty() && !all {
		return errNothingSelected
	}
	f := sel.DeadFilter
	f.Limit = confirmCountLimit
	ds, err := s.cfg.ConsumerDead.ListDead(r.Context(), f)
	if err != nil {
		return err
	}
	fixTimes(&fv, &sel)
	v.Title, v.Data = verb+" consumers' dead messages", confirmOf(action, verb, ds, ids, fv, all, true)
	s.render(w, http.StatusOK, "confirm", v)
	return nil
}

func (s *Server) consumerActPage(w http.ResponseWriter, r *http.Request, v *view) error {
	if s.cfg.ConsumerDead == nil {
		return errNoConsumerDead
	}
	ids, fv, all := selectionForm(r.PostForm)
	sel, err := consumerSelectionOf(ids, fv.Consumer, fv.Topic, fv.Key, fv.Since, fv.Until, all)
	if err != nil {
		return err
	}
	var res resultView
	if strings.HasSuffix(r.URL.Path, "/requeue") {
		n, err := s.applyConsumerBulk(r.Context(), v.Who, "requeue requested", ConsumerDead.RequestRequeue, sel)
		if err != nil {
			return err
		}
		res.Message = "Requeue asked for " + plural(n, "dead message") +
			": each consumer's running Inbox runs its handler on them at its next poll, and they leave this list once handled."
	} else {
		n, err := s.applyConsumerBulk(r.Context(), v.Who, "deleted", ConsumerDead.DeleteDeadSelected, sel)
		if err != nil {
			return err
		}
		res.Message = plural(n, "consumer's dead message") + " deleted."
	}
	res.Back = "/consumers"
	v.Title, v.Data = "Done", res
	s.render(w, http.StatusOK, "result", v)
	return nil
}

// replayView is the replay pages' data.
type replayView struct {
	Since, Until, Topic, Key string
	// Preview is the dry run's answer (nil on the form); Result the real
	// run's.
	Preview *replayJSON
	Result  *replayJSON
	Audit   []postbox.ReplayAudit
}

func (s *Server) replayFormPage(w http.ResponseWriter, r *http.Request, v *view) error {
	q, err := query(r, "since", "until", "topic", "key")
	if err != nil {
		return err
	}
	as, err := s.cfg.Admin.Replays(r.Context(), 5)
	if err != nil {
		return err
	}
	v.Title = "Replay"
	v.Data = replayView{Since: q.Get("since"), Until: q.Get("until"), Topic: q.Get("topic"), Key: q.Get("key"), Audit: as}
	s.render(w, http.StatusOK, "replay", v)
	return nil
}

// replayForm reads the replay form.
func replayForm(f url.Values) replayInput {
	return replayInput{since: f.Get("since"), until: f.Get("until"), topic: f.Get("topic"), key: f.Get("key"),
		asNew: f.Get("mode") == "new", acceptDropped: f.Get("accept_dropped") == "on"}
}

// replayPreviewPage runs the dry run: the count, per topic, and what the
// brokers' duplicate windows will do, before the confirmation.
func (s *Server) replayPreviewPage(w http.ResponseWriter, r *http.Request, v *view) error {
	in := replayForm(r.PostForm)
	in.dryRun, in.asNew, in.acceptDropped = true, false, false
	p, err := s.runReplay(r.Context(), v.Who, in)
	if err != nil {
		return err
	}
	v.Title = "Replay: dry run"
	v.Data = replayView{Since: p.Since.Format(time.RFC3339Nano), Until: p.Until.Format(time.RFC3339Nano), Topic: p.Topic, Key: p.Key, Preview: &p}
	s.render(w, http.StatusOK, "replay", v)
	return nil
}

func (s *Server) replayRunPage(w http.ResponseWriter, r *http.Request, v *view) error {
	in := replayForm(r.PostForm)
	res, err := s.runReplay(r.Context(), v.Who, in)
	if err != nil {
		return err
	}
	v.Title = "Replay: done"
	v.Data = replayView{Since: res.Since.Format(time.RFC3339Nano), Until: res.Until.Format(time.RFC3339Nano), Topic: res.Topic, Key: res.Key, Result: &res}
	s.render(w, http.StatusOK, "replay", v)
	return nil
}

func (s *Server) replaysPage(w http.ResponseWriter, r *http.Request, v *view) error {
	q, err := query(r, "limit")
	if err != nil {
		return err
	}
	limit, err := parseLimit(q.Get("limit"), defaultReplaysLimit)
	if err != nil {
		return err
	}
	as, err := s.cfg.Admin.Replays(r.Context(), limit)
	if err != nil {
		return err
	}
	v.Title, v.Data = "Replay audit", replayView{Audit: as}
	s.render(w, http.StatusOK, "replays", v)
	return nil
}

// plural is "1 thing" or "n things".
func plural(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return strconv.Itoa(n) + " " + thing + "s"
}

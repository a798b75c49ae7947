package postboxadmin

import (
	"context"
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

// deadSide is one side's dead messages as the dashboard lists and acts
// on them: the outbox's (Admin) or the consumers' (ConsumerDead). Both
// go through the functions of the API's handlers.
type deadSide struct {
	// page is the list's template and path; consumer marks the consumers'
	// side, whose filter and selection name a consumer too.
	page     string
	consumer bool
	list     func(ctx context.Context, f postbox.DeadFilter) ([]postbox.DeadMessage, error)
	// selection checks a selection as the API's body would be checked.
	selection func(ids []string, fv filterView, all bool) (postbox.DeadSelection, error)
	// requeue and remove change a selection for who, and say what they did.
	requeue, remove func(ctx context.Context, who principal, sel postbox.DeadSelection) (string, error)
}

func (s *Server) outboxSide() (*deadSide, error) {
	return &deadSide{page: "dead", list: s.cfg.Admin.ListDead,
		selection: func(ids []string, fv filterView, all bool) (postbox.DeadSelection, error) {
			return selectionOf(ids, fv.Topic, fv.Key, fv.Since, fv.Until, all)
		},
		requeue: func(ctx context.Context, who principal, sel postbox.DeadSelection) (string, error) {
			n, err := s.applyBulk(ctx, who, "requeue", (*postbox.Admin).RequeueDead, sel)
			return plural(n, "dead message") + " requeued: the relay publishes them again, in order among their keys' messages.", err
		},
		remove: func(ctx context.Context, who principal, sel postbox.DeadSelection) (string, error) {
			n, err := s.applyBulk(ctx, who, "delete", (*postbox.Admin).DeleteDead, sel)
			return plural(n, "dead message") + " deleted.", err
		}}, nil
}

func (s *Server) consumerSide() (*deadSide, error) {
	if s.cfg.ConsumerDead == nil {
		return nil, errNoConsumerDead
	}
	return &deadSide{page: "consumers", consumer: true, list: s.cfg.ConsumerDead.ListDead,
		selection: func(ids []string, fv filterView, all bool) (postbox.DeadSelection, error) {
			return consumerSelectionOf(ids, fv.Consumer, fv.Topic, fv.Key, fv.Since, fv.Until, all)
		},
		requeue: func(ctx context.Context, who principal, sel postbox.DeadSelection) (string, error) {
			n, err := s.applyConsumerBulk(ctx, who, "requeue requested", ConsumerDead.RequestRequeue, sel)
			return "Requeue asked for " + plural(n, "dead message") +
				": each consumer's running Inbox runs its handler on them at its next poll, and they leave this list once handled.", err
		},
		remove: func(ctx context.Context, who principal, sel postbox.DeadSelection) (string, error) {
			n, err := s.applyConsumerBulk(ctx, who, "deleted", ConsumerDead.DeleteDeadSelected, sel)
			return plural(n, "consumer dead message") + " deleted.", err
		}}, nil
}

// filterParams are the query parameters of a side's list.
func (d *deadSide) filterParams() []string {
	ps := []string{"topic", "key", "since", "until"}
	if d.consumer {
		ps = append(ps, "consumer")
	}
	return ps
}

// listPage lists a side's dead messages by the filter of the query.
func (s *Server) listPage(side func() (*deadSide, error)) pageHandler {
	return func(w http.ResponseWriter, r *http.Request, v *view) error {
		d, err := side()
		if err != nil {
			return err
		}
		q, err := query(r, append(d.filterParams(), "limit")...)
		if err != nil {
			return err
		}
		fv := filterOf(q)
		sel, err := d.selection(nil, fv, false)
		if err != nil {
			return err
		}
		f := sel.DeadFilter
		if f.Limit, err = parseLimit(fv.Limit, defaultDeadLimit); err != nil {
			return err
		}
		ds, err := d.list(r.Context(), f)
		if err != nil {
			return err
		}
		v.Title, v.Data = "Dead messages", listOf(fv, ds, f.Limit)
		if d.consumer {
			v.Title = "Consumers' dead messages"
		}
		s.render(w, http.StatusOK, d.page, v)
		return nil
	}
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

// confirmPage counts what a requeue or delete of a side's selection will
// change, and shows the form that does it.
func (s *Server) confirmPage(side func() (*deadSide, error)) pageHandler {
	return func(w http.ResponseWriter, r *http.Request, v *view) error {
		d, err := side()
		if err != nil {
			return err
		}
		q, err := queryList(r, "ids", append(d.filterParams(), "action", "ids", "all")...)
		if err != nil {
			return err
		}
		action, verb, err := confirmAction(q)
		if err != nil {
			return err
		}
		ids, fv, all := selectionForm(q)
		sel, err := d.selection(ids, fv, all)
		if err != nil {
			return err
		}
		if len(ids) == 0 && fv.Empty() && !all {
			return errNothingSelected
		}
		f := sel.DeadFilter
		f.Limit = confirmCountLimit
		ds, err := d.list(r.Context(), f)
		if err != nil {
			return err
		}
		fixTimes(&fv, &sel)
		c := confirmView{Action: action, Verb: verb, Count: len(ds), AtLeast: len(ds) >= confirmCountLimit, IDs: ids, Filter: fv, All: all, Consumer: d.consumer}
		for i := range ds[:min(len(ds), dashboardRows)] {
			c.Sample = append(c.Sample, messageViewOf(&ds[i]))
		}
		v.Title, v.Data = verb+" dead messages", c
		if d.consumer {
			v.Title = verb + " consumers' dead messages"
		}
		s.render(w, http.StatusOK, "confirm", v)
		return nil
	}
}

// resultView is an action's result page.
type resultView struct {
	Message string
	Back    string // the list to go back to, under Base
}

// actPage requeues or deletes a side's selection, as the confirmation's
// form posts it.
func (s *Server) actPage(side func() (*deadSide, error)) pageHandler {
	return func(w http.ResponseWriter, r *http.Request, v *view) error {
		d, err := side()
		if err != nil {
			return err
		}
		sel, err := d.selection(selectionForm(r.PostForm))
		if err != nil {
			return err
		}
		act := d.remove
		if strings.HasSuffix(r.URL.Path, "/requeue") {
			act = d.requeue
		}
		msg, err := act(r.Context(), v.Who, sel)
		if err != nil {
			return err
		}
		v.Title, v.Data = "Done", resultView{Message: msg, Back: "/" + d.page}
		s.render(w, http.StatusOK, "result", v)
		return nil
	}
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

// replayPage runs a replay from the form: a dry run (the count, per
// topic, and what the brokers' duplicate windows will do) before the
// confirmation, or the replay the confirmation asks for.
func (s *Server) replayPage(dryRun bool) pageHandler {
	return func(w http.ResponseWriter, r *http.Request, v *view) error {
		in := replayForm(r.PostForm)
		if dryRun {
			in.dryRun, in.asNew, in.acceptDropped = true, false, false
		}
		out, err := s.runReplay(r.Context(), v.Who, in)
		if err != nil {
			return err
		}
		d := replayView{Since: out.Since.Format(time.RFC3339Nano), Until: out.Until.Format(time.RFC3339Nano), Topic: out.Topic, Key: out.Key}
		if dryRun {
			v.Title, d.Preview = "Replay: dry run", &out
		} else {
			v.Title, d.Result = "Replay: done", &out
		}
		v.Data = d
		s.render(w, http.StatusOK, "replay", v)
		return nil
	}
}

func (s *Server) replaysPage(w http.ResponseWriter, r *http.Request, v *view) error {
	as, err := s.replays(r)
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

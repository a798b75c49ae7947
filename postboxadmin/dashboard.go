package postboxadmin

import (
	"bytes"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/configcheck"
)

// The dashboard: HTML pages over the same operations as the API, for a
// browser. Pages are plain server-rendered HTML with forms, readable and
// usable without JavaScript; one small script (static/dashboard.js)
// refreshes the overview from GET /v1/status. Everything is embedded: no
// asset comes from anywhere but this server, and the Content-Security-
// Policy says so.

//go:embed all:dashboard
var dashboardFS embed.FS

// dashboardRows bounds the overview's lists; a list page shows up to
// its limit (default 100).
const dashboardRows = 20

// refreshEvery is how often the overview's script reads the status.
const refreshEvery = 5 * time.Second

// confirmCountLimit bounds the count a confirmation page reads; past it
// the page says "at least".
const confirmCountLimit = 10_000

const dashboardCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'self'; base-uri 'none'; frame-ancestors 'none'"

var pageFuncs = template.FuncMap{
	"age": func(d time.Duration) string { return d.Round(time.Millisecond).String() },
	"secs": func(s float64) string {
		return (time.Duration(s * float64(time.Second))).Round(time.Millisecond).String()
	},
	"when": func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(time.RFC3339)
	},
	"cut":     func(s string) string { return configcheck.ShortenTo(s, 120) },
	"chart":   chartSVG,
	"ranges":  ranges,
	"summary": chartSummary,
}

// ranges writes sorted partition numbers as ranges: "0-3, 7, 9-10".
func ranges(ps []int) string {
	var out []string
	for i := 0; i < len(ps); {
		j := i
		for j+1 < len(ps) && ps[j+1] == ps[j]+1 {
			j++
		}
		if j == i {
			out = append(out, strconv.Itoa(ps[i]))
		} else {
			out = append(out, strconv.Itoa(ps[i])+"-"+strconv.Itoa(ps[j]))
		}
		i = j + 1
	}
	return strings.Join(out, ", ")
}

// pages are the dashboard's templates: each page's file with the layout
// and the parts pages share (files named _*.html).
var pages = func() map[string]*template.Template {
	layout := template.Must(template.New("layout.html").Funcs(pageFuncs).ParseFS(dashboardFS, "dashboard/layout.html", "dashboard/_*.html"))
	names, err := fs.Glob(dashboardFS, "dashboard/*.html")
	if err != nil {
		panic(err)
	}
	out := map[string]*template.Template{}
	for _, n := range names {
		name := strings.TrimSuffix(strings.TrimPrefix(n, "dashboard/"), ".html")
		if name == "layout" || strings.HasPrefix(name, "_") {
			continue
		}
		out[name] = template.Must(template.Must(layout.Clone()).ParseFS(dashboardFS, n))
	}
	return out
}()

// DashboardLink is another database's dashboard, served beside this one
// (the relay daemon serves one per database), for the overview's list.
type DashboardLink struct {
	// Name is shown; Path is the dashboard's path ("/shards/1/").
	Name, Path string
	// Current marks this server's own entry.
	Current bool
}

// view is what every page template gets.
type view struct {
	Title string
	// Base is the path the server is mounted under ("" at the root,
	// "/shards/1" behind the daemon's prefix): every link starts with it.
	Base string
	// Who is the signed-in actor, Actor and Scope its name and scope;
	// SignedIn is false without tokens.
	Who      principal
	Actor    string
	Scope    Scope
	SignedIn bool
	// CanAct is true for the admin scope: the page shows its actions.
	CanAct bool
	CSRF   string
	Nav    string // the current section, for aria-current
	Now    time.Time
	Data   any
}

// pageHandler is a dashboard page: it renders, or returns an error that
// failPage turns into an HTML page.
type pageHandler func(w http.ResponseWriter, r *http.Request, v *view) error

func (s *Server) dashboardRoutes() {
	s.page("GET /{$}", ScopeRead, "overview", s.overviewPage)
	s.page("GET /dead", ScopeRead, "dead", s.listPage(s.outboxSide))
	s.page("GET /dead/show", ScopeRead, "dead", s.deadShowPage)
	s.page("GET /dead/confirm", ScopeAdmin, "dead", s.confirmPage(s.outboxSide))
	s.page("POST /dead/requeue", ScopeAdmin, "dead", s.actPage(s.outboxSide))
	s.page("POST /dead/delete", ScopeAdmin, "dead", s.actPage(s.outboxSide))
	s.page("GET /consumers", ScopeRead, "consumers", s.listPage(s.consumerSide))
	s.page("GET /consumers/show", ScopeRead, "consumers", s.consumerShowPage)
	s.page("GET /consumers/confirm", ScopeAdmin, "consumers", s.confirmPage(s.consumerSide))
	s.page("POST /consumers/requeue", ScopeAdmin, "consumers", s.actPage(s.consumerSide))
	s.page("POST /consumers/delete", ScopeAdmin, "consumers", s.actPage(s.consumerSide))
	s.page("GET /replay", ScopeRead, "replay", s.replayFormPage)
	s.page("POST /replay/preview", ScopeAdmin, "replay", s.replayPage(true))
	s.page("POST /replay/run", ScopeAdmin, "replay", s.replayPage(false))
	s.page("GET /replays", ScopeRead, "replays", s.replaysPage)
	s.page("POST /signout", ScopeRead, "", s.signOut)
	s.mux.HandleFunc("GET /signin", s.signInForm)
	s.mux.HandleFunc("POST /signin", s.signIn)
	s.mux.HandleFunc("GET /static/{file}", s.static)
}

// page registers a dashboard page behind a session of scope need, with
// the CSRF check on every POST.
func (s *Server) page(pattern string, need Scope, nav string, h pageHandler) {
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		v := &view{Base: basePath(r), Nav: nav, Now: time.Now()}
		if err := s.pageAuth(w, r, need, v); err != nil {
			s.failPage(w, r, v, err)
			return
		}
		if err := h(w, r, v); err != nil {
			s.failPage(w, r, v, err)
		}
	})
}

// errSignIn sends a browser without a session to the sign-in form.
var errSignIn = errors.New("sign in")

// pageAuth finds the request's session, checks its scope, and on a POST
// its origin and its CSRF token. Without tokens configured, a loopback
// browser gets a session of its own on its first page, as the carrier of
// its CSRF token.
func (s *Server) pageAuth(w http.ResponseWriter, r *http.Request, need Scope, v *view) error {
	sess, _, ok := s.sessionOf(r)
	if len(s.tokens) == 0 {
		who, err := s.authenticate(r, need)
		if err != nil {
			return err
		}
		if !ok {
			if r.Method != http.MethodGet {
				return &apiError{status: http.StatusForbidden, msg: "this form's session has ended: reload the page and try again"}
			}
			var id string
			id, sess = s.sessions.create(who.name, who.scope)
			s.setSessionCookie(w, r, id, sess)
		}
	} else {
		if !ok {
			if r.Method == http.MethodGet {
				return errSignIn
			}
			return &apiError{status: http.StatusUnauthorized, msg: "you are signed out (the session ended or the server restarted): sign in again"}
		}
		v.SignedIn = true
	}
	v.Who, v.Actor, v.Scope = principal{name: sess.name, scope: sess.scope}, sess.name, sess.scope
	v.CSRF, v.CanAct = sess.csrf, sess.scope.allows(ScopeAdmin)
	if !sess.scope.allows(need) {
		return &apiError{status: http.StatusForbidden, msg: fmt.Sprintf("%s has the %s scope, which can see but not act: this needs the %s scope; sign in with an admin token", sess.name, sess.scope, need)}
	}
	if r.Method == http.MethodPost {
		if err := s.cop.Check(r); err != nil {
			return &apiError{status: http.StatusForbidden, msg: "cross-origin request refused"}
		}
		r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
		if err := r.ParseForm(); err != nil {
			return badRequest("", "could not read the form: %v", err)
		}
		got := r.PostForm.Get(csrfField)
		if got == "" {
			got = r.Header.Get(csrfHeader)
		}
		if !sess.checkCSRF(got) {
			return &apiError{status: http.StatusForbidden, msg: "the form's CSRF token does not match your session: reload the page and try again"}
		}
	}
	return nil
}

// basePath is the path the server is mounted under: the request's path
// as sent, less the path the server sees (http.StripPrefix).
func basePath(r *http.Request) string {
	u, err := url.ParseRequestURI(r.RequestURI)
	if err != nil || r.RequestURI == "" {
		return ""
	}
	base := strings.TrimSuffix(u.Path, r.URL.Path)
	// Links and redirects start with it: never a scheme-relative or
	// odd path that a browser could read as another host.
	if base != "" && (!strings.HasPrefix(base, "/") || strings.HasPrefix(base, "//") || strings.ContainsAny(base, "\\\r\n\"'<>")) {
		return ""
	}
	return base
}

// errorView is an error page's data.
type errorView struct {
	Status    int
	Message   string
	Field     string
	RequestID string
}

// failPage answers a page request with an HTML error page; without a
// session, a GET goes to the sign-in form instead.
func (s *Server) failPage(w http.ResponseWriter, r *http.Request, v *view, err error) {
	if errors.Is(err, errSignIn) {
		http.Redirect(w, r, v.Base+"/signin?next="+url.QueryEscape(v.Base+r.URL.RequestURI()), http.StatusSeeOther)
		return
	}
	ae, id := s.classify(r, err)
	v.Title = http.StatusText(ae.status)
	v.Data = errorView{Status: ae.status, Message: ae.msg, Field: ae.field, RequestID: id}
	s.render(w, ae.status, "error", v)
}

// render writes page with v.
func (s *Server) render(w http.ResponseWriter, status int, page string, v *view) {
	var buf bytes.Buffer
	if err := pages[page].Execute(&buf, v); err != nil {
		s.log.Error("postboxadmin: page failed", slog.String("page", page), slog.Any("error", err))
		http.Error(w, "internal error; the server log has the detail", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", dashboardCSP)
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	w.WriteHeader(status)
	_, _ = buf.WriteTo(w)
}

// static serves the dashboard's script and style sheet.
func (s *Server) static(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("file")
	var ctype string
	switch {
	case strings.HasSuffix(name, ".js"):
		ctype = "text/javascript; charset=utf-8"
	case strings.HasSuffix(name, ".css"):
		ctype = "text/css; charset=utf-8"
	}
	b, err := dashboardFS.ReadFile("dashboard/static/" + name)
	if err != nil || ctype == "" || strings.ContainsAny(name, "/\\") {
		s.fail(w, r, &apiError{status: http.StatusNotFound, msg: "not found"})
		return
	}
	h := w.Header()
	h.Set("Content-Type", ctype)
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(b) //nolint:gosec // an embedded file, served with its own type and nosniff
}

// signInView is the sign-in form's data.
type signInView struct {
	Next    string
	Problem string
}

func (s *Server) signInForm(w http.ResponseWriter, r *http.Request) {
	v := &view{Title: "Sign in", Base: basePath(r), Now: time.Now()}
	if len(s.tokens) == 0 {
		http.Redirect(w, r, v.Base+"/", http.StatusSeeOther) //nolint:gosec // basePath keeps Base a local path
		return
	}
	v.Data = signInView{Next: safeNext(r.URL.Query().Get("next"), v.Base)}
	s.render(w, http.StatusOK, "signin", v)
}

// signIn trades a token posted from the form for a session.
func (s *Server) signIn(w http.ResponseWriter, r *http.Request) {
	v := &view{Title: "Sign in", Base: basePath(r), Now: time.Now()}
	if len(s.tokens) == 0 {
		http.Redirect(w, r, v.Base+"/", http.StatusSeeOther) //nolint:gosec // basePath keeps Base a local path
		return
	}
	if err := s.cop.Check(r); err != nil {
		s.failPage(w, r, v, &apiError{status: http.StatusForbidden, msg: "cross-origin request refused"})
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
	if err := r.ParseForm(); err != nil {
		s.failPage(w, r, v, badRequest("", "could not read the form: %v", err))
		return
	}
	next := safeNext(r.PostForm.Get("next"), v.Base)
	t, ok := s.matchToken(strings.TrimSpace(r.PostForm.Get("token")))
	if !ok {
		s.log.Info("postboxadmin: dashboard sign-in refused", slog.String("remote", r.RemoteAddr))
		v.Data = signInView{Next: next, Problem: "That token is not one this server accepts."}
		s.render(w, http.StatusUnauthorized, "signin", v)
		return
	}
	id, sess := s.sessions.create(t.name, t.scope)
	s.setSessionCookie(w, r, id, sess)
	s.log.Info("postboxadmin: dashboard sign-in", slog.String("actor", t.name), slog.String("scope", string(t.scope)))
	http.Redirect(w, r, next, http.StatusSeeOther) //nolint:gosec // safeNext keeps next a local path
}

func (s *Server) signOut(w http.ResponseWriter, r *http.Request, v *view) error {
	if _, id, ok := s.sessionOf(r); ok {
		s.sessions.end(id)
	}
	s.clearSessionCookie(w, r)
	target := v.Base + "/signin"
	if len(s.tokens) == 0 {
		target = v.Base + "/"
	}
	http.Redirect(w, r, target, http.StatusSeeOther)
	return nil
}

// safeNext keeps a redirect after sign-in on this server: a path under
// base, never another host ("//evil.example", "/\evil.example").
func safeNext(next, base string) string {
	if !strings.HasPrefix(next, base+"/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return base + "/"
	}
	return next
}

// overviewView is the overview's data.
type overviewView struct {
	Status       statusJSON
	Samples      []sample
	Charts       []chartView
	Shards       []DashboardLink
	HasConsumers bool
	Letters      []postbox.DeadMessage
	ConsumerErr  string
	RefreshMS    int64
}

// chartView is one chart of the overview.
type chartView struct {
	ID, Label, Unit string
	Values          []float64
}

func (s *Server) overviewPage(w http.ResponseWriter, r *http.Request, v *view) error {
	if _, err := query(r); err != nil {
		return err
	}
	ctx := r.Context()
	st, err := s.status(ctx)
	if err != nil {
		return err
	}
	d := overviewView{Status: s.statusOf(&st), Samples: s.samples.all(), Shards: s.cfg.Dashboards, RefreshMS: refreshEvery.Milliseconds()}
	series := func(f func(sample) float64) []float64 {
		out := make([]float64, len(d.Samples))
		for i, smp := range d.Samples {
			out[i] = f(smp)
		}
		return out
	}
	d.Charts = []chartView{
		{ID: "pending", Label: "Pending messages", Values: series(func(x sample) float64 { return float64(x.Pending) })},
		{ID: "oldest_age", Label: "Oldest pending age", Unit: "s", Values: series(func(x sample) float64 { return x.OldestAge })},
		{ID: "rate", Label: "Published per second (last minute)", Unit: "/s", Values: series(func(x sample) float64 { return x.Rate })},
		{ID: "lag", Label: "Commit to ack, longest in the last minute", Unit: "s", Values: series(func(x sample) float64 { return x.Lag })},
	}
	if s.cfg.ConsumerDead != nil {
		d.HasConsumers = true
		if d.Letters, err = s.cfg.ConsumerDead.ListDead(ctx, postbox.DeadFilter{Limit: dashboardRows}); err != nil {
			return err
		}
	}
	v.Title, v.Data = "Overview", d
	s.render(w, http.StatusOK, "overview", v)
	return nil
}

// chartSVG draws values as a line in a small inline SVG, with the latest,
// lowest and highest values in words (in the title, for screen readers,
// and beside the chart).
func chartSVG(c chartView) template.HTML {
	const wd, ht = 300.0, 60.0
	var b strings.Builder
	lo, hi := 0.0, 0.0
	for _, x := range c.Values {
		hi = math.Max(hi, x)
	}
	summary := c.Label + ": " + chartSummary(c)
	fmt.Fprintf(&b, `<svg class="chart" id="chart-%s" viewBox="0 0 %g %g" role="img" aria-label="%s" preserveAspectRatio="none">`,
		template.HTMLEscapeString(c.ID), wd, ht, template.HTMLEscapeString(summary))
	fmt.Fprintf(&b, `<title>%s</title>`, template.HTMLEscapeString(summary))
	if len(c.Values) > 0 {
		b.WriteString(`<polyline fill="none" stroke="currentColor" stroke-width="1.5" points="`)
		span := hi - lo
		if span == 0 {
			span = 1
		}
		for i, x := range c.Values {
			px := wd
			if len(c.Values) > 1 {
				px = float64(i) * wd / float64(len(c.Values)-1)
			}
			py := ht - 2 - (x-lo)/span*(ht-4)
			fmt.Fprintf(&b, "%.1f,%.1f ", px, py)
		}
		b.WriteString(`"/>`)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // built from numbers and escaped text only
}

// chartSummary says a chart's latest and highest values in words.
func chartSummary(c chartView) string {
	last, hi := 0.0, 0.0
	for _, x := range c.Values {
		hi = math.Max(hi, x)
	}
	if n := len(c.Values); n > 0 {
		last = c.Values[n-1]
	}
	return fmt.Sprintf("now %s%s, highest %s%s over %d samples", num(last), c.Unit, num(hi), c.Unit, len(c.Values))
}

// num formats a chart value briefly.
func num(x float64) string {
	return strconv.FormatFloat(x, 'g', 4, 64)
}

// payloadView shows a payload safely: as text when it is valid UTF-8,
// else as hex and base64. The template escapes either.
type payloadView struct {
	Text   string
	IsText bool
	Hex    string
	Base64 string
	Size   int
}

func payloadViewOf(p []byte) payloadView {
	out := payloadView{Size: len(p), Base64: base64.StdEncoding.EncodeToString(p)}
	if utf8.Valid(p) {
		out.Text, out.IsText = string(p), true
		return out
	}
	out.Hex = hex.Dump(p)
	return out
}

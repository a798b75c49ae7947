package postboxadmin

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	_ "embed" // the OpenAPI document
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxdriver"
)

// openAPI is the API's OpenAPI 3.1 document, served at
// GET /v1/openapi.json.
//
//go:embed openapi.json
var openAPI []byte

// OpenAPI returns the admin API's OpenAPI 3.1 document (JSON): every
// endpoint, its parameters, bodies, answers and errors, for generating a
// client. The server also serves it at GET /v1/openapi.json.
func OpenAPI() []byte { return append([]byte(nil), openAPI...) }

// Server is the admin HTTP API. It is safe for concurrent use.
type Server struct {
	// patterns are the mux patterns of the endpoints, in registration
	// order (for the tests that hold the OpenAPI document to them).
	patterns []string
	cfg      *Config
	log      *slog.Logger
	tokens   []tokenEntry
	mux      *http.ServeMux
	cop      *http.CrossOriginProtection
	ready    func(ctx context.Context) error
	sessions *Sessions
	samples  *samples
}

type tokenEntry struct {
	digest [sha256.Size]byte
	name   string
	scope  Scope
}

// principal is who a request runs as; its name is the actor of changes.
type principal struct {
	name  string
	scope Scope
}

// handlerFunc is an endpoint: it writes its response, or returns an error
// that fail turns into one.
type handlerFunc func(w http.ResponseWriter, r *http.Request, who principal) error

// New returns a Server for cfg, or a *postbox.ConfigError naming every bad
// field.
func New(cfg *Config) (*Server, error) {
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: c, log: c.Logger, mux: http.NewServeMux(), cop: http.NewCrossOriginProtection(), ready: c.Ready,
		sessions: c.Sessions, samples: newSamples(sampleCount)}
	if s.sessions == nil {
		s.sessions = NewSessions(0)
	}
	for _, t := range c.Tokens {
		s.tokens = append(s.tokens, tokenEntry{digest: sha256.Sum256([]byte(t.Value)), name: t.Name, scope: t.Scope})
	}
	if s.ready == nil {
		s.ready = s.defaultReady
	}
	s.routes()
	return s, nil
}

func (s *Server) routes() {
	s.route("GET /v1/status", ScopeRead, s.getStatus)
	s.route("GET /v1/dead", ScopeRead, s.listDead)
	s.route("GET /v1/dead/{id}", ScopeRead, s.getDead)
	s.route("POST /v1/dead/requeue", ScopeAdmin, s.requeueDead)
	s.route("POST /v1/dead/delete", ScopeAdmin, s.deleteDead)
	s.route("POST /v1/replay", ScopeAdmin, s.replay)
	s.route("GET /v1/replays", ScopeRead, s.listReplays)
	s.route("POST /v1/prune", ScopeAdmin, s.prune)
	s.route("GET /v1/consumers/dead", ScopeRead, s.listConsumerDead)
	s.route("POST /v1/consumers/dead/requeue", ScopeAdmin, s.requeueConsumerDead)
	s.route("POST /v1/consumers/dead/delete", ScopeAdmin, s.deleteConsumerDeadSelected)
	s.route("GET /v1/consumers/{consumer}/dead/{id}", ScopeRead, s.getConsumerDead)
	s.route("DELETE /v1/consumers/{consumer}/dead/{id}", ScopeAdmin, s.deleteConsumerDead)
	s.dashboardRoutes()

	s.open("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	s.open("GET /readyz", s.readyz)
	s.open("GET /v1/openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "application/json; charset=utf-8")
		h.Set("X-Content-Type-Options", "nosniff")
		_, _ = w.Write(openAPI)
	})
	switch {
	case s.cfg.Metrics == nil:
		s.open("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
			s.fail(w, r, &apiError{status: http.StatusNotFound, msg: "no metrics handler is configured"})
		})
	case s.cfg.MetricsRequireToken:
		s.route("GET /metrics", ScopeRead, func(w http.ResponseWriter, r *http.Request, _ principal) error {
			s.cfg.Metrics.ServeHTTP(w, r)
			return nil
		})
	default:
		s.open("GET /metrics", s.cfg.Metrics.ServeHTTP)
	}
}

// open registers h with no authentication.
func (s *Server) open(pattern string, h http.HandlerFunc) {
	s.patterns = append(s.patterns, pattern)
	s.mux.HandleFunc(pattern, h)
}

// route registers h behind authentication for scope need, CSRF protection
// for unsafe methods, and the body cap.
func (s *Server) route(pattern string, need Scope, h handlerFunc) {
	s.patterns = append(s.patterns, pattern)
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		who, err := s.authenticate(r, need)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		// Only the token-less mode can be reached from a browser (a token
		// is sent in a header a cross-origin page cannot set without a CORS
		// preflight, which this server never grants), but the check is
		// cheap and holds in both modes.
		if err := s.cop.Check(r); err != nil {
			s.fail(w, r, &apiError{status: http.StatusForbidden, msg: "cross-origin request refused"})
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
		if err := h(w, r, who); err != nil {
			s.fail(w, r, err)
		}
	})
}

// Handler returns the server's handler: every endpoint of the package
// documentation, with JSON errors for unknown paths (404) and methods
// (405).
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serveHTTP) }

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler { //nolint:errorlint // a sentinel panic value, compared as net/http does
				panic(p)
			}
			s.fail(w, r, fmt.Errorf("panic: %v", p))
		}
	}()
	h, pattern := s.mux.Handler(r)
	if pattern != "" {
		s.mux.ServeHTTP(w, r)
		return
	}
	// No pattern: the mux answers 404, 405 or a redirect to the cleaned
	// path. Record what it says and give 404 and 405 a JSON body.
	rec := &headerRecorder{header: http.Header{}}
	h.ServeHTTP(rec, r)
	switch rec.code {
	case http.StatusNotFound:
		s.fail(w, r, &apiError{status: http.StatusNotFound, msg: fmt.Sprintf("no endpoint %s; see the package documentation for the list", r.URL.Path)})
	case http.StatusMethodNotAllowed:
		allow := rec.header.Get("Allow")
		w.Header().Set("Allow", allow)
		s.fail(w, r, &apiError{status: http.StatusMethodNotAllowed, msg: fmt.Sprintf("method %s is not allowed on %s; allowed: %s", r.Method, r.URL.Path, allow)})
	default:
		for k, v := range rec.header {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.code)
	}
}

// headerRecorder keeps a response's status and headers and drops its body.
type headerRecorder struct {
	header http.Header
	code   int
}

func (h *headerRecorder) Header() http.Header { return h.header }
func (h *headerRecorder) Write(b []byte) (int, error) {
	if h.code == 0 {
		h.code = http.StatusOK
	}
	return len(b), nil
}
func (h *headerRecorder) WriteHeader(code int) {
	if h.code == 0 {
		h.code = code
	}
}

// authenticate finds the request's principal and checks it may call an
// endpoint of scope need.
func (s *Server) authenticate(r *http.Request, need Scope) (principal, error) {
	if len(s.tokens) == 0 {
		// Token-less mode is for loopback only. CheckListen enforces that
		// for the listener; this enforces it for the handler mounted
		// elsewhere, and the Host check defeats DNS rebinding (a page on
		// evil.example whose name now resolves to 127.0.0.1).
		if !loopbackAddr(r.RemoteAddr) || !loopbackHost(hostOnly(r.Host)) {
			return principal{}, &apiError{status: http.StatusForbidden,
				msg: "no tokens are configured, so only loopback clients addressing a loopback host (127.0.0.1, [::1], localhost) are served"}
		}
		return principal{name: AnonymousActor, scope: ScopeAdmin}, nil
	}
	const challenge = `Bearer realm="postbox"`
	vals := r.Header.Values("Authorization")
	if len(vals) == 0 {
		// The dashboard's script reads the API with the page's session
		// cookie; a session never authorizes a change through the API,
		// only through the dashboard's forms, which check its CSRF token.
		if sess, _, ok := s.sessionOf(r); ok && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			return s.allow(principal{name: sess.name, scope: sess.scope}, need, "")
		}
		return principal{}, &apiError{status: http.StatusUnauthorized, msg: "missing Authorization: Bearer <token>", challenge: challenge}
	}
	scheme, tok, ok := strings.Cut(vals[0], " ")
	tok = strings.Trim(tok, " \t")
	if len(vals) > 1 || !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return principal{}, &apiError{status: http.StatusUnauthorized, msg: "malformed Authorization header: want one header, Bearer <token>",
			challenge: challenge + `, error="invalid_request"`}
	}
	t, ok := s.matchToken(tok)
	if !ok {
		return principal{}, &apiError{status: http.StatusUnauthorized, msg: "invalid token", challenge: challenge + `, error="invalid_token"`}
	}
	return s.allow(principal{name: t.name, scope: t.scope}, need, challenge)
}

// allow checks that who may call an endpoint of scope need.
func (s *Server) allow(who principal, need Scope, challenge string) (principal, error) {
	if !who.scope.allows(need) {
		e := &apiError{status: http.StatusForbidden, msg: fmt.Sprintf("this endpoint needs the %s scope; the token has %s", need, who.scope)}
		if challenge != "" {
			e.challenge = challenge + fmt.Sprintf(`, error="insufficient_scope", scope=%q`, need)
		}
		return principal{}, e
	}
	return who, nil
}

// matchToken finds the configured token tok is. It compares digests, so
// the time taken does not depend on the presented token's length, and
// compares with every token, so it does not depend on which one matched,
// if any.
func (s *Server) matchToken(tok string) (tokenEntry, bool) {
	digest := sha256.Sum256([]byte(tok))
	match := 0
	for i := range s.tokens {
		eq := subtle.ConstantTimeCompare(digest[:], s.tokens[i].digest[:])
		match = subtle.ConstantTimeSelect(eq, i+1, match)
	}
	if match == 0 {
		return tokenEntry{}, false
	}
	return s.tokens[match-1], true
}

func loopbackAddr(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return false
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}

// hostOnly strips the port from a Host header value.
func hostOnly(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		return host
	}
	return strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
}

// apiError is an error with its HTTP answer.
type apiError struct {
	status    int
	msg       string
	field     string
	challenge string // WWW-Authenticate
}

func (e *apiError) Error() string { return e.msg }

// errorBody is every error response.
type errorBody struct {
	Error     string `json:"error"`
	Field     string `json:"field,omitempty"`
	RequestID string `json:"request_id,omitempty"`
}

// fail answers r with err: a 4xx naming the field where the request was at
// fault, else a 5xx whose detail goes to the log only.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	ae, id := s.classify(r, err)
	if id != "" {
		writeJSON(w, http.StatusInternalServerError, errorBody{Error: ae.msg, RequestID: id})
		return
	}
	if ae.challenge != "" {
		w.Header().Set("WWW-Authenticate", ae.challenge)
	}
	writeJSON(w, ae.status, errorBody{Error: ae.msg, Field: ae.field})
}

// classify turns err into the answer to r. An error that is not the
// request's fault is logged with a request id, which it returns with a
// 500 (else the id is "").
func (s *Server) classify(r *http.Request, err error) (*apiError, string) {
	var (
		ae *apiError
		ve *postbox.ValidationError
		ce *postbox.ConfigError
		mb *http.MaxBytesError
	)
	switch {
	case errors.As(err, &ae):
	case errors.As(err, &mb):
		ae = &apiError{status: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("the body is over %d bytes", mb.Limit)}
	case errors.As(err, &ve):
		ae = &apiError{status: http.StatusBadRequest, msg: strings.TrimPrefix(ve.Error(), "postbox: "), field: ve.Field}
	case errors.As(err, &ce) && len(ce.Problems) > 0:
		ae = &apiError{status: http.StatusBadRequest, msg: strings.TrimPrefix(ce.Error(), "postbox: "), field: ce.Problems[0].Field}
	case errors.Is(err, postbox.ErrEmptySelection):
		ae = &apiError{status: http.StatusBadRequest,
			msg: `no messages selected: give "ids" or a filter ("topic", "key", "since", "until"), or set "all": true to select every dead message`}
	case errors.Is(err, postboxdriver.ErrBeyondHorizon):
		ae = &apiError{status: http.StatusUnprocessableEntity, msg: strings.TrimPrefix(err.Error(), "postbox: ") +
			"; past it, consumers' inboxes may have forgotten the ids and would run their handlers twice", field: "since"}
	case errors.Is(err, postboxdriver.ErrNotFound):
		ae = &apiError{status: http.StatusNotFound, msg: "not found"}
	case errors.Is(err, postboxdriver.ErrNotMigrated):
		s.log.Error("postboxadmin: tables not migrated", slog.String("path", r.URL.Path), slog.Any("error", err))
		ae = &apiError{status: http.StatusServiceUnavailable, msg: "the postbox tables are not migrated: run `postbox migrate up`"}
	case r.Context().Err() != nil:
		// The client went away (or the server is shutting down): no one
		// reads this answer.
		s.log.Debug("postboxadmin: request ended early", slog.String("path", r.URL.Path), slog.Any("error", err))
		ae = &apiError{status: http.StatusServiceUnavailable, msg: "the request was canceled"}
	default:
		id := requestID()
		s.log.Error("postboxadmin: request failed", slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.String("request_id", id), slog.Any("error", err))
		return &apiError{status: http.StatusInternalServerError, msg: "internal error; the server log has the detail"}, id
	}
	return ae, ""
}

func requestID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// writeJSON writes v as the response with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	h := w.Header()
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the client may be gone; nothing to do about it
}

// readyz runs the readiness check with a bound.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.ReadyTimeout)
	defer cancel()
	if err := s.ready(ctx); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// defaultReady reads one entry of the replay audit: it needs the database
// and migration 4. Its errors say what failed without the driver's detail,
// which goes to the log.
func (s *Server) defaultReady(ctx context.Context) error {
	_, err := s.cfg.Admin.Replays(ctx, 1)
	if err == nil {
		return nil
	}
	s.log.Warn("postboxadmin: not ready", slog.Any("error", err))
	switch {
	case errors.Is(err, postboxdriver.ErrNotMigrated):
		return errors.New("the postbox tables are not migrated")
	case ctx.Err() != nil:
		return fmt.Errorf("the database did not answer within %s", s.cfg.ReadyTimeout)
	}
	return errors.New("the database is not reachable")
}

// ListenAndServe listens on addr and serves until ctx ends, then shuts
// down gracefully within Config.ShutdownTimeout. It refuses, with a
// *ListenError, a non-loopback addr when no token is configured (see
// CheckListen). It returns nil after a shutdown caused by ctx.
func (s *Server) ListenAndServe(ctx context.Context, addr string) error {
	if err := CheckListen(addr, s.cfg); err != nil {
		return err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("postboxadmin: %w", err)
	}
	return s.serve(ctx, ln)
}

// Serve is ListenAndServe on a listener of the caller's; it checks the
// listener's address the same way and closes ln when it returns.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if err := CheckListen(ln.Addr().String(), s.cfg); err != nil {
		_ = ln.Close()
		return err
	}
	return s.serve(ctx, ln)
}

// Server timeouts: a slow or idle client cannot hold a connection for
// long, and a long prune still gets its answer out.
const (
	readHeaderTimeout = 10 * time.Second
	readTimeout       = 30 * time.Second
	writeTimeout      = 2 * time.Minute
	idleTimeout       = 2 * time.Minute
	maxHeaderBytes    = 64 << 10
)

func (s *Server) serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		// Requests keep ctx's values but not its cancellation: requests in
		// flight when ctx ends get the shutdown's grace period.
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("postboxadmin: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	if err != nil {
		_ = srv.Close()
	}
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("postboxadmin: shutdown: %w", err)
	}
	return nil
}

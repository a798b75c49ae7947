package postboxidem

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"

	"github.com/google/uuid"

	"github.com/postbox-go/postbox/internal/printable"
	"github.com/postbox-go/postbox/postboxdriver"
)

// Header names.
const (
	// HeaderKey is the request header carrying the key.
	HeaderKey = "Idempotency-Key"
	// HeaderReplayed is set to "true" on every response served from a
	// record rather than by the handler.
	HeaderReplayed = "Idempotent-Replayed"
)

// Error codes, the "code" member of the JSON error bodies.
const (
	CodeKeyMissing          = "key_missing"          // 400
	CodeKeyInvalid          = "key_invalid"          // 400
	CodeBodyTooLarge        = "body_too_large"       // 413
	CodeBodyUnreadable      = "body_unreadable"      // 400
	CodeFingerprintMismatch = "fingerprint_mismatch" // 422
	CodeInProgress          = "in_progress"          // 409, with Retry-After
	CodeResponseNotStored   = "response_not_stored"  // 409, a replay of the too-large sentinel
	CodeStoreUnavailable    = "store_unavailable"    // 503, with Retry-After
)

// Middleware makes POST and PATCH handlers idempotent under the
// Idempotency-Key header, with the records in the service's database. TTx
// is the driver's transaction type; a handler gets its transaction with
// TxFromContext. See the package documentation for the semantics.
type Middleware[TTx any] struct {
	cfg     *Config
	store   postboxdriver.Store[TTx]
	methods map[string]bool
	log     *slog.Logger

	mu      sync.Mutex
	running *cleanupLoop
}

// New makes a Middleware over driver, whose tables must include migration
// 3 (postboxmigrate applies it). cfg may be nil for all defaults.
func New[TTx any](driver postboxdriver.Driver[TTx], cfg *Config) (*Middleware[TTx], error) {
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	store, err := driver.Open(c.Prefix)
	if err != nil {
		return nil, err
	}
	methods := make(map[string]bool, len(c.Methods))
	for _, m := range c.Methods {
		methods[m] = true
	}
	return &Middleware[TTx]{cfg: c, store: store, methods: methods, log: c.Logger}, nil
}

// Config returns the middleware's configuration, defaults filled in.
func (m *Middleware[TTx]) Config() Config { return *m.cfg }

type txKey struct{}

// TxFromContext returns the transaction the middleware runs the handler
// in. Write the domain rows and the outbox messages (Client.WriteTx) with
// it: they commit together with the stored response, or not at all. The
// middleware commits or rolls it back after the handler returns; the
// handler must do neither. ok is false outside the middleware (a request
// that passed through), or when TTx is not the driver's type.
func TxFromContext[TTx any](ctx context.Context) (tx TTx, ok bool) {
	tx, ok = ctx.Value(txKey{}).(TTx)
	return tx, ok
}

// Handler wraps next. Its signature is the common one of net/http
// middleware: chi's Use and echo's WrapMiddleware take it as is.
func (m *Middleware[TTx]) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !m.methods[r.Method] {
			next.ServeHTTP(w, r)
			return
		}
		values := r.Header.Values(HeaderKey)
		if len(values) == 0 {
			if m.cfg.Required {
				m.observe(OutcomeInvalid)
				writeProblem(w, http.StatusBadRequest, problem{Code: CodeKeyMissing, Field: HeaderKey,
					Error: "this request requires an Idempotency-Key header"})
				return
			}
			m.observe(OutcomeNoKey)
			next.ServeHTTP(w, r)
			return
		}
		if len(values) > 1 {
			m.observe(OutcomeInvalid)
			writeProblem(w, http.StatusBadRequest, problem{Code: CodeKeyInvalid, Field: HeaderKey,
				Error: "Idempotency-Key must appear once"})
			return
		}
		key, err := ParseKey(values[0])
		if err != nil {
			m.observe(OutcomeInvalid)
			writeProblem(w, http.StatusBadRequest, problem{Code: CodeKeyInvalid, Field: HeaderKey,
				Error: "Idempotency-Key " + err.Error()})
			return
		}
		body, ok := m.readBody(w, r)
		if !ok {
			m.observe(OutcomeInvalid)
			return
		}
		path := r.URL.EscapedPath()
		a := claimArgs{
			keyHash:     keyHash(r.Method, path, r.URL.RawQuery, m.cfg.Identity(r), key),
			fingerprint: fingerprint(body),
			method:      truncate(r.Method, 64),
			path:        truncate(path, 1024),
		}
		m.serve(w, r, next, a)
	})
}

// readBody reads the whole body, up to the cap, and gives the handler a
// copy to read again. It answers the request itself when it returns false.
func (m *Middleware[TTx]) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	limit := m.cfg.MaxBodyBytes
	tooLarge := problem{Code: CodeBodyTooLarge, Field: "body",
		Error: fmt.Sprintf("the request body is larger than %d bytes", limit)}
	if r.ContentLength > limit {
		writeProblem(w, http.StatusRequestEntityTooLarge, tooLarge)
		return nil, false
	}
	var body []byte
	if r.Body != nil {
		b, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
		if err != nil {
			writeProblem(w, http.StatusBadRequest, problem{Code: CodeBodyUnreadable, Field: "body",
				Error: "the request body could not be read: " + err.Error()})
			return nil, false
		}
		body = b
	}
	if int64(len(body)) > limit {
		writeProblem(w, http.StatusRequestEntityTooLarge, tooLarge)
		return nil, false
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return body, true
}

// serve answers from the record when there is one to answer from, and
// otherwise claims the key and runs the handler.
//
// The lookup is a plain read, so that duplicates of a request in progress
// get their 409 at once: on SQLite the handler's transaction holds the
// write lock, and a write would wait for it. The claim is what decides:
// when it finds the key taken after all (another request claimed it since
// the lookup), the loop looks again. Each turn sees a record that changed,
// so a few turns settle it; the bound only guards against a storm.
func (m *Middleware[TTx]) serve(w http.ResponseWriter, r *http.Request, next http.Handler, a claimArgs) {
	ctx := r.Context()
	for range 3 {
		rec, found, err := m.lookup(ctx, a.keyHash)
		if err != nil {
			m.storeFailure(w, r, a, err)
			return
		}
		if found && !rec.expired {
			if !bytes.Equal(rec.fingerprint, a.fingerprint) {
				m.observe(OutcomeMismatch)
				writeProblem(w, http.StatusUnprocessableEntity, problem{Code: CodeFingerprintMismatch, Field: "body",
					Error: "this Idempotency-Key was used with a different request body; use a new key for a new request"})
				return
			}
			switch {
			case rec.state == stateSucceeded:
				m.observe(OutcomeReplayed)
				m.replay(w, rec)
				return
			case rec.state == stateProcessing && rec.claimLeftMS > 0:
				m.observe(OutcomeInProgress)
				inProgress(w, rec.claimLeftMS)
				return
			}
		}
		a.token = uuid.NewString()
		took, err := m.claim(ctx, a)
		if err != nil {
			m.storeFailure(w, r, a, err)
			return
		}
		if took {
			if found && !rec.expired {
				m.log.Info("postboxidem: key taken over for a retry", slog.String("key", shortHash(a.keyHash)),
					slog.String("previous_state", rec.state), slog.String("method", a.method), slog.String("path", a.path))
			}
			m.run(w, r, next, a)
			return
		}
	}
	m.observe(OutcomeInProgress)
	inProgress(w, 1000)
}

// observe reports an outcome to Config.Metrics.
func (m *Middleware[TTx]) observe(outcome string) {
	if m.cfg.Metrics != nil {
		m.cfg.Metrics.IdempotencyOutcome(outcome)
	}
}

// errRelease, errClaimLost and errPanicked end the handler's transaction
// with a rollback, each for its own reason.
var (
	errRelease   = errors.New("postboxidem: response not stored")
	errClaimLost = errors.New("postboxidem: claim taken over")
	errPanicked  = errors.New("postboxidem: handler panicked")
)

// run runs the handler in a transaction that also writes its response,
// then sends the response. Nothing reaches the client before the commit:
// a response sent earlier could announce an outcome that then rolls back.
//
// The transaction's own context does not end with the request's: once
// the handler has returned, its work and the record commit even if the
// client has gone, and the client's retry replays them. The handler itself
// sees the request's context, so it can stop early; its statements then
// fail and it answers with an error that is not stored.
func (m *Middleware[TTx]) run(w http.ResponseWriter, r *http.Request, next http.Handler, a claimArgs) {
	txCtx := context.WithoutCancel(r.Context())
	rec := &recorder{header: make(http.Header)}
	var panicValue any
	returned := false
	defer func() {
		if !returned { // the handler called runtime.Goexit
			if err := m.release(txCtx, a, nil); err != nil {
				m.log.Error("postboxidem: could not release a key; retries get 409 until the claim expires",
					slog.String("key", shortHash(a.keyHash)), slog.Any("error", err))
			}
		}
	}()
	err := m.store.InTx(txCtx, func(tx TTx) error {
		hr := r.WithContext(context.WithValue(r.Context(), txKey{}, tx))
		if p, ok := callHandler(next, rec, hr); ok {
			panicValue = p
			return errPanicked
		}
		status := rec.statusCode()
		if !stored(status) {
			return errRelease
		}
		var body []byte
		tooLarge := rec.body.Len() > m.cfg.MaxResponseBytes
		if !tooLarge {
			body = append([]byte{}, rec.body.Bytes()...)
		}
		// The race the token settles: A claims and runs long; its claim
		// expires; B takes it over with a new token and runs too. If B's
		// takeover came first, A's UPDATE below matches no row (the
		// token is B's) and A rolls back, whatever B is still doing. If
		// A's UPDATE came first, it holds the row until A commits; B's
		// takeover waits for it (on SQLite, for the write lock), then
		// finds the record succeeded and takes nothing. Either way one
		// run commits.
		ok, err := m.finalize(txCtx, tx, a, status, storedHeaders(rec.sentHeader()), body, tooLarge)
		if err != nil {
			return err
		}
		if !ok {
			return errClaimLost
		}
		return nil
	})
	returned = true
	switch {
	case err == nil:
		m.observe(OutcomeCompleted)
		rec.sendTo(w)
	case errors.Is(err, errClaimLost):
		m.observe(OutcomeTakenOver)
		// The claim expired while the handler ran and a retry took it
		// over: that run owns the key now, and this one rolled back.
		m.log.Warn("postboxidem: the claim expired while the handler ran and was taken over; this run rolled back (raise ClaimExpiry above the longest handler run)",
			slog.String("key", shortHash(a.keyHash)), slog.String("method", a.method), slog.String("path", a.path))
		m.answerExisting(w, r, a)
	default:
		var status *int
		if errors.Is(err, errRelease) {
			code := rec.statusCode()
			status = &code
		}
		if rerr := m.release(txCtx, a, status); rerr != nil {
			// The claim stays processing until it expires; a retry then
			// takes it over.
			m.log.Error("postboxidem: could not release a key; retries get 409 until the claim expires",
				slog.String("key", shortHash(a.keyHash)), slog.Any("error", rerr))
		}
		switch {
		case panicValue != nil:
			m.observe(OutcomeReleased)
			panic(panicValue)
		case errors.Is(err, errRelease):
			m.observe(OutcomeReleased)
			rec.sendTo(w)
		default:
			// Nothing committed (or, after a lost connection during the
			// commit, everything did, and the release changed nothing):
			// either way a retry gets the right answer.
			m.storeFailure(w, r, a, err)
		}
	}
}

// callHandler runs h and reports a panic instead of unwinding, so that
// the transaction rolls back and the claim is released before the panic
// goes on to the server or a recovery middleware.
func callHandler(h http.Handler, w http.ResponseWriter, r *http.Request) (panicValue any, panicked bool) {
	done := false
	defer func() {
		// recover returns nil only for runtime.Goexit, which nothing can
		// stop; run's deferred release covers it.
		if !done {
			if p := recover(); p != nil {
				panicValue, panicked = p, true
			}
		}
	}()
	h.ServeHTTP(w, r)
	done = true
	return nil, false
}

// stored reports whether a response of this status is recorded (and the
// handler's transaction committed) or released for a retry (and rolled
// back). Server errors are released: the request may succeed when retried.
// So are the client errors that say "not now" rather than "not this":
// 408 Request Timeout, 425 Too Early and 429 Too Many Requests. Every
// other status is an answer to this request and is stored.
func stored(status int) bool {
	switch {
	case status >= 500:
		return false
	case status == http.StatusRequestTimeout, status == http.StatusTooEarly, status == http.StatusTooManyRequests:
		return false
	}
	return true
}

// answerExisting answers a request that lost its claim with what the
// record holds now, as a duplicate would be answered.
func (m *Middleware[TTx]) answerExisting(w http.ResponseWriter, r *http.Request, a claimArgs) {
	rec, found, err := m.lookup(context.WithoutCancel(r.Context()), a.keyHash)
	switch {
	case err != nil:
		m.storeFailure(w, r, a, err)
	case found && rec.state == stateSucceeded && bytes.Equal(rec.fingerprint, a.fingerprint):
		m.replay(w, rec)
	default:
		inProgress(w, max(rec.claimLeftMS, 1000))
	}
}

func (m *Middleware[TTx]) storeFailure(w http.ResponseWriter, r *http.Request, a claimArgs, err error) {
	m.observe(OutcomeStoreUnavailable)
	level := slog.LevelWarn
	if r.Context().Err() != nil {
		level = slog.LevelDebug // the client has gone; nobody reads the answer
	}
	m.log.Log(r.Context(), level, "postboxidem: store failure", slog.String("key", shortHash(a.keyHash)),
		slog.String("method", a.method), slog.String("path", a.path), slog.Any("error", err))
	w.Header().Set("Retry-After", "1")
	writeProblem(w, http.StatusServiceUnavailable, problem{Code: CodeStoreUnavailable,
		Error: "the idempotency store is unavailable; nothing was done, retry with the same key"})
}

func inProgress(w http.ResponseWriter, leftMS int64) {
	secs := max((leftMS+999)/1000, 1)
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	writeProblem(w, http.StatusConflict, problem{Code: CodeInProgress, Field: HeaderKey,
		Error: "a request with this Idempotency-Key is still being processed; retry after the Retry-After delay"})
}

func shortHash(h []byte) string { return hex.EncodeToString(h[:min(8, len(h))]) }

func truncate(s string, n int) string { return printable.Cut(s, n) }

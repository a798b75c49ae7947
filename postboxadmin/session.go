package postboxadmin

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"sync"
	"time"
)

// The dashboard's sessions. A browser cannot send a bearer token with a
// link or a form, so the dashboard trades a token, posted once to its
// sign-in form, for a session: a random id in a cookie, the session itself
// (actor, scope, CSRF token, expiry) held in memory here, so that signing
// out ends it at once. Sessions do not survive a restart: one signs in
// again.

// DefaultSessionLifetime is how long a dashboard session lasts from its
// sign-in: a fixed bound, not renewed by use.
const DefaultSessionLifetime = 8 * time.Hour

// maxSessions bounds the sessions held; past it, signing in first drops
// the expired ones, then the one closest to expiry.
const maxSessions = 10_000

// sessionCookie is the dashboard session's cookie; csrfField is the form
// field (and header, for scripts) that carries the session's CSRF token.
const (
	sessionCookie = "postbox_session"
	csrfField     = "csrf_token"
	csrfHeader    = "X-CSRF-Token"
)

// Sessions holds dashboard sessions. One Sessions may serve several
// Servers (Config.Sessions), so that a sign-in holds for all of them: the
// relay daemon shares one between the dashboards of its databases. It is
// safe for concurrent use.
type Sessions struct {
	lifetime time.Duration
	now      func() time.Time

	mu sync.Mutex
	// m is keyed by the SHA-256 of the session id: the id itself is kept
	// nowhere but in the browser.
	m map[[sha256.Size]byte]*session
}

// NewSessions returns an empty session store whose sessions last lifetime
// (DefaultSessionLifetime when 0 or less).
func NewSessions(lifetime time.Duration) *Sessions {
	if lifetime <= 0 {
		lifetime = DefaultSessionLifetime
	}
	return &Sessions{lifetime: lifetime, now: time.Now, m: map[[sha256.Size]byte]*session{}}
}

// session is one sign-in.
type session struct {
	name    string // the actor
	scope   Scope
	csrf    string
	expires time.Time
}

// randomToken returns 32 random bytes, base64url.
func randomToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// create starts a session for name with scope and returns its id.
func (ss *Sessions) create(name string, scope Scope) (string, *session) {
	id := randomToken()
	s := &session{name: name, scope: scope, csrf: randomToken(), expires: ss.now().Add(ss.lifetime)}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if len(ss.m) >= maxSessions {
		ss.evictLocked()
	}
	ss.m[sha256.Sum256([]byte(id))] = s
	return id, s
}

// evictLocked drops the expired sessions, or when none is, the one that
// expires first.
func (ss *Sessions) evictLocked() {
	now := ss.now()
	var first [sha256.Size]byte
	var firstAt time.Time
	for k, s := range ss.m {
		if !now.Before(s.expires) {
			delete(ss.m, k)
			continue
		}
		if firstAt.IsZero() || s.expires.Before(firstAt) {
			first, firstAt = k, s.expires
		}
	}
	if len(ss.m) >= maxSessions {
		delete(ss.m, first)
	}
}

// get returns the live session with id, if any.
func (ss *Sessions) get(id string) (*session, bool) {
	if id == "" {
		return nil, false
	}
	k := sha256.Sum256([]byte(id))
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s, ok := ss.m[k]
	if !ok {
		return nil, false
	}
	if !ss.now().Before(s.expires) {
		delete(ss.m, k)
		return nil, false
	}
	return s, true
}

// end ends the session with id.
func (ss *Sessions) end(id string) {
	k := sha256.Sum256([]byte(id))
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.m, k)
}

// checkCSRF reports, in constant time, whether got is s's CSRF token.
func (s *session) checkCSRF(got string) bool {
	return subtle.ConstantTimeCompare([]byte(got), []byte(s.csrf)) == 1
}

// sessionOf returns r's live session and its id, if r carries one.
func (s *Server) sessionOf(r *http.Request) (*session, string, bool) {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return nil, "", false
	}
	sess, ok := s.sessions.get(c.Value)
	return sess, c.Value, ok
}

// setSessionCookie sends the session cookie: HttpOnly (no script reads
// it), SameSite=Strict (no other site's page sends it), Secure when the
// request came over TLS or Config.SecureCookies says a proxy terminates
// TLS, and an expiry no later than the session's.
func (s *Server) setSessionCookie(w http.ResponseWriter, r *http.Request, id string, sess *session) {
	//nolint:gosec // Secure where TLS is on: a loopback dashboard over plain HTTP must work
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: id, Path: "/", Expires: sess.expires,
		MaxAge: int(time.Until(sess.expires).Seconds()), HttpOnly: true, Secure: s.secureCookies(r), SameSite: http.SameSiteStrictMode})
}

// clearSessionCookie tells the browser to forget the session cookie.
func (s *Server) clearSessionCookie(w http.ResponseWriter, r *http.Request) {
	//nolint:gosec // as setSessionCookie
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, Secure: s.secureCookies(r), SameSite: http.SameSiteStrictMode})
}

func (s *Server) secureCookies(r *http.Request) bool {
	return r.TLS != nil || s.cfg.SecureCookies
}

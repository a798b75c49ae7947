package postboxidem

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
)

// recorder buffers the handler's response until its transaction commits.
// It implements no Flusher, Hijacker or Unwrap on purpose: flushing early
// would send an outcome that may still roll back, and Unwrap would let
// http.ResponseController reach the real writer and do just that.
type recorder struct {
	header http.Header
	sent   http.Header // the header as of WriteHeader, as net/http sends it
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code)) // as net/http does
	}
	// Informational responses would reach the client before the commit;
	// they are dropped.
	if r.status != 0 || code < 200 {
		return
	}
	r.status = code
	r.sent = r.header.Clone()
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(r.status) {
		return 0, http.ErrBodyNotAllowed
	}
	return r.body.Write(p)
}

// statusCode is the response's status: 200 when the handler wrote
// nothing, as net/http would send.
func (r *recorder) statusCode() int {
	if r.status == 0 {
		return http.StatusOK
	}
	return r.status
}

func (r *recorder) sentHeader() http.Header {
	if r.sent == nil {
		return r.header
	}
	return r.sent
}

// sendTo sends the buffered response to the live caller, body in full
// whatever its size, and the trailers the handler set afterwards.
func (r *recorder) sendTo(w http.ResponseWriter) {
	status := r.statusCode()
	h := w.Header()
	for k, v := range r.sentHeader() {
		h[k] = v
	}
	if h.Get("Content-Length") == "" && h.Get("Trailer") == "" && bodyAllowed(status) {
		h.Set("Content-Length", strconv.Itoa(r.body.Len()))
	}
	w.WriteHeader(status)
	if r.body.Len() > 0 {
		_, _ = w.Write(r.body.Bytes())
	}
	for _, k := range trailerNames(r.sentHeader()) {
		if v, ok := r.header[k]; ok {
			h[k] = v
		}
	}
	for k, v := range r.header {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			h[k] = v
		}
	}
}

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

func trailerNames(h http.Header) []string {
	var names []string
	for _, v := range h.Values("Trailer") {
		for _, n := range strings.Split(v, ",") {
			if n = strings.TrimSpace(n); n != "" {
				names = append(names, textproto.CanonicalMIMEHeaderKey(n))
			}
		}
	}
	return names
}

// notReplayed are the response headers a record does not keep:
//
//   - the hop-by-hop headers (RFC 9110 §7.6.1), which describe one
//     connection, not the response;
//   - Set-Cookie: a cookie is issued to one client at one moment (a
//     session, a CSRF token), and a replay can reach another client that
//     holds the key, or the same one much later;
//   - Content-Length and Date, which the replay recomputes;
//   - Trailer and the trailers themselves: a replay carries none.
var notReplayed = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Proxy-Connection": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Set-Cookie": true, "Content-Length": true, "Date": true, HeaderReplayed: true,
}

// storedHeaders returns the headers kept for replay, as a JSON object of
// string arrays.
func storedHeaders(h http.Header) string {
	skip := make(map[string]bool)
	for _, v := range h.Values("Connection") {
		for _, n := range strings.Split(v, ",") {
			skip[textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(n))] = true
		}
	}
	for _, n := range trailerNames(h) {
		skip[n] = true
	}
	keep := make(map[string][]string, len(h))
	for k, v := range h {
		if notReplayed[k] || skip[k] || strings.HasPrefix(k, http.TrailerPrefix) {
			continue
		}
		keep[k] = v
	}
	b, _ := json.Marshal(keep) // a map of strings always encodes
	return string(b)
}

// replay answers from a completed record.
func (m *Middleware[TTx]) replay(w http.ResponseWriter, rec record) {
	if rec.tooLarge {
		w.Header().Set(HeaderReplayed, "true")
		writeProblem(w, http.StatusConflict, problem{Code: CodeResponseNotStored, Field: HeaderKey, OriginalStatus: rec.status,
			Error: fmt.Sprintf("the request with this Idempotency-Key already completed with status %d, but its response was too large to keep for replay; it will not run again", rec.status)})
		return
	}
	var stored map[string][]string
	if err := json.Unmarshal([]byte(rec.headers), &stored); err != nil {
		// Written by finalize, so this means someone edited the row.
		m.log.Error("postboxidem: a record's headers are not a JSON object; replaying without them", slog.Any("error", err))
	}
	h := w.Header()
	for k, v := range stored {
		h[k] = v
	}
	h.Set(HeaderReplayed, "true")
	if bodyAllowed(rec.status) {
		h.Set("Content-Length", strconv.Itoa(len(rec.body)))
	}
	w.WriteHeader(rec.status)
	if len(rec.body) > 0 && bodyAllowed(rec.status) {
		_, _ = w.Write(rec.body)
	}
}

// problem is the JSON body of every response the middleware makes itself.
type problem struct {
	Error string `json:"error"`
	Field string `json:"field,omitempty"`
	Code  string `json:"code"`
	// OriginalStatus is the status of the completed request, in the
	// response_not_stored answer.
	OriginalStatus int `json:"original_status,omitempty"`
}

func writeProblem(w http.ResponseWriter, status int, p problem) {
	b, _ := json.Marshal(p) // strings and an int always encode
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

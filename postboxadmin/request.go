package postboxadmin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/configcheck"
	"github.com/postbox-go/postbox/internal/printable"
)

// badRequest is a 400 naming field.
func badRequest(field, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, args...), field: field}
}

// query parses r's query string, refusing parameters not in allowed and
// parameters given twice, so that a typo never widens a selection.
func query(r *http.Request, allowed ...string) (url.Values, error) {
	return queryList(r, "", allowed...)
}

// queryList is query where the parameter list (if not "") may be given
// any number of times: the dashboard's ticked ids.
func queryList(r *http.Request, list string, allowed ...string) (url.Values, error) {
	v, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, badRequest("", "malformed query string: %v", err)
	}
	for _, k := range slices.Sorted(maps.Keys(v)) {
		if !slices.Contains(allowed, k) {
			return nil, badRequest(configcheck.ShortenTo(k, 64), "unknown query parameter %q; allowed: %s", configcheck.ShortenTo(k, 64), strings.Join(allowed, ", "))
		}
		if len(v[k]) > 1 && k != list {
			return nil, badRequest(k, "query parameter %s is given %d times; give it once", k, len(v[k]))
		}
	}
	return v, nil
}

// maxAgo bounds a duration-ago time value; beyond it lies nothing a
// database keeps, and time arithmetic would overflow.
const maxAgo = 100 * 365 * 24 * time.Hour

// parseTime reads an RFC 3339 time, or a duration meaning that long ago
// ("90m", "2h", "7d"), as the CLI does. An empty string is the zero time.
func parseTime(field, s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	d, err := parseDuration(s)
	if err != nil {
		return time.Time{}, badRequest(field, "%s %q: want an RFC 3339 time (2026-01-02T15:04:05Z) or a duration ago (90m, 2h, 7d)", field, configcheck.ShortenTo(s, 64))
	}
	if d < 0 || d > maxAgo {
		return time.Time{}, badRequest(field, "%s %q: a duration ago must be between 0 and 100 years", field, configcheck.ShortenTo(s, 64))
	}
	return now.Add(-d), nil
}

// parseDuration reads a Go duration, or a whole number of days as "7d".
func parseDuration(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseInt(days, 10, 64)
		if err != nil || n < 0 || n > math.MaxInt64/int64(24*time.Hour) {
			return 0, errors.New("not a number of days")
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	return time.ParseDuration(s)
}

// parseLimit reads a limit of 1 to 10000; empty means def.
func parseLimit(s string, def int) (int, error) {
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 10_000 {
		return 0, badRequest("limit", "limit %q: want a whole number from 1 to 10000", configcheck.ShortenTo(s, 64))
	}
	return n, nil
}

// checkKey applies the message rules to a key filter: UTF-8 text without
// NUL, at most postbox.MaxKeyBytes.
func checkKey(key string) error {
	switch {
	case len(key) > postbox.MaxKeyBytes:
		return badRequest("key", "key is %d bytes, over the limit of %d", len(key), postbox.MaxKeyBytes)
	case !utf8.ValidString(key) || strings.IndexByte(key, 0) >= 0:
		return badRequest("key", "key is not valid UTF-8 text")
	}
	return nil
}

// checkTopic validates a topic filter; empty means any topic.
func checkTopic(topic string) error {
	if topic == "" {
		return nil
	}
	return postbox.ValidateTopic(topic)
}

// checkText applies the inbox's rule for consumer names and message ids:
// printable text of 1 to max bytes (0 bytes too when optional).
func checkText(field, s string, maxBytes int, optional bool) error {
	if s == "" && optional {
		return nil
	}
	if s == "" || len(s) > maxBytes || !printable.Text(s) {
		return badRequest(field, "%s must be printable text of 1 to %d bytes", field, maxBytes)
	}
	return nil
}

// fields maps each JSON field name a body accepts to where it goes: a
// *string, *[]string or *bool.
type fields map[string]any

// decodeBody reads r's body as a JSON object with only the given fields,
// each of its documented type; null leaves a field at its zero value. An
// empty body is accepted when allowEmpty is set. Field names match
// exactly: a field in another case is unknown, not silently accepted, and
// a field given twice is refused, as a query parameter is.
func decodeBody(r *http.Request, f fields, allowEmpty bool) error {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return err
		}
		return badRequest("", "could not read the body: %v", err)
	}
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		if allowEmpty {
			return nil
		}
		return badRequest("", "the body must be a JSON object, with fields %s", names(f))
	}
	if b[0] != '{' {
		return badRequest("", "the body must be a JSON object, with fields %s", names(f))
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	var raw map[string]json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return badRequest("", "malformed JSON: %s", jsonProblem(err))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return badRequest("", "malformed JSON: data after the object")
	}
	if k := duplicateField(b); k != "" {
		return badRequest(configcheck.ShortenTo(k, 64), "field %q is given twice; give it once", configcheck.ShortenTo(k, 64))
	}
	for _, k := range slices.Sorted(maps.Keys(raw)) {
		dst, ok := f[k]
		if !ok {
			return badRequest(configcheck.ShortenTo(k, 64), "unknown field %q; allowed: %s", configcheck.ShortenTo(k, 64), names(f))
		}
		if err := json.Unmarshal(raw[k], dst); err != nil {
			want := "a string"
			switch dst.(type) {
			case *[]string:
				want = "an array of strings"
			case *bool:
				want = "true or false"
			}
			return badRequest(k, "%s must be %s", k, want)
		}
	}
	return nil
}

// duplicateField returns the first top-level field name that b, a JSON
// object already decoded without error, gives more than once, or "".
// Decoding keeps the last value of a repeated field, so without this check
// {"all":false,"all":true} would widen a selection to all.
func duplicateField(b []byte) string {
	dec := json.NewDecoder(bytes.NewReader(b))
	if _, err := dec.Token(); err != nil { // {
		return ""
	}
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return ""
		}
		k, _ := t.(string)
		if seen[k] {
			return k
		}
		seen[k] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return ""
		}
	}
	return ""
}

func names(f fields) string {
	ns := slices.Sorted(maps.Keys(f))
	for i, n := range ns {
		ns[i] = strconv.Quote(n)
	}
	return strings.Join(ns, ", ")
}

// jsonProblem describes a decoding error without Go type names.
func jsonProblem(err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("%s (at byte %d)", se.Error(), se.Offset)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return "the body ends inside the object"
	}
	return "not a JSON object"
}

package main

import (
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/printable"
)

// payloadJSON renders a payload as the admin API does: "payload" as base64
// (JSON's encoding of bytes, lossless for any payload) and, when the
// payload is valid UTF-8, "payload_text" as the text itself.
func payloadJSON(m map[string]any, p []byte) {
	if p == nil {
		p = []byte{}
	}
	m["payload"] = p
	if utf8.Valid(p) {
		m["payload_text"] = string(p)
	}
}

// headersJSON renders stored headers as the admin API does: an object of
// strings, or "headers_raw" when the column holds something else.
func headersJSON(m map[string]any, b []byte) {
	h, err := postbox.DecodeHeaders(b)
	if err != nil {
		m["headers"] = map[string]string{}
		m["headers_raw"] = string(b)
		return
	}
	m["headers"] = h
}

// deadJSON is an outbox dead message in the admin API's shape.
func deadJSON(d *postbox.DeadMessage) map[string]any {
	m := map[string]any{
		"seq": d.Seq, "id": d.ID, "topic": d.Topic, "key": d.Key,
		"attempts": d.Attempts, "last_error": d.Error, "created_at": d.CreatedAt.UTC(), "dead_at": d.DeadAt.UTC(),
	}
	payloadJSON(m, d.Payload)
	headersJSON(m, d.Headers)
	return m
}

// consumerDeadJSON is a consumer's dead message in the admin API's shape.
func consumerDeadJSON(d *postbox.DeadMessage) map[string]any {
	m := map[string]any{
		"consumer": d.Consumer, "message_id": d.ID, "topic": d.Topic, "key": d.Key,
		"error": d.Error, "attempts": d.Attempts, "first_failure_at": d.FirstFailureAt.UTC(),
		"last_failure_at": d.LastFailureAt.UTC(), "dead_at": d.DeadAt.UTC(),
	}
	payloadJSON(m, d.Payload)
	headersJSON(m, d.Headers)
	return m
}

// safe returns s as it is when every character of it is printable (or a
// space), else quoted with Go escapes, so that no stored byte can drive
// the terminal.
func safe(s string) string {
	if !utf8.ValidString(s) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if r != ' ' && !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// reason is a dead message's error for a one-line listing: the message's
// own id, which adapters put in their errors ("publish <id>: ..."), says
// nothing the ID column does not, so it is left out.
func reason(d *postbox.DeadMessage, width int) string {
	e := d.Error
	if d.ID != "" {
		e = strings.ReplaceAll(e, " "+d.ID, "")
		e = strings.ReplaceAll(e, d.ID, "")
	}
	return oneLine(printable.OneLine([]byte(e)), width)
}

// textPayload reports whether p prints as text: valid UTF-8 without
// control characters other than tab, newline and carriage return.
func textPayload(p []byte) bool {
	if !utf8.Valid(p) {
		return false
	}
	for _, r := range string(p) {
		if (r < 0x20 && r != '\t' && r != '\n' && r != '\r') || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return false
		}
	}
	return true
}

// writePayload writes p for a person: as text when it is text, else as a
// hex dump, which shows every byte and none of them raw.
func writePayload(w io.Writer, p []byte) {
	switch {
	case len(p) == 0:
		fmt.Fprintln(w, "payload     (empty)")
	case textPayload(p):
		fmt.Fprintf(w, "payload     %s\n", p)
	default:
		fmt.Fprintf(w, "payload     (%d bytes, not text; hex dump below, --json gives base64)\n%s", len(p), hex.Dump(p))
	}
}

// writeHeaders writes the headers one per line, sorted, each value safe.
func writeHeaders(w io.Writer, raw []byte) {
	h, err := postbox.DecodeHeaders(raw)
	if err != nil {
		fmt.Fprintf(w, "headers     (not a JSON object of strings) %s\n", safe(string(raw)))
		return
	}
	if len(h) == 0 {
		fmt.Fprintln(w, "headers     (none)")
		return
	}
	for i, k := range slices.Sorted(maps.Keys(h)) {
		label := ""
		if i == 0 {
			label = "headers"
		}
		fmt.Fprintf(w, "%-11s %s: %s\n", label, safe(k), safe(h[k]))
	}
}

func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

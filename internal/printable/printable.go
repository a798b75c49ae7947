// Package printable holds the text rules postbox applies to what it quotes
// in errors and logs, stores as names, and sends as protocol text: names,
// ids, actors, a receiver's answer. One place, so that every package
// agrees on what "printable" means.
package printable

import (
	"strings"
	"unicode/utf8"
)

// Line reports whether s is UTF-8 text without control characters (below
// 0x20, and DEL): what a name may hold that is quoted in errors and logs,
// and travels in a broker's protocol as text.
func Line(s string) bool { return text(s, false) }

// Text reports whether s is UTF-8 text without control characters other
// than tabs: a configured name, a consumer, an actor.
func Text(s string) bool { return text(s, true) }

func text(s string, tabs bool) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 && (c != '\t' || !tabs) || c == 0x7f {
			return false
		}
	}
	return true
}

// VisibleASCII reports whether s is 1 or more bytes of ASCII from '!' to
// '~': an id or a secret that travels in HTTP headers and file names as
// it is.
func VisibleASCII(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// OneLine makes b safe to store and show as one line of printable text:
// invalid UTF-8 becomes '?', control characters become spaces, and runs of
// white space fold into one.
func OneLine(b []byte) string {
	s := strings.ToValidUTF8(string(b), "?")
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	return strings.TrimSpace(strings.Join(strings.Fields(s), " "))
}

// Cut returns s cut to at most n bytes, never in the middle of a UTF-8
// sequence: a cut sequence would make text a database refuses (PostgreSQL
// rejects invalid UTF-8 in a text column) out of text it took.
func Cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := max(n, 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// Shorten cuts s to at most n bytes (n > 3) for an error message, ending
// it with "..." when cut, as Cut does.
func Shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return Cut(s, n-3) + "..."
}

package configcheck

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/postbox-go/postbox"
)

func TestDefault(t *testing.T) {
	d := time.Duration(0)
	Default(&d, time.Second)
	if d != time.Second {
		t.Fatalf("zero: got %s, want 1s", d)
	}
	Default(&d, time.Minute)
	if d != time.Second {
		t.Fatalf("set: got %s, want 1s kept", d)
	}
}

func TestShorten(t *testing.T) {
	if got := Shorten("short"); got != "short" {
		t.Fatalf("got %q", got)
	}
	s := strings.Repeat("a", 60) + strings.Repeat("é", 10)
	got := Shorten(s)
	if len(got) > 64 || !strings.HasSuffix(got, "...") || !utf8.ValidString(got) {
		t.Fatalf("Shorten(%q) = %q: want at most 64 bytes of UTF-8 ending in ...", s, got)
	}
}

func TestProblems(t *testing.T) {
	var ps Problems
	if err := ps.Err(); err != nil {
		t.Fatalf("no problems: got %v", err)
	}
	ps.Add("Field", 7, "must be under %d", 5)
	var ce *postbox.ConfigError
	if err := ps.Err(); !errors.As(err, &ce) || len(ce.Problems) != 1 {
		t.Fatalf("got %v, want a ConfigError with one problem", err)
	}
	if p := ce.Problems[0]; p.Field != "Field" || p.Value != "7" || p.Reason != "must be under 5" {
		t.Fatalf("got %+v", p)
	}
}

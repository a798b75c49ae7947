package brokerutil

import (
	"context"
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

func TestAcquire(t *testing.T) {
	slots := make(chan struct{}, 1)
	closing := make(chan struct{})
	errClosed := errors.New("closed")
	if err := Acquire(context.Background(), slots, closing, errClosed); err != nil {
		t.Fatalf("free slot: got %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Acquire(ctx, slots, closing, errClosed); !errors.Is(err, context.Canceled) {
		t.Fatalf("full window, ended context: got %v, want context.Canceled", err)
	}
	close(closing)
	if err := Acquire(context.Background(), slots, closing, errClosed); !errors.Is(err, errClosed) {
		t.Fatalf("full window, closing: got %v, want the closed error", err)
	}
	<-slots
	if err := Acquire(ctx, slots, closing, errClosed); err != nil {
		t.Fatalf("free slot, ended context and closing: got %v, want the slot taken", err)
	}
}

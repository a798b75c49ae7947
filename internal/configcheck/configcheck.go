// Package configcheck holds what the adapters and tools outside the root
// package share to fill in and check their configs: defaults, shortened
// values for error messages, and the list of bad fields that becomes one
// *postbox.ConfigError.
package configcheck

import (
	"fmt"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/printable"
)

// Default sets *p to v if *p is the zero value.
func Default[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}

// Shorten cuts s to at most 64 bytes for an error message, ending it with
// "..." when cut, and never cutting a UTF-8 sequence in two.
func Shorten(s string) string { return printable.Shorten(s, 64) }

// ShortenTo cuts s to at most n bytes (n > 3) as Shorten does.
func ShortenTo(s string, n int) string { return printable.Shorten(s, n) }

// Problem is the ValidationError of one bad field: value is shown
// shortened, the reason is format applied to args.
func Problem(field string, value any, format string, args ...any) *postbox.ValidationError {
	return &postbox.ValidationError{Field: field, Value: Shorten(fmt.Sprint(value)), Reason: fmt.Sprintf(format, args...)}
}

// Problems collects the bad fields of one config.
type Problems []*postbox.ValidationError

// Add records a bad field, as Problem describes it.
func (ps *Problems) Add(field string, value any, format string, args ...any) {
	*ps = append(*ps, Problem(field, value, format, args...))
}

// Err returns a *postbox.ConfigError listing the problems, or nil if there
// are none.
func (ps Problems) Err() error {
	if len(ps) == 0 {
		return nil
	}
	return &postbox.ConfigError{Problems: ps}
}
